"""Owned and on-demand GPUs: what a plan costs, and what a price of $0 does to the choice."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from rooftop_api.manifest import load_target
from rooftop_api.spec import Pricing, ServingTargetSpec
from rooftop_planner.catalog import CatalogError, load_catalog
from rooftop_planner.pricing import GpuPrice, ReplicaPrice, gpu_prices, with_default
from rooftop_planner.search import plan_target

# 8 owned GPUs at $0.50, then $2.00 each
TIERED = GpuPrice(on_demand_usd=2.0, owned=8, owned_usd=0.5)


@pytest.mark.parametrize(
    ("gpus", "usd"),
    [(0, 0.0), (1, 0.5), (8, 4.0), (9, 6.0), (12, 12.0)],
)
def test_owned_gpus_are_priced_first(gpus: int, usd: float) -> None:
    assert TIERED.usd_per_hour(gpus) == pytest.approx(usd)


@pytest.mark.parametrize("budget", [0.0, 1.9, 4.0, 5.99, 6.0, 100.0])
def test_most_gpus_is_the_inverse_of_the_price(budget: float) -> None:
    """The most GPUs a budget buys is the largest n whose price is within it."""
    most = math.floor(TIERED.most_gpus(budget))
    assert TIERED.usd_per_hour(most) <= budget + 1e-9
    assert TIERED.usd_per_hour(most + 1) > budget


def test_free_gpus_are_affordable_without_limit_and_replicas_count_whole_pods() -> None:
    assert GpuPrice(0.0).most_gpus(0.0) == math.inf
    assert ReplicaPrice(GpuPrice(0.0), tp=4).affordable(0.0, at_most=16) == 16
    # TP4 replicas over 8 owned GPUs at $0, then $2/GPU-h: a $10/h budget buys 8 + 5
    # GPUs, three whole replicas (the third has 4 on-demand GPUs, $8/h)
    replicas = ReplicaPrice(GpuPrice(2.0, owned=8), tp=4)
    assert replicas.affordable(10.0, at_most=16) == 3
    assert replicas.usd_per_hour(3) == pytest.approx(8.0)
    assert replicas.usd_per_hour(4) == pytest.approx(16.0)


EXAMPLE = Path(__file__).parents[3] / "examples" / "simulated-chat.yaml"


def short_chat() -> ServingTargetSpec:
    """The example with a short chat's workload (4 req/s, 512/128 tokens) and $10/h."""
    doc = load_target(EXAMPLE).model_dump(by_alias=True, exclude_none=True)["spec"]
    doc["workload"] = {
        "requestsPerSecond": 4,
        "promptTokens": {"mean": 512, "p90": 1024},
        "outputTokens": {"mean": 128, "p90": 256},
    }
    doc["budget"] = {"usdPerHour": 10}
    return ServingTargetSpec.model_validate(doc)


def with_pricing(**pricing: Any) -> ServingTargetSpec:
    """The short chat on any catalog GPU, with ``pricing`` (camelCase, as in YAML)."""
    spec = short_chat()
    constraints = spec.constraints.model_copy(update={"gpu_types": None})
    return spec.model_copy(
        update={"pricing": Pricing.model_validate(pricing), "constraints": constraints}
    )


def test_gpus_at_zero_dollars_do_not_mean_take_them_all() -> None:
    """Every L40S plan costs $0 at a price of 0; the plan with the fewest GPUs wins,
    though bigger ones predict lower latency (the tie once went to the lowest TPOT: the
    plan with the most GPUs)."""
    result = plan_target(with_pricing(usdPerGpuHour={"l40s": 0}))
    assert result.plan is not None and result.plan.usd_per_hour == 0.0
    free = [p for p in result.candidates if p.usd_per_hour == 0.0]
    fewest = min(p.replicas * p.tp for p in free)
    assert max(p.replicas * p.tp for p in free) > fewest  # a tie to break
    assert result.plan.replicas * result.plan.tp == fewest
    fastest = min(free, key=lambda p: p.tpot_ms)
    assert fastest.replicas * fastest.tp > fewest


def test_plans_beyond_the_owned_gpus_pay_on_demand_for_the_rest() -> None:
    spec = with_pricing(owned={"l40s": {"count": 2}})
    busy = spec.model_copy(
        update={"workload": spec.workload.model_copy(update={"requests_per_second": 30})}
    )
    list_price = load_catalog().gpus["l40s"].usd_per_gpu_hour
    l40s = [p for p in plan_target(busy).candidates if p.gpu == "l40s"]
    assert any(p.replicas * p.tp > 2 for p in l40s)
    for plan in l40s:
        assert plan.usd_per_hour == pytest.approx(max(plan.replicas * plan.tp - 2, 0) * list_price)


def test_owned_gpus_win_where_they_are_cheaper_in_all() -> None:
    """One owned A100 at $0.50/h serves the short chat; it beats every list price."""
    result = plan_target(with_pricing(owned={"a100-80gb": {"count": 1, "usdPerGpuHour": 0.5}}))
    assert result.plan is not None
    assert (result.plan.gpu, result.plan.replicas * result.plan.tp) == ("a100-80gb", 1)
    assert result.plan.usd_per_hour == pytest.approx(0.5)


def test_an_unknown_gpu_in_owned_names_the_field_and_the_ids() -> None:
    with pytest.raises(CatalogError, match=r"spec.pricing.owned: unknown GPU id\(s\) h100; use"):
        plan_target(with_pricing(owned={"h100": {"count": 8}}))


@pytest.mark.parametrize(
    ("owned", "message"),
    [
        ({"l4": {"count": 0}}, "greater than or equal to 1"),
        ({"l4": {"count": 2, "usdPerGpuHour": -1}}, "greater than or equal to 0"),
        ({"l4": {"usdPerGpuHour": 1}}, "count"),
        ({"l4": {"count": 2, "price": 1}}, "Extra inputs are not permitted"),
    ],
)
def test_bad_owned_entries_are_refused(owned: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        Pricing.model_validate({"owned": owned})


def test_the_cluster_default_fills_gpu_types_the_spec_leaves_out() -> None:
    default = Pricing.model_validate(
        {"usdPerGpuHour": {"l4": 0.6, "h100-sxm": 2.0}, "owned": {"l4": {"count": 16}}}
    )
    spec = with_pricing(usdPerGpuHour={"h100-sxm": 1.5})
    prices = gpu_prices(with_default(spec, default), load_catalog())
    assert prices["h100-sxm"] == GpuPrice(1.5)  # the spec's own wins
    assert prices["l4"] == GpuPrice(0.6, owned=16)
    assert with_default(spec, None) is spec
