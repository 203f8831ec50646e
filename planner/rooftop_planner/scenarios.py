"""Benchmark scenarios: one row of a measurement or prediction CSV, normalised.

Both ``rooftop predict --csv`` and the calibration fit read rows shaped like
data/measured/calibration.csv: ``model,gpu,tp,weight_dtype,kv_dtype,isl,osl,
concurrency,batch[,rate][,engine][,num_prompts,lengths]``. A concurrency row is a
closed-loop benchmark whose clients start together (``closed_loop``), a rate row an
open-loop one of Poisson arrivals (``open_loop``), a batch row one static batch.
Sources spell GPUs, dtypes and engines many ways ("H100 80GB HBM3", "fp16 (source:
Mixed)", "TensorRT-LLM 0.9.0 (static batch)"); this module maps them to catalog ids and
says precisely what it could not understand.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rooftop_planner.batching import EngineLimits, Prediction, predict_static
from rooftop_planner.catalog import BYTES_PER_DTYPE, Catalog, CatalogError, GpuSpec
from rooftop_planner.closed_loop import DEFAULT_NUM_PROMPTS, predict_closed_loop
from rooftop_planner.efficiency import EfficiencyTable
from rooftop_planner.errors import PlannerError
from rooftop_planner.open_loop import predict_open_loop
from rooftop_planner.perf import GIB, EngineShape


class ScenarioError(PlannerError):
    """A row cannot be predicted; the message names the column and the fix."""


@dataclass(frozen=True)
class Scenario:
    deployment: EngineShape
    engine: str
    isl: int
    osl: int
    concurrency: int | None
    batch: int | None
    num_prompts: int = DEFAULT_NUM_PROMPTS
    fixed_lengths: bool = True
    rate: float | None = None

    def predict(self, check_context: bool = True) -> Prediction:
        """The scenario's prediction; one that does not fit says why (``fits``, ``reason``).

        ``check_context``: a request longer than the model's context does not fit (vLLM
        refuses it). The calibration fit turns it off: its rows were measured, some past
        ``max_position_embeddings`` (Llama-2 at 4096 + 128 tokens).
        """
        if check_context and (beyond := self._beyond_context()):
            return Prediction(math.inf, math.inf, 0.0, 0.0, fits=False, reason=beyond)
        if self.batch is not None:
            return predict_static(self.deployment, self.batch, self.isl, self.osl)
        if self.rate is not None:
            limits = default_limits(self.engine, self.deployment.gpu, 0)
            return predict_open_loop(self.deployment, self.rate, self.isl, self.osl, limits)
        assert self.concurrency is not None
        limits = default_limits(self.engine, self.deployment.gpu, self.concurrency)
        return predict_closed_loop(
            self.deployment,
            self.concurrency,
            self.isl,
            self.osl,
            limits,
            self.num_prompts,
            self.fixed_lengths,
        )

    def _beyond_context(self) -> str:
        """Why no engine runs a request this long on this model (its context), else ""."""
        model, tokens = self.deployment.model, self.isl + self.osl
        if tokens <= model.max_context:
            return ""
        return (
            f"isl {self.isl:,} + osl {self.osl:,} = {tokens:,} tokens exceed {model.id}'s "
            f"{model.max_context:,}-token context (max_position_embeddings); engines refuse "
            "such requests, so nothing is predicted"
        )


def default_limits(engine: str, gpu: GpuSpec, concurrency: int) -> EngineLimits:
    """The scheduler caps a benchmark of ``engine`` ran with when it set none.

    vLLM's API server picks them by GPU (``EngineArgs.get_batch_defaults``, vLLM 0.8 on):
    from 160 GiB of GPU memory 1,024 sequences and 16,384 tokens per step; from 70 GiB,
    A100s excepted, 1,024 and 8,192; below, 256 and 2,048. So 512 clients on an A100 run
    256 at a time and the rest queue. Other engines: the clients run as far as the KV
    cache holds them, with 8,192 tokens per step. TensorRT-LLM (and NIM, which runs it)
    gives the KV cache 90 % of the memory the loaded model leaves
    (``free_gpu_memory_fraction``) and admits a request only when its prompt and whole
    answer fit (``GUARANTEED_NO_EVICT``, its default capacity policy). SGLang runs a
    waiting prompt as a prefill batch of its own before the next decode step
    (``enable_mixed_chunk`` is off by default), in chunks of 2,048 tokens under 35 GiB
    of GPU memory, 8,192 under 160 GiB, else 16,384 (``ServerArgs``'
    ``chunked_prefill_size`` defaults). vLLM admits a prompt whenever it fits now and
    evicts the newest sequence when the cache runs out (no watermark by default):
    ``preempts_when_full``. SGLang reserves room for the answers it admits (its
    ``new_token_ratio``), so it is not modelled as evicting.
    """
    every_client = max(concurrency, 256)  # no cap of their own below the KV cache's
    if engine == "sglang":
        return EngineLimits(
            max_num_seqs=every_client,
            mixed_prefill=False,
            max_num_batched_tokens=sglang_chunk_tokens(gpu),
        )
    if engine in ("trtllm", "nim"):
        return EngineLimits(
            max_num_seqs=every_client, free_memory_fraction=0.9, reserve_whole_request=True
        )
    if engine != "vllm":
        return EngineLimits(max_num_seqs=every_client)
    memory_gib = gpu.hbm_bytes / GIB
    if memory_gib >= 160:
        seqs, tokens = 1024, 16384
    elif memory_gib >= 70 and not gpu.id.startswith("a100"):
        seqs, tokens = 1024, 8192
    else:
        seqs, tokens = 256, 2048
    return EngineLimits(max_num_seqs=seqs, max_num_batched_tokens=tokens, preempts_when_full=True)


def sglang_chunk_tokens(gpu: GpuSpec) -> int:
    """SGLang's default ``chunked_prefill_size`` for a GPU of this memory, tokens."""
    memory_gib = gpu.hbm_bytes / GIB
    if memory_gib < 35:
        return 2048
    return 8192 if memory_gib < 160 else 16384


_DTYPE_WORDS = (
    ("fp8", "fp8"),
    ("float8", "fp8"),
    ("e4m3", "fp8"),
    ("nvfp4", "fp4"),
    ("mxfp4", "fp4"),
    ("fp4", "fp4"),
    ("awq", "int4"),
    ("gptq", "int4"),
    ("int4", "int4"),
    ("w4a16", "int4"),
    ("int8", "int8"),
    ("w8a8", "int8"),
    ("bf16", "bf16"),
    ("bfloat16", "bf16"),
    ("fp16", "fp16"),
    ("float16", "fp16"),
    ("half", "fp16"),
)


# A dtype column that says nothing: the engine's own choice.
_UNSTATED = ("", "auto", "not stated", "default")
# Checkpoint suffixes that name a weight format (``nvidia/Llama-3.3-70B-Instruct-FP8``,
# ``...-quantized.w4a16``), checked before the generic words of ``_DTYPE_WORDS``.
_CHECKPOINT_WORDS = (("w4a4", "fp4"), *_DTYPE_WORDS)


def normalize_dtype(value: str, column: str, kv: bool = False, model_name: str = "") -> str:
    """Map a dtype as sources write it to a catalog dtype. An unstated KV dtype is
    ``auto``; an unstated weight dtype is the one ``model_name``'s checkpoint suffix
    names (``-FP8``, ``-AWQ``, ``-NVFP4``), else bf16, as an engine loads it."""
    text = value.strip().lower()
    if kv and (text in _UNSTATED or "presumed" in text):
        return "auto"
    if not kv and text in _UNSTATED:
        return checkpoint_dtype(model_name) or "bf16"
    for word, dtype in _DTYPE_WORDS:
        if word in text:
            return dtype
    if kv and text in BYTES_PER_DTYPE:
        return text
    allowed = "auto, fp8, bf16, fp16, int8" if kv else "bf16, fp16, fp8, int8, int4, fp4"
    raise ScenarioError(f"{column}: unknown dtype {value!r}; use one of {allowed}")


def checkpoint_dtype(model_name: str) -> str | None:
    """The weight dtype a checkpoint's name states (``Llama-3.1-8B-Instruct-FP8``: fp8),
    or None. Only the part after the organisation is read, word by word, so a size or a
    version is never taken for a format."""
    words = re.split(r"[-_.\s]+", model_name.strip().lower().rsplit("/", 1)[-1])
    return next((dtype for word, dtype in _CHECKPOINT_WORDS if word in words), None)


def normalize_engine(value: str) -> str:
    """``vllm`` (default), ``sglang``, ``trtllm`` or ``nim`` from free text."""
    text = value.strip().lower()
    if not text or "vllm" in text:
        return "vllm"
    if "sglang" in text:
        return "sglang"
    if re.search(r"\bnim\b", text):  # "NIM", "nvidia-nim", "NIM for LLMs 1.8"
        return "nim"
    if "tensorrt" in text or "trt" in text:
        return "trtllm"
    raise ScenarioError(f"engine: unknown engine {value!r}; use vllm, sglang, trtllm or nim")


def _int(row: Mapping[str, str], column: str, required: bool = True) -> int | None:
    raw = (row.get(column) or "").strip()
    if not raw:
        if required:
            raise ScenarioError(f"{column}: missing; give a positive integer")
        return None
    try:
        value = float(raw)
    except ValueError as err:
        raise ScenarioError(f"{column}: {raw!r} is not a number") from err
    if not math.isfinite(value) or value < 1 or value != int(value):
        raise ScenarioError(f"{column}: {raw!r} must be a positive integer")
    return int(value)


def scenario_from_row(
    row: Mapping[str, str], catalog: Catalog, efficiency: EfficiencyTable
) -> Scenario:
    """Parse one CSV row. Raises ScenarioError naming the bad column."""
    try:
        model = catalog.model(row.get("model") or "")
        gpu = catalog.gpu(row.get("gpu") or "")
    except CatalogError as err:
        raise ScenarioError(str(err)) from err
    tp = _int(row, "tp") or 1
    if model.num_heads % tp:
        raise ScenarioError(f"tp: {tp} does not divide {model.id}'s {model.num_heads} heads")
    if tp > gpu.gpus_per_node:
        # one engine pod holds the whole tensor-parallel group, and a pod runs on one node
        raise ScenarioError(
            f"tp: {tp} exceeds the {gpu.gpus_per_node} {gpu.id} GPUs one node holds "
            f"(gpus_per_node in the GPU catalog); use tp <= {gpu.gpus_per_node}"
        )
    engine = normalize_engine(row.get("engine") or "")
    dep = EngineShape(
        model=model,
        gpu=gpu,
        tp=tp,
        weight_dtype=normalize_dtype(
            row.get("weight_dtype") or "", "weight_dtype", model_name=row.get("model") or ""
        ),
        kv_dtype=normalize_dtype(row.get("kv_dtype") or "", "kv_dtype", kv=True),
        efficiency=efficiency.lookup(gpu, engine),
    )
    concurrency, batch = _int(row, "concurrency", False), _int(row, "batch", False)
    rate = _rate(row)
    if sum(v is not None for v in (concurrency, batch, rate)) != 1:
        raise ScenarioError(
            "concurrency/batch/rate: set exactly one of the three (flags --concurrency, "
            "--batch or --request-rate; in a CSV, one of the columns concurrency, batch and "
            "rate per row)"
        )
    isl, osl = _int(row, "isl"), _int(row, "osl")
    assert isl is not None and osl is not None
    return Scenario(
        deployment=dep,
        engine=engine,
        isl=isl,
        osl=osl,
        concurrency=concurrency,
        batch=batch,
        rate=rate,
        **_closed_loop_run(row, "batch" if batch else "rate" if rate else ""),
    )


def _rate(row: Mapping[str, str]) -> float | None:
    """The ``rate`` column: requests per second sent at random (Poisson), or None."""
    raw = (row.get("rate") or "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError as err:
        raise ScenarioError(f"rate: {raw!r} is not a number of requests per second") from err
    if not math.isfinite(value) or value <= 0:
        raise ScenarioError(f"rate: {raw!r} must be a positive number of requests per second")
    return value


LENGTHS = ("fixed", "varied")


def _closed_loop_run(row: Mapping[str, str], other: str) -> dict[str, Any]:
    """A concurrency row's run: ``num_prompts`` requests (default vllm bench serve's
    1,000) and its answers' ``lengths``, fixed (the default: every answer osl tokens) or
    varied; a static batch or an open-loop rate (``other``) has neither."""
    given = [c for c in ("num_prompts", "lengths") if row.get(c)]
    if other and given:
        raise ScenarioError(
            f"{given[0]}: describes a closed-loop run of clients; a {other} row has none, "
            "so leave it empty or give concurrency"
        )
    lengths = (row.get("lengths") or "fixed").strip().lower()
    if lengths not in LENGTHS:
        raise ScenarioError(f"lengths: {row.get('lengths')!r}; use fixed or varied")
    prompts = _int(row, "num_prompts", False) or DEFAULT_NUM_PROMPTS
    return {"num_prompts": prompts, "fixed_lengths": lengths == "fixed"}
