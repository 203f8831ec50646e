"""The simulated engine speculates as vLLM does: drafts per batch size, acceptance per
request, one verification step yielding 1 + accepted tokens, the spec-decode counters."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import generate_latest
from tests.unit.sim.engine_sim.test_core import drive

from rooftop_planner.catalog import load_catalog
from rooftop_planner.drafters import mtp_head, tokens_per_step
from rooftop_planner.hf_config import model_from_hf_config
from rooftop_planner.host_time import lookup_cost, vllm_step_host_s
from rooftop_sim.engine.core import EngineConfig, EngineCore, Request, Speculation
from rooftop_sim.engine.server import speculation_from
from rooftop_sim.engine.truth import ENGINE_STEP_OVERHEAD_S, TruthModel
from rooftop_sim.engine.vllm_metrics import VllmMetrics


def truth(draft: bool = True) -> TruthModel:
    model = TruthModel.for_deployment("llama-3-70b", "h100-sxm", 4, "fp8", "fp8")
    return model.with_drafter(load_catalog().model("llama-3-8b"), "fp8") if draft else model


def engine(schedule: tuple[tuple[int, int, int], ...], acceptance: float) -> EngineCore:
    spec = Speculation(schedule, acceptance, concentration=1e6)  # every request alike
    return EngineCore(EngineConfig(400_000, 64, 8192, 8192, speculation=spec), truth())


def test_a_step_yields_the_expected_tokens_per_sequence() -> None:
    """K = 3 at acceptance 0.7: E = 1 + 0.7 + 0.49 + 0.343 = 2.533 tokens per step."""
    eng = engine(((1, 64, 3),), 0.7)
    reqs = [Request(f"r{i}", 200, 400, 0.0) for i in range(8)]
    drive(eng, reqs)
    c = eng.counters
    assert all(r.out == 400 for r in reqs)
    per_step = (c.spec_drafts + c.spec_accepted) / c.spec_drafts  # a draft's tokens, bonus in
    assert per_step == pytest.approx(tokens_per_step(0.7, 3), rel=0.03)
    assert c.spec_accepted_per_pos[0] / c.spec_drafts == pytest.approx(0.7, abs=0.03)
    assert c.spec_accepted_per_pos[2] / c.spec_drafts == pytest.approx(0.343, abs=0.03)
    assert c.spec_draft_tokens <= 3 * c.spec_drafts


def test_the_schedule_sets_the_draft_length_by_batch_and_zero_turns_it_off() -> None:
    """Batches of 1-2 draft 4 tokens, 3 and more none: 8 requests never speculate."""
    eng = engine(((1, 2, 4), (3, 64, 0)), 0.9)
    drive(eng, [Request(f"r{i}", 100, 50, 0.0) for i in range(8)])
    assert eng.counters.spec_drafts == 0
    alone = engine(((1, 2, 4), (3, 64, 0)), 0.9)
    drive(alone, [Request("solo", 100, 50, 0.0)])
    drafts = alone.counters.spec_drafts
    assert drafts > 0 and 4 * (drafts - 1) < alone.counters.spec_draft_tokens <= 4 * drafts


def test_no_draft_runs_past_max_tokens_and_outputs_stop_there() -> None:
    eng = engine(((1, 64, 5),), 0.99)
    req = Request("short", 100, 7, 0.0)
    drive(eng, [req])
    assert req.out == 7 and req.finished_reason == "length"


def test_speculative_steps_cost_more_than_plain_ones_and_serve_tokens_faster() -> None:
    """One step verifying 3 drafts for 16 sequences, the drafter included, takes longer
    than a plain decode step but less than 2.5 of them: at batch 16 speculation pays."""
    plain, spec = truth(draft=False), truth()
    step = plain.step_s(16, 16 * 1500, 0, 0.0)
    verified = spec.step_s(16, 16 * 1500, 0, 0.0, draft_tokens=48, draft_k=3)
    assert step < verified < tokens_per_step(0.7, 3) * step


def test_the_drafter_leaves_the_kv_cache_less_room() -> None:
    assert truth().kv_capacity_tokens() < 0.95 * truth(draft=False).kv_capacity_tokens()


def test_metrics_carry_vllms_spec_decode_families() -> None:
    """Names and labels as vllm/v1/spec_decode/metrics.py exports them (the real-vLLM
    family comparison covers the rest); counters follow the engine's totals."""
    eng = engine(((1, 64, 2),), 0.6)
    drive(eng, [Request(f"r{i}", 100, 60, 0.0) for i in range(4)])
    metrics = VllmMetrics("m", 8192, {}, num_speculative_tokens=2)
    metrics.count_spec_decode(eng)
    metrics.count_spec_decode(eng)  # idempotent: totals, not increments
    text = generate_latest(metrics.registry).decode()
    c = eng.counters
    assert (
        f'vllm:spec_decode_num_drafts_total{{engine="0",model_name="m"}} {c.spec_drafts}.0' in text
    )
    assert "vllm:spec_decode_num_draft_tokens_total" in text
    assert f"{c.spec_accepted}.0" in text
    assert (
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"}'
        in text
    )
    assert "spec_decode" not in generate_latest(VllmMetrics("m", 8192, {}).registry).decode()


def unhidden_host_s(requests: float, tokens: float) -> float:
    """vLLM's own host work for a step beyond the fixed cost the simulated engine pays per
    step: what a host drafter's step waits for once async scheduling is off."""
    host = float(vllm_step_host_s(np.array([requests]), np.array([tokens]))[0])
    return max(host - ENGINE_STEP_OVERHEAD_S, 0.0)


def test_a_prompt_lookup_adds_its_measured_host_time_to_a_drafting_step_only() -> None:
    """ngram loads no drafter: a step verifying drafts costs the verification plus the
    host's lookup over the batch's tokens (the measured table), a plain step only the
    engine's own host work that it no longer hides (vLLM drops async scheduling beside
    ngram), whatever the GPU's reality factor."""
    plain = truth(draft=False)
    lookup = truth(draft=False).with_lookup()
    verify = plain.step_s(16, 16 * 1500, 0, 0.0, draft_tokens=48, draft_k=3)
    host = float(lookup_cost().seconds(np.array([16.0]), np.array([16.0 * 1500]))[0])
    engine_host = unhidden_host_s(16.0, 16.0 * 1500)
    assert engine_host > 0.0
    assert lookup.step_s(16, 16 * 1500, 0, 0.0, draft_tokens=48, draft_k=3) == pytest.approx(
        verify + engine_host + host, rel=1e-9
    )
    assert lookup.step_s(16, 16 * 1500, 0, 0.0) == pytest.approx(
        plain.step_s(16, 16 * 1500, 0, 0.0) + engine_host, rel=1e-9
    )
    assert lookup.kv_capacity_tokens() == plain.kv_capacity_tokens()


def test_suffix_decoding_adds_its_walks_and_the_prompt_trees_it_builds() -> None:
    """suffix loads no drafter: a drafting step costs the verification plus the host's
    walks over the batch and the trees of the prompt tokens the step prefills (the
    measured suffix table); the JSON gives one K and no drafter shape."""
    plain = truth(draft=False)
    suffix = truth(draft=False).with_lookup("suffix")
    cost = lookup_cost("suffix")
    verify = plain.step_s(16, 16 * 1500, 2048, 2048.0 * 1024, draft_tokens=48, draft_k=3)
    host = float(cost.seconds(np.array([16.0]), np.array([16.0 * 1500]), 2048.0)[0])
    assert cost.per_prompt_token_s > 0.0
    assert suffix.step_s(
        16, 16 * 1500, 2048, 2048.0 * 1024, draft_tokens=48, draft_k=3
    ) == pytest.approx(verify + unhidden_host_s(17.0, 16.0 * 1500) + host, rel=1e-9)
    spec, drafter = speculation_from(
        '{"method": "suffix", "num_speculative_tokens": 4}',
        0.6,
        0,
        64,
        load_catalog().model("llama-3-70b"),
    )
    assert drafter is None and spec.lookup == "suffix" and spec.schedule == ((1, 64, 4),)


def test_the_simulated_engine_drafts_with_the_models_own_mtp_layers() -> None:
    """--speculative-config {"method": "mtp"}: the drafter is the model's MTP layer, in
    the model's weight dtype; a model without one is refused with why."""
    hf = Path(__file__).parents[2] / "planner" / "hf_configs" / "deepseek-v3.json"
    deepseek = model_from_hf_config(json.loads(hf.read_text()))
    config = '{"method": "mtp", "num_speculative_tokens": 1}'
    spec, drafter = speculation_from(config, 0.85, 0, 64, deepseek, None, "fp8")
    assert spec.num_tokens == 1 and drafter == (mtp_head(deepseek), "fp8")
    with pytest.raises(ValueError, match="mtp drafts with the model's multi-token-prediction"):
        speculation_from(config, 0.85, 0, 64, load_catalog().model("llama-3.1-8b"))
