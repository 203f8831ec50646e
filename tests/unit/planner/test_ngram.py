"""Prompt lookup (vLLM's ``ngram``) as a planned speculative method: no drafter model,
its host time from the measured table, its acceptance stated per decode step."""

from __future__ import annotations

import json
import statistics
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from tests.unit.planner.test_speculative import target

from rooftop_api.spec import ServingTargetSpec
from rooftop_planner import drafters, host_time, perf, speculative
from rooftop_planner.catalog import load_catalog
from rooftop_planner.efficiency import load_efficiency
from rooftop_planner.perf import EngineShape
from rooftop_planner.search import plan_target

CATALOG = load_catalog()


def engine(acceptance: float = 0.6) -> tuple[EngineShape, speculative.Speculation]:
    """Llama-3-70B fp8 on 4 H100s, drafting by prompt lookup."""
    model, gpu = CATALOG.model("llama-3-70b"), CATALOG.gpus["h100-sxm"]
    eff = load_efficiency().lookup(gpu, "vllm")
    dep = EngineShape(model, gpu, 4, weight_dtype="fp8", kv_dtype="fp8", efficiency=eff)
    (spec,), problems = speculative.options(model, ["ngram"], acceptance, CATALOG)
    assert not problems
    return dep, spec


def test_the_fit_follows_the_measured_lookups() -> None:
    """Within 15 % of the median row, and no more than 2x off at any (one request of
    32k tokens, where the lookup takes some 40 µs)."""
    cost = host_time.lookup_cost()
    rows = host_time.measured_rows(host_time.TABLES["ngram"])
    ratio = cost.seconds(rows.batch, rows.tokens) / rows.seconds
    assert statistics.median(abs(r - 1.0) for r in ratio) < 0.15
    assert ratio.min() > 0.5 and ratio.max() < 2.0
    assert "NgramProposer" in cost.measured_on and "CPU" in cost.measured_on


def test_the_lookup_costs_more_with_more_requests_and_more_tokens() -> None:
    cost = host_time.lookup_cost()
    seqs = np.array([1.0, 64.0, 64.0, 256.0, 0.0])
    tokens = np.array([1e3, 64e3, 640e3, 640e3, 0.0])
    t = cost.seconds(seqs, tokens)
    assert t[0] < t[1] < t[2] < t[3] and t[4] == 0.0


def test_without_an_acceptance_ngram_is_not_an_option_and_the_fix_is_named() -> None:
    model = CATALOG.model("llama-3-70b")
    found, problems = speculative.options(model, ["ngram"], None, CATALOG)
    assert not found
    assert "set spec.workload.acceptanceRate" in problems[0]
    assert "depends on your traffic" in problems[0]
    assert drafters.planned_acceptance(target(), "ngram") is None
    result = plan_target(target(constraints={"speculative": ["ngram"]}))
    assert any("constraints.speculative: ngram" in r for r in result.reasons)


def test_prompt_lookup_loads_nothing_on_the_gpus() -> None:
    dep, spec = engine()
    assert spec.draft is None and speculative.drafter_bytes_per_gpu(dep, spec) == 0.0
    assert speculative.kv_capacity_tokens(dep, spec, 8192) == perf.kv_capacity_tokens(
        dep, max_num_batched_tokens=8192
    )
    assert "no drafter weights or KV" in speculative.weights_note(dep, spec)


@pytest.mark.parametrize(("batch", "k"), [(1.0, 3), (32.0, 2), (128.0, 5)])
def test_a_lookup_step_is_the_verification_plus_the_host_lookup(
    batch: float, k: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What prompt lookup adds to a step verifying K tokens per sequence is the
    measured host time over the batch's tokens, whatever K."""
    dep, spec = engine()
    context = 1500.0
    with_lookup, _ = speculative._decode_steps(dep, spec, batch, context, k)
    free = host_time.LookupCost((0.0, 0.0, 0.0, 0.0), "free")
    monkeypatch.setattr(speculative, "lookup_cost", lambda method="ngram": free)
    verify_only, _ = speculative._decode_steps(dep, spec, batch, context, k)
    tokens = batch * perf.cached_tokens(dep.model, context)
    host = host_time.lookup_cost().seconds(np.array([batch]), np.array([tokens]))[0]
    assert with_lookup[0] == verify_only[0]  # no speculation, no lookup
    for length in range(1, k + 1):
        assert with_lookup[length] - verify_only[length] == pytest.approx(host, rel=1e-9)


def test_vllm_is_given_the_method_and_lengths_but_no_model() -> None:
    dep, spec = engine()
    planned = speculative.planned(dep, spec, 1500.0, 4.0)
    assert planned is not None
    config = json.loads(planned.config)
    assert config["method"] == "ngram" and "model" not in config
    assert config["num_speculative_tokens"] >= 1
    assert "vLLM's prompt lookup" in planned.note


def test_a_fast_70b_target_is_planned_cheaper_with_prompt_lookup() -> None:
    """At 70 output tokens/s per user a lookup accepting 0.7 per decode step (code
    edits, retrieved documents) does what a draft model does, with no drafter to load;
    at 0.1 (chat that seldom repeats its prompt) it never pays."""
    without = plan_target(target()).plan
    lookup = plan_target(
        target(constraints={"speculative": ["ngram"]}, workload={"acceptanceRate": 0.7})
    ).plan
    assert without is not None and lookup is not None
    assert '"method":"ngram"' in lookup.speculative_config
    assert lookup.usd_per_hour < 0.75 * without.usd_per_hour
    seldom = plan_target(
        target(constraints={"speculative": ["ngram"]}, workload={"acceptanceRate": 0.1})
    ).plan
    assert seldom is not None and not seldom.speculative_config


def spec_with(**changes: Any) -> ServingTargetSpec:
    return target(workload={"acceptanceRate": 0.7}, **changes)


def test_ngram_names_no_drafter() -> None:
    drafter = {"method": "ngram", "model": "x"}
    with pytest.raises(ValueError, match="ngram looks tokens up on the host"):
        spec_with(constraints={"speculative": ["ngram"]}, engine={"drafter": drafter})


@pytest.mark.parametrize("flag", ["--async-scheduling", "--async_scheduling"])
def test_vllm_refuses_async_scheduling_beside_prompt_lookup(flag: str) -> None:
    with pytest.raises(ValueError, match="--async-scheduling, which vLLM refuses beside ngram"):
        spec_with(constraints={"speculative": ["ngram"]}, engine={"extraArgs": [flag]})
    spec_with(
        constraints={"speculative": ["ngram"]}, engine={"extraArgs": ["--no-async-scheduling"]}
    )
    spec_with(constraints={"speculative": ["eagle3"]}, engine={"extraArgs": [flag]})


def test_the_acceptance_stays_the_one_the_planner_was_given() -> None:
    _, spec = engine(0.55)
    assert spec.acceptance == 0.55 and spec.acceptance_source == "spec.workload.acceptanceRate"
    assert replace(spec, acceptance=0.8).method == "ngram"
