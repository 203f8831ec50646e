"""GPU and model catalogs: YAML data files loaded into frozen dataclasses.

The packaged files (``catalog/gpus.yaml``, ``catalog/models.yaml``) cite a source for
every figure. A user file with the same layout (``gpus:`` and/or ``models:``) overrides or
extends them entry by entry, field by field, so a platform team can pin its own prices.
A Hugging Face ``config.json`` yields a ``ModelSpec`` too (``hf_config``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any, Final

import yaml

from rooftop_api.manifest import StrictLoader
from rooftop_planner.errors import PlannerError

BYTES_PER_DTYPE: dict[str, float] = {
    "fp32": 4.0,
    "bf16": 2.0,
    "fp16": 2.0,
    "auto": 2.0,  # vLLM's KV "auto" stores the activation dtype (16-bit)
    "fp8": 1.0,
    "int8": 1.0,
    "int4": 0.5,
    "fp4": 0.5,
}
# The share of a GPU's peak FLOP/s that whole forward passes sustain, by compute dtype.
# Kernel tables time one kernel at a time, and their largest GEMMs run faster than a
# forward pass of them back to back does. Measured on an H100 SXM and an H200 through
# whole prefill steps of Llama-3.1-8B and of a Llama-3.1-70B TP4 shard, 1,024-8,192
# tokens, their GEMMs replayed as a CUDA graph (data/measured/gpu_prefill_steps.csv): bf16
# (cuBLAS) held 0.67-0.69 of their 989 TFLOP/s, fp8 (cuBLASLt) 0.57-0.63 of 1,979, alike on
# both; the highest is kept. Only these two Hopper GPUs were measured: every GPU is
# assumed to keep the same shares, and other dtypes are not capped.
SUSTAINED_FLOP_FRACTION: dict[str, float] = {"bf16": 0.69, "fp8": 0.63}


class CatalogError(PlannerError):
    """A catalog file or config.json is malformed; the message names the field and the fix."""


@dataclass(frozen=True)
class GpuSpec:
    """One accelerator type. SI units: bytes, bytes/s, FLOP/s, USD/hour.

    Attributes:
        id: catalog id (``h100-sxm``).
        hbm_bytes: device memory the engine can see.
        hbm_bytes_per_s: peak HBM bandwidth.
        dense_flops_per_s: dense tensor FLOP/s by compute dtype (bf16, fp8, int8, fp4).
        interconnect_bytes_per_s: GPU-to-GPU bandwidth per direction inside a node (inside
            a link group where the GPUs come in groups).
        link_group_gpus: GPUs one interconnect joins (NVLink bridges join H100 NVLs in
            pairs); 0 when it joins the whole node.
        beyond_group_bytes_per_s: per-direction bandwidth between link groups (PCIe).
        gpus_per_node: most GPUs one tensor-parallel group can use (one node).
        usd_per_gpu_hour: default on-demand price of one GPU.
        node_label_key / node_label_value: the node label that selects this GPU.
        resource_name: the extended resource pods request.
        family: the accelerator family (``cuda``, ``rocm``, ``tpu``): which vLLM build
            (container image) can drive it.
        host_arch: the CPU architecture of the nodes that carry it, as Kubernetes'
            ``kubernetes.io/arch`` label writes it (``arm64`` for Grace superchips):
            the engine image must run on it.
        name_pattern: a regular expression, searched in a lowercased name, that maps
            other spellings of it (benchmark rows, product names) to it; "" for none.
        kernel_table: the measured kernel table its kernels are timed on (one of
            ``KERNEL_TABLE_GPUS``): its own where it was measured, else the nearest
            architecture's (same memory technology and generation), scaled by the two
            GPUs' rooflines. The planner and the simulated engine both read it.
    """

    id: str
    name: str
    hbm_bytes: float
    hbm_bytes_per_s: float
    dense_flops_per_s: Mapping[str, float]
    interconnect: str
    interconnect_bytes_per_s: float
    gpus_per_node: int
    usd_per_gpu_hour: float
    node_label_value: str
    node_label_key: str = "nvidia.com/gpu.product"
    resource_name: str = "nvidia.com/gpu"
    family: str = "cuda"
    host_arch: str = "amd64"
    sources: Mapping[str, str] = field(default_factory=dict)
    link_group_gpus: int = 0
    beyond_group_bytes_per_s: float = 0.0
    name_pattern: str = ""
    kernel_table: str = field(kw_only=True)

    @property
    def kernel_table_borrowed(self) -> bool:
        """Whether its kernel table was measured on another GPU."""
        return KERNEL_TABLE_GPUS.get(self.kernel_table) != self.id

    def link_bytes_per_s(self, gpus: int) -> float:
        """Per-direction bandwidth a tensor-parallel group of ``gpus`` all-reduces over:
        the interconnect inside a link group, the slower link once the group spans more."""
        if self.link_group_gpus and gpus > self.link_group_gpus:
            return self.beyond_group_bytes_per_s
        return self.interconnect_bytes_per_s

    @property
    def node_label(self) -> str:
        """The label value alone (``nvidia.com/gpu.product`` value for NVIDIA GPUs)."""
        return self.node_label_value

    def flops_per_s(self, compute_dtype: str) -> float:
        """Dense FLOP/s for a compute dtype, falling back to bf16 where the chip lacks it."""
        return self.dense_flops_per_s.get(compute_dtype, self.dense_flops_per_s["bf16"])


# Accelerator families vLLM publishes an engine build (container image) for.
ACCELERATOR_FAMILIES = ("cuda", "rocm", "tpu")
# The measured kernel tables (data/ops) and the catalog GPU each was timed on, whose
# peaks its fractions refer to. Every catalog GPU names one (``GpuSpec.kernel_table``).
KERNEL_TABLE_GPUS: Final = {
    "a100_sxm": "a100-80gb",
    "h100_sxm": "h100-sxm",
    "h200_sxm": "h200",
    "b200_sxm": "b200",
    "l40s": "l40s",
}
# CPU architectures of GPU hosts, as the kubernetes.io/arch node label names them.
HOST_ARCHES = ("amd64", "arm64")
# Weight dtypes a model's 16-bit checkpoint serves as is (vLLM casts with --dtype) or that
# vLLM quantizes online at load (fp8); the others need a checkpoint already in that format.
BASE_CHECKPOINT_DTYPES = ("bf16", "fp16", "fp8")
QUANTIZED_DTYPES = ("fp8", "int8", "int4", "fp4")


@dataclass(frozen=True)
class Checkpoint:
    """A published checkpoint whose weights are already in one quantized format.

    Attributes:
        repo: what vLLM loads (Hugging Face repo id), e.g. an AWQ or NVFP4 repository.
        format: its quantization format as vLLM reads it from the checkpoint's own
            ``quantization_config`` (awq, gptq, compressed-tensors, fp8, modelopt_fp4).
        source: where the repository is published.
    """

    repo: str
    format: str
    source: str = ""


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer's shape (dense or mixture-of-experts).

    Beyond the Llama shape, fields named as in Hugging Face configs describe:

    - a sliding window on some layers: ``sliding_window`` tokens on ``sliding_layers`` of
      the layers (None: all of them, as Mistral v0.1; Gemma 2 slides on every other
      layer, Gemma 3 on five of six), the rest attending the whole context;
    - multi-head latent attention (DeepSeek-V2/V3/R1, ``kv_lora_rank`` > 0): each layer
      caches one latent of ``kv_lora_rank + qk_rope_head_dim`` values per token, the same
      on every tensor-parallel rank, instead of K and V per head;
    - MoE layers with experts every token runs (``shared_expert_size``: their total MLP
      width) and leading layers with a dense MLP of ``dense_intermediate_size`` instead of
      experts (``dense_layers``: DeepSeek's ``first_k_dense_replace``);
    - multi-token-prediction layers the checkpoint carries beside ``num_layers``
      (``mtp_layers``: DeepSeek-V3's ``num_nextn_predict_layers``), which vLLM can draft
      with (speculative method ``mtp``); ``param_count`` leaves them out.
    """

    id: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_context: int
    param_count: float
    hf_repo: str = ""
    num_experts: int = 1
    experts_per_token: int = 1
    sliding_window: int | None = None
    sliding_layers: int | None = None
    kv_lora_rank: int = 0
    q_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    shared_expert_size: int = 0
    dense_layers: int = 0
    dense_intermediate_size: int = 0
    mtp_layers: int = 0
    aliases: tuple[str, ...] = ()
    # weight dtype -> published checkpoint in that format (int4, int8, fp4, fp8)
    checkpoints: Mapping[str, Checkpoint] = field(default_factory=dict)

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 1

    @property
    def is_mla(self) -> bool:
        """Multi-head latent attention: a compressed KV latent, not K and V per head."""
        return self.kv_lora_rank > 0

    @property
    def moe_layers(self) -> int:
        """Layers whose MLP is the experts (all but the leading dense ones)."""
        return self.num_layers - self.dense_layers if self.is_moe else 0

    @property
    def window_layers(self) -> int:
        """Layers that cache only the last ``sliding_window`` tokens."""
        if not self.sliding_window:
            return 0
        return self.num_layers if self.sliding_layers is None else self.sliding_layers

    @property
    def expert_param_count(self) -> float:
        """Parameters in one expert's MLP across the MoE layers: 3 · hidden · intermediate ·
        L_moe."""
        return 3.0 * self.hidden_size * self.intermediate_size * self.moe_layers

    def kv_elements_per_token_layer(self, tp: int) -> float:
        """Values one layer caches per token on one of ``tp`` GPUs.

        Ordinary attention: K and V of each KV head, 2 · max(kv_heads / tp, 1) · head_dim
        (heads split over TP, replicated where TP exceeds them). MLA: one latent of
        kv_lora_rank + qk_rope_head_dim, whole on every rank (vLLM does not split it).
        """
        if self.is_mla:
            return float(self.kv_lora_rank + self.qk_rope_head_dim)
        return 2.0 * max(self.num_kv_heads / tp, 1.0) * self.head_dim

    @property
    def active_param_count(self) -> float:
        """Parameters one token touches: all shared weights plus its top-k experts."""
        if not self.is_moe:
            return self.param_count
        unused = (self.num_experts - self.experts_per_token) * self.expert_param_count
        return self.param_count - unused


@dataclass(frozen=True)
class Catalog:
    gpus: Mapping[str, GpuSpec]
    models: Mapping[str, ModelSpec]

    def gpu(self, name: str) -> GpuSpec:
        """Look up a GPU by id or common spelling (``H100 80GB HBM3`` -> ``h100-sxm``)."""
        gpu_id = normalize_gpu_name(name, self.gpus)
        if gpu_id is None:
            raise CatalogError(
                f"unknown GPU {name!r}; known GPU ids: {', '.join(sorted(self.gpus))}"
            )
        return self.gpus[gpu_id]

    def model(self, name: str) -> ModelSpec:
        """Look up a model by id, Hugging Face repo id or alias, case-insensitively."""
        model_id = normalize_model_name(name, self.models)
        if model_id is None:
            raise CatalogError(
                f"unknown model {name!r}; use a catalog id ({', '.join(sorted(self.models))}), "
                "or describe the model by its Hugging Face config.json (its fields under "
                "spec.modelConfig in a ServingTarget; the file with rooftop predict "
                "--model-config config.json), or add it under models: in a catalog file "
                "(--catalog FILE.yaml for rooftop plan, predict and render)"
            )
        return self.models[model_id]


# ---------------------------------------------------------------- name matching

_MODEL_SUFFIXES = re.compile(
    r"(-(instruct|chat|hf|fp8|fp8-dynamic|fp8-static|fp8-block|fp4|nvfp4|mxfp4|awq|gptq"
    r"|int4|int8|w4a16|w8a8|w4a4|quantized\.w\d+a\d+|base|it))+$"
)
_VERSION_SUFFIX = re.compile(r"-v0\.\d+$")


# Llama's family name as model pages and NIM ids write it without the dash:
# "llama3.1-8b-instruct", "Llama3-70B" (Qwen's own ids keep "qwen3", as the catalog does).
_LLAMA_VERSION = re.compile(r"^llama(\d)")


def _model_key(name: str) -> str:
    """The catalog's spelling of a model name: the repo's last part, lower case, words
    joined by dashes (``Llama 3.1 8B Instruct``, ``meta/llama3-70b-instruct``), without
    the organisation prefix and the instruct, quantization and version suffixes."""
    key = name.strip().lower().rsplit("/", 1)[-1]
    key = re.sub(r"[\s_]+", "-", key)
    key = key.removeprefix("meta-")
    key = _LLAMA_VERSION.sub(r"llama-\1", key)
    previous = None
    while previous != key:
        previous = key
        key = _MODEL_SUFFIXES.sub("", key)
        key = _VERSION_SUFFIX.sub("", key)
    return key


def normalize_model_name(name: str, models: Mapping[str, ModelSpec]) -> str | None:
    """Map a model name to a catalog id, or None.

    ``meta-llama/Llama-3.1-8B-Instruct``, ``Meta-Llama-3-8B``, ``Llama-2-7b-hf``,
    ``...-Instruct-FP8`` all reduce to the base id.
    """
    wanted = {name.strip().lower(), _model_key(name)}
    for model in models.values():
        names = {model.id, model.hf_repo.lower(), _model_key(model.hf_repo), *model.aliases}
        if wanted & {n.lower() for n in names if n}:
            return model.id
    return None


def _pattern(where: str, value: object) -> str:
    """A ``name_pattern``: a regular expression Python compiles."""
    if not isinstance(value, str):
        raise CatalogError(f"{where}: give a regular expression as a string")
    try:
        re.compile(value)
    except re.error as err:
        raise CatalogError(f"{where}: {value!r} is not a regular expression ({err})") from None
    return value


def normalize_gpu_name(name: str, gpus: Mapping[str, GpuSpec]) -> str | None:
    """Map a GPU name as benchmarks or node labels spell it to a catalog id, or None."""
    key = name.strip().lower()
    if key in gpus:
        return key
    for gpu in gpus.values():
        if key == gpu.node_label_value.lower() or key == gpu.name.lower():
            return gpu.id
    for gpu in gpus.values():
        if gpu.name_pattern and re.search(gpu.name_pattern, key):
            return gpu.id
    return None


# ---------------------------------------------------------------- loading

_MODEL_REQUIRED = ("num_layers", "hidden_size", "num_heads", "intermediate_size", "vocab_size")
# Shape counts the model math multiplies and divides by: whole numbers >= 1 when given.
_MODEL_COUNTS = ("num_kv_heads", "head_dim", "max_context", "num_experts", "experts_per_token")
# Sizes of the parts beyond the Llama shape (ModelSpec's docstring): 0 is "none".
_MODEL_EXTRAS = (
    "sliding_layers",
    "kv_lora_rank",
    "q_lora_rank",
    "qk_nope_head_dim",
    "qk_rope_head_dim",
    "v_head_dim",
    "shared_expert_size",
    "dense_layers",
    "dense_intermediate_size",
    "mtp_layers",
)
# What MLA needs besides kv_lora_rank to be priced (q_lora_rank 0: queries uncompressed).
_MLA_WIDTHS = ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
_GPU_SIZES = ("hbm_bytes", "hbm_bytes_per_s", "interconnect_bytes_per_s")
_DEFAULT_GPUS_PER_NODE = 8
# YAML 1.1 (PyYAML) reads a float only with a '.' and a signed exponent: 8e10 stays text.
_EXPONENT_FORM = re.compile(r"([+-]?)(\d+)(?:\.(\d*))?[eE]([+-]?)(\d+)")


def _check_fields(kind: str, entry_id: str, entry: Mapping[str, Any], cls: type) -> None:
    known = {f.name for f in fields(cls)}
    for key in entry:
        if key not in known:
            raise CatalogError(
                f"{kind}.{entry_id}.{key}: unknown field; known fields: {', '.join(sorted(known))}"
            )


def _text_number_hint(value: Any) -> str:
    """Why a number-looking string arrived as text, and how to write it as a number."""
    if not isinstance(value, str):
        return ""
    text = value.strip()
    match = _EXPONENT_FORM.fullmatch(text)
    if match:
        sign, whole, fraction, exp_sign, exponent = match.groups()
        fixed = f"{sign}{whole}.{fraction or '0'}e{exp_sign or '+'}{exponent}"
        return f"; YAML reads {text} as text, write it as {fixed} (with '.' and an exponent sign)"
    try:
        number = float(text)
    except ValueError:
        return ""
    return "; it is quoted text, remove the quotes" if math.isfinite(number) else ""


def _finite(path: str, value: Any, wanted: str) -> float:
    """``value`` as a float, or a CatalogError naming ``path`` (bool is no number here)."""
    if value is None:
        raise CatalogError(f"{path}: missing; give {wanted}")
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise CatalogError(f"{path}: must be {wanted}, got {value!r}{_text_number_hint(value)}")
    try:
        number = float(value)
    except OverflowError:  # an int beyond float range
        number = math.inf
    if not math.isfinite(number):
        raise CatalogError(
            f"{path}: must be {wanted}, got {value!r} (NaN and infinity are not allowed)"
        )
    return number


def _positive(path: str, value: Any) -> float:
    number = _finite(path, value, "a positive number")
    if number <= 0:
        raise CatalogError(f"{path}: must be a positive number, got {value!r}")
    return number


def _count(path: str, value: object, least: int = 1) -> int:
    """A whole number >= ``least`` (1: a count; 0: a size whose 0 means none); ``32.0``
    is accepted as 32."""
    number = _finite(path, value, f"a whole number >= {least}")
    if number < least or not number.is_integer():
        raise CatalogError(f"{path}: must be a whole number >= {least}, got {value!r}")
    return value if isinstance(value, int) else int(number)


def _price(path: str, value: Any) -> float:
    number = _finite(path, value, "a price in USD per GPU-hour (a number >= 0)")
    if number < 0:
        raise CatalogError(f"{path}: must be a number >= 0, got {value!r}")
    return number


# Tensor-core dtypes the planner looks up (perf.EngineShape.compute_dtype); fp16 and tf32
# are accepted as data even though matmuls are priced at bf16.
COMPUTE_DTYPES = ("bf16", "fp16", "fp8", "int8", "fp4", "tf32")


def _flops(path: str, value: Any) -> dict[str, float]:
    if not isinstance(value, Mapping) or "bf16" not in value:
        raise CatalogError(f"{path}: needs at least a bf16 figure, e.g. {{bf16: 1.0e+14}}")
    unknown = sorted(str(d) for d in value if d not in COMPUTE_DTYPES)
    if unknown:  # a misspelt fp8 would silently price fp8 matmuls at bf16
        raise CatalogError(
            f"{path}: unknown dtype(s) {', '.join(unknown)}; use {', '.join(COMPUTE_DTYPES)}"
        )
    return {str(dtype): _positive(f"{path}.{dtype}", v) for dtype, v in value.items()}


# A GPU id names a mixed fleet's pool Deployment (``NAME-engine-GPU``) and its pods'
# ``rooftop.dev/pool`` label: a DNS-1123 label, short enough for both.
GPU_ID = re.compile(r"[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?")


def _dns_label(text: str) -> str:
    """``text`` as the nearest GPU id: lowercase, other characters as '-'."""
    label = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:40].strip("-")
    return label or "my-gpu"


def _gpu_from_entry(gpu_id: str, entry: Mapping[str, Any]) -> GpuSpec:
    if not GPU_ID.fullmatch(str(gpu_id)):
        raise CatalogError(
            f"gpus.{gpu_id}: a GPU id is lowercase letters, digits and '-' (at most 40, "
            "starting and ending with a letter or digit), since it names Kubernetes "
            f"objects; rename it (e.g. {_dns_label(str(gpu_id))!r})"
        )
    _check_fields("gpus", gpu_id, entry, GpuSpec)
    at = f"gpus.{gpu_id}."
    values = {**entry, "id": gpu_id}
    for key in _GPU_SIZES:
        values[key] = _positive(at + key, entry.get(key))
    values["dense_flops_per_s"] = _flops(at + "dense_flops_per_s", entry.get("dense_flops_per_s"))
    values["usd_per_gpu_hour"] = _price(at + "usd_per_gpu_hour", entry.get("usd_per_gpu_hour"))
    per_node = entry.get("gpus_per_node", _DEFAULT_GPUS_PER_NODE)
    values["gpus_per_node"] = _count(at + "gpus_per_node", per_node)
    values.update(_link_group(at, entry))
    values.setdefault("name", gpu_id)
    values.setdefault("interconnect", "unknown")
    values.setdefault("node_label_value", gpu_id)
    family = values.setdefault("family", "cuda")
    if family not in ACCELERATOR_FAMILIES:
        raise CatalogError(
            f"{at}family: unknown accelerator family {family!r}; use one of "
            f"{', '.join(ACCELERATOR_FAMILIES)}"
        )
    arch = values.setdefault("host_arch", "amd64")
    if arch not in HOST_ARCHES:
        raise CatalogError(
            f"{at}host_arch: unknown architecture {arch!r}; use one of {', '.join(HOST_ARCHES)}"
        )
    values["kernel_table"] = _kernel_table(at + "kernel_table", entry.get("kernel_table"))
    values["name_pattern"] = _pattern(at + "name_pattern", entry.get("name_pattern", ""))
    return GpuSpec(**values)


def _kernel_table(path: str, value: Any) -> str:
    """A measured kernel table's name; a GPU without one would have no timing at all."""
    tables = ", ".join(KERNEL_TABLE_GPUS)
    if value is None:
        raise CatalogError(
            f"{path}: missing; name the measured kernel table of the nearest architecture "
            f"(same memory technology and generation), one of {tables}"
        )
    if value not in KERNEL_TABLE_GPUS:
        raise CatalogError(f"{path}: unknown kernel table {value!r}; use one of {tables}")
    return str(value)


def _link_group(at: str, entry: Mapping[str, Any]) -> dict[str, Any]:
    """``link_group_gpus`` and ``beyond_group_bytes_per_s``: both or neither."""
    group, beyond = entry.get("link_group_gpus"), entry.get("beyond_group_bytes_per_s")
    if group is None and beyond is None:
        return {}
    if group is None or beyond is None:
        missing = "beyond_group_bytes_per_s" if beyond is None else "link_group_gpus"
        raise CatalogError(
            f"{at}{missing}: missing; link_group_gpus (GPUs one interconnect joins) and "
            "beyond_group_bytes_per_s (the link between groups, e.g. PCIe) go together"
        )
    return {
        "link_group_gpus": _count(at + "link_group_gpus", group),
        "beyond_group_bytes_per_s": _positive(at + "beyond_group_bytes_per_s", beyond),
    }


def _model_numbers(entry: Mapping[str, Any], at: Callable[[str], str]) -> dict[str, Any]:
    """Checked copy of a model entry: required counts, optional counts, param_count."""
    values = dict(entry)
    for key in _MODEL_REQUIRED:
        values[key] = _count(at(key), entry.get(key))
    for key in (*_MODEL_COUNTS, "sliding_window"):
        if values.get(key) is None:
            values.pop(key, None)  # absent or null: the default applies
        else:
            values[key] = _count(at(key), values[key])
    for key in _MODEL_EXTRAS:
        if values.get(key) is None:
            values.pop(key, None)
        else:
            values[key] = _count(at(key), values[key], least=0)
    if values.get("param_count") is not None:
        values["param_count"] = _positive(at("param_count"), values["param_count"])
    return values


def _check_model_shape(model: ModelSpec, at: Callable[[str], str]) -> None:
    """Relations between fields that the per-field checks cannot see."""
    if model.num_heads % model.num_kv_heads:
        raise CatalogError(
            f"{at('num_kv_heads')}: must divide {at('num_heads')} ({model.num_heads}) "
            f"evenly, got {model.num_kv_heads}"
        )
    if model.experts_per_token > model.num_experts:
        raise CatalogError(
            f"{at('experts_per_token')}: must be at most {at('num_experts')} "
            f"({model.num_experts}), got {model.experts_per_token}"
        )
    _check_layer_counts(model, at)


def _check_mla_widths(values: Mapping[str, Any], at: Callable[[str], str]) -> None:
    """MLA (kv_lora_rank > 0) is priced from its head widths: all three or no MLA."""
    if not values.get("kv_lora_rank"):
        return
    missing = [at(key) for key in _MLA_WIDTHS if not values.get(key)]
    if missing:
        raise CatalogError(
            f"{', '.join(missing)}: missing; multi-head latent attention "
            f"({at('kv_lora_rank')} > 0) needs the query, rotary and value head widths"
        )


def _check_layer_counts(model: ModelSpec, at: Callable[[str], str]) -> None:
    """Layer subsets no larger than the model, and dense layers only beside experts."""
    if model.sliding_layers is not None and model.sliding_layers > model.num_layers:
        raise CatalogError(
            f"{at('sliding_layers')}: must be at most {at('num_layers')} "
            f"({model.num_layers}), got {model.sliding_layers}"
        )
    if model.dense_layers and not (model.is_moe and model.dense_layers < model.num_layers):
        raise CatalogError(
            f"{at('dense_layers')}: only a mixture-of-experts model has dense layers beside "
            f"its expert layers, fewer than {at('num_layers')} ({model.num_layers}); "
            f"got {model.dense_layers}"
        )
    if model.dense_layers and not model.dense_intermediate_size:
        raise CatalogError(
            f"{at('dense_intermediate_size')}: missing; give the MLP width of the "
            f"{model.dense_layers} dense layers"
        )


def _model_from_entry(
    model_id: str,
    entry: Mapping[str, Any],
    at: Callable[[str], str] | None = None,
    tied_embeddings: bool = False,
) -> ModelSpec:
    """Build a ModelSpec; ``at`` maps a field to the path the user wrote it under."""
    _check_fields("models", model_id, entry, ModelSpec)
    at = at or (lambda key: f"models.{model_id}.{key}")
    values = _model_numbers(entry, at)
    values["id"] = model_id
    values.setdefault("num_kv_heads", values["num_heads"])
    if "head_dim" not in values:
        values["head_dim"] = values["hidden_size"] // values["num_heads"]
        if values["head_dim"] < 1:
            raise CatalogError(
                f"{at('head_dim')}: missing, and {at('hidden_size')} is smaller than "
                f"{at('num_heads')}; give head_dim"
            )
    values.setdefault("max_context", 4096)
    values["aliases"] = tuple(str(a).lower() for a in values.get("aliases", ()))
    values["checkpoints"] = _checkpoints(at("checkpoints"), values.get("checkpoints"))
    _check_mla_widths(values, at)
    if "param_count" not in values:
        tied = {"tie_word_embeddings": tied_embeddings}
        values["param_count"] = estimate_param_count({**values, **tied})
    values["param_count"] = float(values["param_count"])
    model = ModelSpec(**values)
    _check_model_shape(model, at)
    return model


def _checkpoints(path: str, value: Any) -> dict[str, Checkpoint]:
    """``{int4: {repo, format, source}}``: each key a quantized weight dtype."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise CatalogError(f"{path}: expected a mapping of weight dtype -> {{repo, format}}")
    out: dict[str, Checkpoint] = {}
    for dtype, entry in value.items():
        at = f"{path}.{dtype}"
        if dtype not in QUANTIZED_DTYPES:
            raise CatalogError(
                f"{at}: not a quantized weight dtype; use one of {', '.join(QUANTIZED_DTYPES)} "
                "(16-bit weights come from hf_repo)"
            )
        if not isinstance(entry, Mapping) or not entry.get("repo") or not entry.get("format"):
            raise CatalogError(f"{at}: needs repo (the checkpoint's repo id) and format")
        unknown = sorted(set(entry) - {"repo", "format", "source"})
        if unknown:
            raise CatalogError(
                f"{at}: unknown field(s) {', '.join(unknown)}; use repo, format, source"
            )
        out[str(dtype)] = Checkpoint(
            str(entry["repo"]), str(entry["format"]), str(entry.get("source", ""))
        )
    return out


def estimate_param_count(cfg: Mapping[str, Any]) -> float:
    """Parameters of a decoder from its shape (the catalog's field names).

    attention per layer: hidden · head_dim · (2·heads + 2·kv_heads) (q, o, k, v), or
    for MLA ``_mla_params``; MLP per layer: 3 · hidden · width (gate, up, down), the
    width being E · intermediate + shared_expert_size in expert layers and
    dense_intermediate_size in the leading dense ones; embeddings: vocab · hidden,
    twice unless tied. Routers and norms (< 0.1 %) are left out.
    """
    hidden, layers = cfg["hidden_size"], cfg["num_layers"]
    heads = cfg["num_heads"]
    kv_heads = cfg.get("num_kv_heads", heads)
    head_dim = cfg.get("head_dim") or hidden // heads
    attention = (
        _mla_params(cfg)
        if cfg.get("kv_lora_rank")
        else hidden * head_dim * (2 * heads + 2 * kv_heads)
    )
    dense = cfg.get("dense_layers", 0)
    experts = cfg["intermediate_size"] * cfg.get("num_experts", 1)
    moe_width = experts + cfg.get("shared_expert_size", 0)
    mlp = (
        3 * hidden * (moe_width * (layers - dense) + cfg.get("dense_intermediate_size", 0) * dense)
    )
    embeddings = cfg["vocab_size"] * hidden * (1 if cfg.get("tie_word_embeddings") else 2)
    return float(layers * attention + mlp + embeddings)


def _mla_params(cfg: Mapping[str, Any]) -> int:
    """One MLA layer's projections (DeepSeek-V2's names): queries through a rank-q_lora
    bottleneck, hidden · q_lora + q_lora · heads · (nope + rope), or hidden · heads ·
    (nope + rope) without one; the KV latent and rotary key, hidden · (kv_lora + rope);
    its expansion to keys and values, kv_lora · heads · (nope + v); the output,
    heads · v · hidden."""
    hidden, heads = cfg["hidden_size"], cfg["num_heads"]
    nope, rope, v = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    q_lora, kv_lora = cfg.get("q_lora_rank", 0), cfg["kv_lora_rank"]
    query = heads * (nope + rope)
    q = hidden * q_lora + q_lora * query if q_lora else hidden * query
    return int(q + hidden * (kv_lora + rope) + kv_lora * heads * (nope + v) + heads * v * hidden)


def _read_yaml(text: str, where: str) -> dict[str, Any]:
    try:
        data = yaml.load(text, Loader=StrictLoader)  # a key given twice is an error
    except yaml.YAMLError as err:
        raise CatalogError(f"{where}: not valid YAML ({err})") from err
    if not isinstance(data, dict):
        raise CatalogError(f"{where}: expected a mapping with 'gpus:' and/or 'models:'")
    return data


def _merge(base: dict[str, Any], override: Mapping[str, Any], section: str) -> None:
    entries = override.get(section) or {}
    if not isinstance(entries, Mapping):
        raise CatalogError(f"{section}: expected a mapping of id -> fields")
    for entry_id, entry in entries.items():
        if not isinstance(entry, Mapping):
            raise CatalogError(f"{section}.{entry_id}: expected a mapping of fields")
        merged = dict(base.get(str(entry_id).lower(), {}))
        merged.update(entry)
        base[str(entry_id).lower()] = merged


def _packaged(name: str) -> dict[str, Any]:
    text = resources.files("rooftop_planner").joinpath("catalog", name).read_text()
    return _read_yaml(text, f"packaged catalog/{name}")


def _read_catalog_file(path: Path) -> str:
    if path.is_dir():
        raise CatalogError(
            f"catalog file {path}: is a directory; give a YAML file with gpus: and/or models:"
        )
    if not path.is_file():
        raise CatalogError(f"catalog file {path}: not found")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise CatalogError(f"catalog file {path}: not UTF-8 text ({err.reason})") from err


@lru_cache(maxsize=8)
def simulated_model_problem(model: str) -> str | None:
    """Why ``rooftop engine-sim`` cannot serve ``model`` (None: it can): it times the
    packaged catalog's models by their kernel tables, and a model known only from a
    spec.modelConfig has none."""
    catalog = load_catalog()
    try:
        catalog.model(model)
    except CatalogError:
        known = ", ".join(sorted(catalog.models))
        return (
            f"the simulated engine serves the catalog's models only ({known}), not "
            f"{model!r}; plan it with mode: vllm, or simulate a catalog model of its size"
        )
    return None


def load_catalog(user_file: str | None = None) -> Catalog:
    """Load the packaged catalogs, overlaid with ``user_file`` (YAML) if given."""
    gpus: dict[str, Any] = {}
    models: dict[str, Any] = {}
    _merge(gpus, _packaged("gpus.yaml"), "gpus")
    _merge(models, _packaged("models.yaml"), "models")
    if user_file:
        path = Path(user_file)
        override = _read_yaml(_read_catalog_file(path), f"catalog file {user_file}")
        unknown = set(override) - {"gpus", "models"}
        if unknown:
            raise CatalogError(f"catalog file {user_file}: unknown sections {sorted(unknown)}")
        _merge(gpus, override, "gpus")
        _merge(models, override, "models")
    return Catalog(
        gpus={k: _gpu_from_entry(k, v) for k, v in gpus.items()},
        models={k: _model_from_entry(k, v) for k, v in models.items()},
    )
