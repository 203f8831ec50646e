"""Plan and loop aim at one share: replicas are sized for the share of requests within
the TPOT bound that the operator's latency trim steers to (the SLO's percentile plus half
its allowed misses), so a plan's price is what the loop is expected to spend."""

from __future__ import annotations

import pytest

from rooftop_api.spec import Percentile, ServingTargetSpec
from rooftop_control.calibration import TrimConfig
from rooftop_planner import search
from rooftop_planner.search import plan_target

# An 8B on an H100 steps in ~6-7 ms at batch 1: a 9 ms bound binds at a few requests/s.
SLO_MS = 9.0


def one_replica(rps: float, percentile: str = "p90") -> ServingTargetSpec:
    """An 8B chat pinned to one H100: only the rate moves the operating point."""
    return ServingTargetSpec.model_validate(
        {
            "model": "llama-3.1-8b",
            "slo": {"tpotMs": SLO_MS, "tpotPercentile": percentile},
            "workload": {
                "requestsPerSecond": rps,
                "promptTokens": {"mean": 1000},
                "outputTokens": {"mean": 200},
            },
            "budget": {"usdPerHour": 100},
            "constraints": {
                "gpuTypes": ["h100-sxm"],
                "kvDtypes": ["auto"],
                "maxTensorParallel": 1,
                "minReplicas": 1,
                "maxReplicas": 1,
            },
        }
    )


def busiest_plan(percentile: str) -> tuple[float, float]:
    """(rate, reported TPOT ms) at the most traffic one replica is planned for
    (bisection on the rate to 0.1 %)."""
    low, high = 0.01, 200.0
    while high / low > 1.001:
        mid = (low * high) ** 0.5
        if plan_target(one_replica(mid, percentile)).plan is not None:
            low = mid
        else:
            high = mid
    plan = plan_target(one_replica(low, percentile)).plan
    assert plan is not None
    return low, plan.tpot_ms


@pytest.mark.parametrize("percentile", ["p90", "p99"])
def test_a_full_replica_keeps_the_loops_margin_below_the_slo(
    percentile: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At the most traffic a replica is planned for, TPOT at the SLO's own percentile still
    has room: what binds is the aimed share (95 % for p90), not the percentile itself
    (sized at the percentile, it sat at 8.9997 of 9 ms). Without the planner's traffic
    headroom, so the reported operating point is the binding one."""
    monkeypatch.setattr(search, "HEADROOM", 1.0)
    rate, tpot_ms = busiest_plan(percentile)
    assert rate > 1.0  # the replica serves real traffic, so the TPOT tail binds
    assert tpot_ms < 0.995 * SLO_MS


@pytest.mark.parametrize("percentile", list(Percentile))
def test_the_plans_share_is_the_loops_trim_target(percentile: Percentile) -> None:
    result = plan_target(one_replica(1.0, percentile.value))
    trim = TrimConfig.for_percentile(percentile.quantile)
    assert trim.target == pytest.approx(percentile.aim)
    assert f"sized for {percentile.aim * 100:g} % of requests" in result.reasons[0]
