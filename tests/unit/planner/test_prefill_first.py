"""SGLang's default scheduling: a waiting prompt runs as a prefill batch of its own and
the running decodes wait for it (``enable_mixed_chunk`` off), where vLLM and
TensorRT-LLM carry the prompt's chunk inside a decode step."""

from __future__ import annotations

import pytest

from rooftop_planner import perf
from rooftop_planner.batching import EngineLimits, predict_continuous
from rooftop_planner.catalog import load_catalog
from rooftop_planner.efficiency import load_efficiency
from rooftop_planner.scenarios import default_limits

CATALOG = load_catalog()
MIXED = EngineLimits(max_num_seqs=1024, max_num_batched_tokens=8192)
PREFILL_FIRST = EngineLimits(max_num_seqs=1024, max_num_batched_tokens=8192, mixed_prefill=False)


def deployment(gpu: str = "h100-sxm") -> perf.EngineShape:
    eff = load_efficiency().lookup(CATALOG.gpu(gpu), "sglang")
    return perf.EngineShape(CATALOG.model("llama-3.1-8b"), CATALOG.gpu(gpu), efficiency=eff)


def test_each_prompt_stalls_every_decode_for_its_prefill_batch() -> None:
    """64 clients, 1,000/1,000 tokens: 64 / 1,001.5 prompts per step, each prefilled alone
    (t_p) while the 64 decodes wait, so t̄ = t_d + a · t_p."""
    dep = deployment()
    decode = perf.forward_time_s(dep, 64.0, 64 * 1500.0)
    alone = perf.forward_time_s(dep, 0.0, 0.0, 1000.0, 1000.0 * 1000.0 / 2.0)
    predicted = predict_continuous(dep, 64, 1000, 1000, PREFILL_FIRST)
    assert predicted.tpot_s == pytest.approx(decode + 64 / 1001.5 * alone, rel=1e-9)
    assert predicted.step is not None
    assert predicted.step.total_s == pytest.approx(predicted.tpot_s, rel=1e-6)


def test_prompts_arriving_faster_than_steps_share_a_prefill_batch() -> None:
    """256 clients, 128/128 tokens: about two prompts per step share one 253-token
    prefill batch per decode step (not two batches that each read the weights)."""
    dep = deployment()
    predicted = predict_continuous(dep, 256, 128, 128, PREFILL_FIRST)
    decode = perf.forward_time_s(dep, 256.0, 256 * 192.0)
    arriving = 256 / 129.5
    one_batch = perf.forward_time_s(dep, 0.0, 0.0, arriving * 128, arriving * 128 * 64.0)
    assert predicted.tpot_s == pytest.approx(decode + one_batch, rel=1e-9)


SHAPES = [(1000, 1000, 64), (1000, 128, 64), (128, 128, 256), (4000, 500, 32)]


@pytest.mark.parametrize(("isl", "osl", "concurrency"), SHAPES)
def test_decodes_wait_longer_and_prompts_shorter_than_with_mixed_chunks(
    isl: int, osl: int, concurrency: int
) -> None:
    dep = deployment()
    mixed = predict_continuous(dep, concurrency, isl, osl, MIXED)
    first = predict_continuous(dep, concurrency, isl, osl, PREFILL_FIRST)
    assert first.tpot_s > mixed.tpot_s
    assert first.ttft_s - first.tpot_s / 2 < mixed.ttft_s - mixed.tpot_s / 2


def test_short_answers_under_load_pay_most() -> None:
    """The decodes' extra wait grows with prompts per step: B / (osl + 1.5)."""
    dep = deployment()

    def extra(osl: int) -> float:
        return (predict_continuous(dep, 64, 1000, osl, PREFILL_FIRST).tpot_s
                / predict_continuous(dep, 64, 1000, osl, MIXED).tpot_s)  # fmt: skip

    assert extra(128) > extra(1000) > 1.0


@pytest.mark.parametrize(("gpu", "chunk"), [("a10g", 2048), ("l40s", 8192), ("h100-sxm", 8192),
                                            ("h200", 8192), ("b200", 16384)])  # fmt: skip
def test_sglang_runs_prefill_first_in_its_default_chunks(gpu: str, chunk: int) -> None:
    limits = default_limits("sglang", CATALOG.gpu(gpu), 64)
    assert not limits.mixed_prefill
    assert limits.max_num_batched_tokens == chunk


@pytest.mark.parametrize("engine", ["vllm", "trtllm", "nim"])
def test_other_engines_mix_prefill_chunks_into_decode_steps(engine: str) -> None:
    assert default_limits(engine, CATALOG.gpu("h100-sxm"), 64).mixed_prefill
