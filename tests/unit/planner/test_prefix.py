"""Prefix reuse in the plan: cached prompt tokens are not prefilled, and where a session's
history is cached depends on how many replicas there are and how the Service routes."""

from __future__ import annotations

import math
from typing import Any

import pytest

from rooftop_api.spec import ServingTargetSpec
from rooftop_planner.plan import Plan
from rooftop_planner.prefix import BLOCK_TOKENS, PrefixModel
from rooftop_planner.search import plan_target

# A long-prompt chat on H100s: most of every prompt is the conversation so far.
PROMPT = 12_000.0


def spec(prefix: dict[str, Any] | None = None, replicas: int | None = None) -> ServingTargetSpec:
    workload: dict[str, Any] = {
        "requestsPerSecond": 10.0,
        "promptTokens": {"mean": PROMPT},
        "outputTokens": {"mean": 340},
    }
    if prefix is not None:
        workload["prefix"] = prefix
    return ServingTargetSpec.model_validate(
        {
            "model": "llama-3.1-8b",
            "slo": {"tpotMs": 40, "ttftMs": 2000},
            "workload": workload,
            "budget": {"usdPerHour": 500},
            "constraints": {
                "gpuTypes": ["h100-sxm"],
                "maxReplicas": 64,
                "kvDtypes": ["auto"],
                "maxTensorParallel": 1,  # several replicas: where session hits depend on R
            }
            | ({"minReplicas": replicas, "maxReplicas": replicas} if replicas else {}),
        }
    )


def chosen(target: ServingTargetSpec) -> Plan:
    result = plan_target(target)
    assert result.plan is not None, result.reasons
    return result.plan


def test_cached_tokens_are_not_prefilled_so_the_same_rate_needs_less() -> None:
    """A prefix-blind planner prices all 12,000 prompt tokens' prefill; with half of them
    shared by every request, TTFT and the fleet's cost both fall."""
    blind = chosen(spec())
    shared = chosen(spec({"sharedTokens": 6000}))
    assert shared.prefix_hit_ratio == pytest.approx(6000 / PROMPT)
    assert blind.prefix_hit_ratio == 0.0
    assert shared.usd_per_hour < blind.usd_per_hour
    fleet = 8  # the same replicas for both: TTFT at each batch cap
    by_scale = {p.scale: p for p in plan_target(spec(replicas=fleet)).candidates}
    twins = [
        (plan, by_scale[plan.scale])
        for plan in plan_target(spec({"sharedTokens": 6000}, replicas=fleet)).candidates
        if plan.scale in by_scale
    ]
    assert twins
    assert all(plan.ttft_ms < 0.75 * twin.ttft_ms for plan, twin in twins), twins


def test_session_hits_fall_as_one_over_the_replicas_when_the_service_spreads() -> None:
    """Shared tokens hit everywhere; a session's history only on its earlier replica,
    1 time in R: hits = (S + f·(p − S)/R) / p, S in whole KV blocks."""
    plan = chosen(spec({"sharedTokens": 500, "sessionShare": 0.6}))
    shared = 500 // BLOCK_TOKENS * BLOCK_TOKENS
    expected = (shared + 0.6 * (PROMPT - shared) / plan.replicas) / PROMPT
    assert plan.replicas > 1
    assert plan.prefix_hit_ratio == pytest.approx(expected, rel=1e-6)


def test_a_prefix_aware_router_keeps_every_session_hit_on_any_fleet() -> None:
    spread = chosen(spec({"sessionShare": 0.6}))
    routed = chosen(spec({"sessionShare": 0.6, "router": "PrefixAware"}))
    assert routed.prefix_hit_ratio == pytest.approx(0.6, rel=1e-6)
    assert spread.prefix_hit_ratio < 0.6 / 2
    assert routed.usd_per_hour < spread.usd_per_hour
    assert not routed.session_affinity  # the router does it, not the Service


def test_client_ip_affinity_is_chosen_only_where_sessions_have_their_own_ip() -> None:
    """Through a gateway every request shares a few IPs, and affinity would pile them on
    a few pods: it is planned only when the spec says each session has its own IP, and
    then only because it is cheaper, which the summary says."""
    without = chosen(spec({"sessionShare": 0.6}))
    pinned = chosen(spec({"sessionShare": 0.6, "clientIPSessions": True}))
    assert not without.session_affinity
    assert pinned.session_affinity == "ClientIP"
    assert pinned.usd_per_hour < without.usd_per_hour
    assert "sessionAffinity: ClientIP" in pinned.summary
    assert f"${without.usd_per_hour:.2f}/h" in pinned.summary


def test_affinity_that_saves_nothing_is_not_set() -> None:
    """Shared tokens hit on every replica: pinning sessions buys no hits."""
    plan = chosen(spec({"sharedTokens": 6000, "clientIPSessions": True}))
    assert not plan.session_affinity


def test_the_shared_prefix_is_held_once_in_the_kv_cache() -> None:
    """Running requests share the cached prefix's blocks, so a KV-bound replica holds
    more of them: an L4's 24 GB with 8B bf16 weights leave KV for few 12k-token prompts."""
    gpu = {"gpuTypes": ["l4"], "maxReplicas": 64, "kvDtypes": ["auto"]}
    base = spec().model_dump(by_alias=True, exclude_none=True)
    base["constraints"] = gpu
    base["slo"] = {"tpotMs": 200}
    blind = plan_target(ServingTargetSpec.model_validate(base))
    base["workload"]["prefix"] = {"sharedTokens": 10_000}
    shared = plan_target(ServingTargetSpec.model_validate(base))
    assert blind.plan is not None and shared.plan is not None
    most = max(p.max_num_seqs for p in shared.candidates)
    assert most > max(p.max_num_seqs for p in blind.candidates)


def test_the_observed_hit_ratio_fits_the_session_share_back() -> None:
    """What the loop does with vLLM's hit counters: the model the observed ratio
    implies at the replicas it was seen on, the stated shared tokens kept."""
    truth = PrefixModel(shared_tokens=496, session_share=0.45)
    prompts, weights = (2000.0, 8000.0, 20000.0), (0.5, 0.3, 0.2)
    seen = truth.hit_ratio(prompts, weights, same=1 / 3)
    guess = PrefixModel(shared_tokens=496, session_share=0.1)
    fit = guess.fitted(seen, prompts, weights, same=1 / 3)
    assert fit.session_share == pytest.approx(0.45, rel=1e-6)
    assert fit.hit_ratio(prompts, weights, same=1.0) == pytest.approx(
        truth.hit_ratio(prompts, weights, same=1.0)
    )


def test_fewer_hits_than_the_stated_shared_prefix_lowers_it() -> None:
    stated = PrefixModel(shared_tokens=4000)
    fit = stated.fitted(0.05, (10_000.0,), (1.0,), same=0.5)
    assert fit.session_share == 0.0
    assert fit.shared_tokens == pytest.approx(500.0)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("sessionShare", 1.5, "less than or equal to 1"),
        ("sharedTokens", -1, "greater than or equal to 0"),
        ("router", "Random", "'Service' or 'PrefixAware'"),
        ("clientIpSessions", True, "clientIpSessions"),  # as Kubernetes spells ClientIP
    ],
)
def test_a_bad_prefix_names_the_field(field: str, value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        spec({field: value})


def test_a_session_evicted_before_its_next_request_does_not_hit() -> None:
    """The cache keeps a session's blocks only while the replica writes fewer tokens than
    its free cache holds: K = 1 − exp(−C / (w·ḡ)); a longer think time, fewer hits."""
    model = PrefixModel(session_share=0.6, session_gap_s=100.0)
    assert model.kept(free_kv_tokens=400_000, written_tokens_per_s=40_000) == pytest.approx(
        1 - math.exp(-0.1)
    )
    quick = chosen(spec({"sessionShare": 0.6, "router": "PrefixAware", "sessionGapSeconds": 1}))
    slow = chosen(spec({"sessionShare": 0.6, "router": "PrefixAware", "sessionGapSeconds": 600}))
    assert quick.prefix_hit_ratio > 0.5 > 0.2 > slow.prefix_hit_ratio
    assert slow.usd_per_hour > quick.usd_per_hour


def test_unstated_gaps_keep_every_session_cached() -> None:
    model = PrefixModel(session_share=0.6)
    assert model.kept(free_kv_tokens=1.0, written_tokens_per_s=1e9) == 1.0
