"""The simulated engine's /metrics against the real vLLM's, family by family.

Every closed-loop test trusts ``rooftop engine-sim`` to export what vLLM exports; this
module keeps that true. It serves the tiny model with the real vLLM (CPU build) and runs
the simulator with the same served name and context length, sends both the same few
requests (so histograms have samples), and compares every metric family Rooftop reads
(the ``vllm:`` names in the metrics client, the dashboard queries and the simulator):
type, help text, label names, histogram bucket bounds, and the pre-created
``finished_reason`` values. The real engine is the source of truth.
"""

from __future__ import annotations

import asyncio
import re
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from rooftop_planner import perf
from rooftop_planner.hf_config import model_from_hf_config
from rooftop_sim.loadgen import LoadSpec, send_request
from tests.cluster.controlplane import free_port
from tests.cluster.vllm_engines import SOURCE_PATH, VllmProcess, local_engine

pytestmark = pytest.mark.vllm

ROOT = Path(__file__).resolve().parents[2]
READERS = (
    "operator/rooftop_operator/metrics_client.py",
    "operator/rooftop_control/signals.py",
    "operator/rooftop_control/readings.py",
    "dashboards/queries.py",
    "operator/rooftop_sim/engine/vllm_metrics.py",
)
SERVED = "tiny"
MAX_MODEL_LEN = 1024  # the token-count histograms' buckets follow it
REQUESTS = ((40, 8), (300, 16))  # (prompt, output) tokens
CHAT_TOKENS = 4
GIB = 1024**3  # VLLM_CPU_KVCACHE_SPACE's unit
# Both engines speculate, so the spec-decode families exist in both. vLLM drafts by
# n-gram lookup, which finds nothing in prompts of distinct token ids (no drafts, the
# same steps as without); the simulator's schedule drafts no token at these batches.
REAL_SPECULATION = '{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3}'
SIM_SPECULATION = (
    '{"method": "ngram", "num_speculative_tokens": 2, '
    '"num_speculative_tokens_per_batch_size": [[1, 8, 0]]}'
)


def rooftop_families() -> set[str]:
    """Every ``vllm:`` name Rooftop's code mentions."""
    found: set[str] = set()
    for path in READERS:
        found |= set(re.findall(r"vllm:[a-z0-9_]+", (ROOT / path).read_text()))
    return found


def family_of(name: str, families: dict[str, Metric]) -> str | None:
    """The parsed family a mentioned name belongs to (parsers drop ``_total`` of
    counters and the ``_bucket``/``_sum``/``_count`` of histograms)."""
    for suffix in ("", "_total", "_bucket", "_sum", "_count"):
        base = name.removesuffix(suffix) if suffix else name
        if base in families:
            return base
    return None


def scrape(base_url: str) -> dict[str, Metric]:
    with urllib.request.urlopen(f"{base_url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def drive(base_url: str) -> None:
    """The same requests against either engine (streamed completions as ``rooftop load``
    sends them, and a chat completion through the model's chat template); each must
    succeed."""

    async def main() -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as s:
            for prompt, output in REQUESTS:
                res = await send_request(s, LoadSpec(base_url, SERVED), prompt, output, 0.0)
                assert res.error is None, res.error
                assert res.output_tokens == output
            body = {"model": SERVED, "messages": [{"role": "user", "content": "Hello there"}],
                    "max_tokens": CHAT_TOKENS, "ignore_eos": True}  # fmt: skip
            async with s.post(f"{base_url}/v1/chat/completions", json=body) as resp:
                answer = await resp.json()
                assert resp.status == 200, answer
            assert isinstance(answer["choices"][0]["message"]["content"], str)
            assert answer["usage"]["completion_tokens"] == CHAT_TOKENS

    asyncio.run(main())


def shape(family: Metric) -> dict[str, Any]:
    """What must match: type, help text, label names, bucket bounds, finished_reason
    values."""
    labels = {k for s in family.samples for k in s.labels if k != "le"}
    buckets = sorted({float(s.labels["le"]) for s in family.samples if "le" in s.labels})
    reasons = sorted({s.labels["finished_reason"] for s in family.samples
                      if "finished_reason" in s.labels})  # fmt: skip
    return {"type": family.type, "help": family.documentation, "labels": sorted(labels),
            "buckets": buckets, "finished_reason": reasons}  # fmt: skip


@pytest.fixture(scope="module")
def real(
    vllm_py: Path, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Metric]]:
    work = tmp_path_factory.mktemp("vllm-metrics")
    args = ["--speculative-config", REAL_SPECULATION]
    engine = local_engine(
        vllm_py, tiny_model_dir, work, SERVED, args, max_model_len=MAX_MODEL_LEN, max_num_seqs=8
    )
    with engine.serving():
        drive(engine.url)
        yield scrape(engine.url)


@pytest.fixture(scope="module")
def simulated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Metric]]:
    port = free_port()
    argv = [sys.executable, "-m", "rooftop_cli.main", "engine-sim", "--port", str(port),
            "--model-name", SERVED, "--gpu", "l4", "--max-model-len", str(MAX_MODEL_LEN),
            "--max-num-seqs", "8", "--time-scale", "20",
            "--speculative-config", SIM_SPECULATION]  # fmt: skip
    log = tmp_path_factory.mktemp("engine-sim") / "engine-sim.log"
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": SOURCE_PATH}
    engine = VllmProcess(argv, env, port, log).start()
    try:
        engine.wait_ready(timeout=30)
        drive(engine.url)
        yield scrape(engine.url)
    finally:
        engine.stop()


def test_rooftop_reads_only_families_the_real_vllm_exports(real: dict[str, Metric]) -> None:
    missing = sorted(n for n in rooftop_families() if family_of(n, real) is None)
    assert not missing, f"Rooftop reads metrics vLLM {sorted(real)} does not export: {missing}"


def test_the_simulator_exports_every_family_as_the_real_vllm_does(
    real: dict[str, Metric], simulated: dict[str, Metric]
) -> None:
    diffs: dict[str, object] = {}
    for name in sorted(rooftop_families()):
        family = family_of(name, real)
        if family is None:
            continue  # the test above reports it
        if family not in simulated:
            diffs[family] = "missing from engine-sim"
            continue
        want, got = shape(real[family]), shape(simulated[family])
        if family == "vllm:cache_config_info":
            # An info metric: its labels are the engine's cache settings, which differ by
            # platform (the CPU build adds its own); the simulator's must be real ones.
            extra = set(got.pop("labels")) - set(want.pop("labels"))
            if extra:
                diffs[family + " labels"] = f"not in vLLM: {sorted(extra)}"
        if want != got:
            diffs[family] = {"vllm": want, "engine-sim": got}
    assert not diffs, "\n".join(f"{k}: {v}" for k, v in diffs.items())


def test_both_engines_counted_the_requests(
    real: dict[str, Metric], simulated: dict[str, Metric]
) -> None:
    """The comparison is only worth something if both engines observed the traffic."""
    for families in (real, simulated):
        count = {s.name: s.value for s in families["vllm:e2e_request_latency_seconds"].samples}
        assert count["vllm:e2e_request_latency_seconds_count"] == len(REQUESTS) + 1
        tokens = {s.name: s.value for s in families["vllm:generation_tokens"].samples}
        assert tokens["vllm:generation_tokens_total"] == sum(o for _, o in REQUESTS) + CHAT_TOKENS


def test_the_step_batch_reading_counts_the_same_steps_in_both_engines(
    real: dict[str, Metric], simulated: dict[str, Metric]
) -> None:
    """The calibration prices a window's mean step at decode tokens per engine step:
    the inter-token latency's count over ``vllm:iteration_tokens_total``'s. One request
    at a time, each answer of o tokens takes o steps (the first carries its prompt) and
    o - 1 inter-token gaps, so the reading is sum(o - 1) / sum(o) in both engines."""
    outputs = [o for _, o in REQUESTS] + [CHAT_TOKENS]
    for families in (real, simulated):
        gaps = {s.name: s.value for s in families["vllm:inter_token_latency_seconds"].samples}
        steps = {s.name: s.value for s in families["vllm:iteration_tokens_total"].samples}
        assert gaps["vllm:inter_token_latency_seconds_count"] == sum(o - 1 for o in outputs)
        assert steps["vllm:iteration_tokens_total_count"] == sum(outputs)


def test_the_kv_cache_holds_the_tokens_the_planner_counts(
    real: dict[str, Metric], tiny_model_dir: Path
) -> None:
    """The real vLLM's cache of VLLM_CPU_KVCACHE_SPACE = 1 GiB, in blocks of block_size
    tokens (``vllm:cache_config_info``), against the planner's KV bytes per token for
    the tiny model's config.json: within 2 %."""
    (info,) = real["vllm:cache_config_info"].samples
    tokens = int(info.labels["num_gpu_blocks"]) * int(info.labels["block_size"])
    model = model_from_hf_config(tiny_model_dir / "config.json")
    per_token = perf.kv_bytes_per_token_per_gpu(model, "auto", 1)
    assert per_token == pytest.approx(GIB / tokens, rel=0.02)
