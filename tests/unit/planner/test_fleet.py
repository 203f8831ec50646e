"""Mixed fleets: the cheapest pools of several GPU types behind one evenly spreading
Service, checked against brute force and against the single-type plan."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from rooftop_api.manifest import load_target
from rooftop_api.spec import Pricing, ServingTargetSpec
from rooftop_planner.fleet import FleetPrice, cheapest_mix, rescaled
from rooftop_planner.inventory import GpuInventory
from rooftop_planner.plan import Plan
from rooftop_planner.pricing import GpuPrice, ReplicaPrice
from rooftop_planner.search import plan_target


def shape(gpu: str, tp: int, capacity: float, weight: str = "bf16") -> Plan:
    """A one-replica plan of ``gpu`` whose pod serves ``capacity`` req/s."""
    return Plan(gpu=gpu, tp=tp, replicas=1, max_num_seqs=64, weight_dtype=weight,
                kv_dtype="auto", max_model_len=8192, gpu_memory_utilization=0.9,
                tpot_ms=20.0, ttft_ms=100.0, output_tok_s=0.0, usd_per_hour=0.0,
                capacity_rps=capacity)  # fmt: skip


def test_owned_pods_first_then_the_cheapest_type_whose_pods_keep_up() -> None:
    """50 req/s over pods of 10 req/s (A: 4 owned at $0, then $4) and 12 req/s (B: $2.50).
    Five pods give each 10 req/s, which both serve: the 4 owned A pods and one B pod cost
    $2.50, where five A pods cost $4 and five B pods $12.50. At 40 req/s the 4 owned A
    pods alone serve it: one type, so no mix is offered."""
    plans = [shape("a", 1, 10.0), shape("b", 1, 12.0)]
    prices = {"a": GpuPrice(4.0, owned=4), "b": GpuPrice(2.5)}
    mixed = cheapest_mix(plans, prices, 50.0, 16, 100.0)
    assert mixed is not None
    assert {p.plan.gpu: p.plan.replicas for p in mixed.pools} == {"a": 4, "b": 1}
    assert mixed.usd_per_hour == pytest.approx(2.5) and mixed.per_pod_rps == pytest.approx(10.0)
    assert [p.plan.usd_per_hour for p in mixed.pools] == pytest.approx([0.0, 2.5])
    assert cheapest_mix(plans, prices, 40.0, 16, 100.0) is None
    assert cheapest_mix(plans, prices, 50.0, 16, 2.4) is None  # over the budget


def test_every_pod_serves_the_even_share_within_the_free_gpus() -> None:
    plans = [shape("a", 2, 6.0), shape("a", 1, 2.0), shape("b", 1, 9.0)]
    prices = {"a": GpuPrice(1.0, owned=6), "b": GpuPrice(3.0)}
    mixed = cheapest_mix(plans, prices, 40.0, 32, 100.0, fit=lambda g, tp: 3 if g == "a" else 99)
    assert mixed is not None
    for pool in mixed.pools:
        assert mixed.per_pod_rps <= pool.capacity_rps + 1e-9
    assert next(p for p in mixed.pools if p.plan.gpu == "a").plan.replicas <= 3


def brute_force(
    plans: list[Plan], prices: dict[str, GpuPrice], rate: float, max_pods: int, budget: float
) -> float | None:
    """The cheapest fleet's cost by enumerating every shape and pod count per type (at
    equal cost fewer GPUs, then fewer pools), when it mixes types; else None."""
    by_gpu: dict[str, list[Plan]] = {}
    for plan in plans:
        by_gpu.setdefault(plan.gpu, []).append(plan)
    best: tuple[float, int, int] | None = None
    options = [[None, *shapes] for shapes in by_gpu.values()]
    for picks in itertools.product(*options):
        used = [p for p in picks if p is not None]
        for counts in itertools.product(range(1, max_pods + 1), repeat=len(used)):
            pods = sum(counts)
            if not used or pods > max_pods or any(rate / pods > p.capacity_rps for p in used):
                continue
            cost = sum(
                prices[p.gpu].usd_per_hour(n * p.tp) for p, n in zip(used, counts, strict=True)
            )
            key = (
                round(cost, 6),
                sum(n * p.tp for p, n in zip(used, counts, strict=True)),
                len(used),
            )
            if cost <= budget + 1e-9 and (best is None or key < best):
                best = key
    return best[0] if best is not None and best[2] >= 2 else None


@pytest.mark.parametrize("seed", range(40))
def test_the_fill_is_exact_against_brute_force(seed: int) -> None:
    rng = random.Random(seed)
    plans, prices = [], {}
    for gpu in ("a", "b", "c"):
        for tp in rng.sample([1, 2, 4], 2):
            plans.append(shape(gpu, tp, rng.uniform(1.0, 6.0) * tp))
        on_demand = rng.uniform(0.5, 3.0)
        prices[gpu] = GpuPrice(on_demand, owned=rng.choice([0, 0, 2, 3, 5]),
                               owned_usd=rng.uniform(0.0, on_demand))  # fmt: skip
    rate, max_pods, budget = rng.uniform(5.0, 30.0), 7, rng.uniform(5.0, 40.0)
    expected = brute_force(plans, prices, rate, max_pods, budget)
    got = cheapest_mix(plans, prices, rate, max_pods, budget)
    if expected is None:
        assert got is None
    else:
        assert got is not None and got.usd_per_hour == pytest.approx(expected, abs=1e-6)


EXAMPLE = "examples/chat-llama-3.1-8b.yaml"


def owning(gpu: str, count: int, rate: float) -> ServingTargetSpec:
    spec = load_target(EXAMPLE).spec
    return spec.model_copy(
        update={
            "pricing": Pricing.model_validate({"owned": {gpu: {"count": count}}}),
            "budget": spec.budget.model_copy(update={"usd_per_hour": 100}),
            "constraints": spec.constraints.model_copy(update={"max_replicas": 32}),
            "workload": spec.workload.model_copy(update={"requests_per_second": rate}),
        }
    )


def test_the_plan_says_when_owned_gpus_and_another_type_together_cost_less() -> None:
    """Four owned A100s serve 8 req/s alone; at 24 req/s the single-type plan buys more
    A100s, where the owned four beside one on-demand pod of another type cost less."""
    alone = plan_target(owning("a100-80gb", 4, 8))
    assert alone.mixed is None and alone.plan is not None and alone.plan.usd_per_hour == 0.0
    busy = plan_target(owning("a100-80gb", 4, 24))
    assert busy.plan is not None and busy.mixed is not None
    assert busy.mixed.usd_per_hour < busy.plan.usd_per_hour
    assert {p.plan.gpu for p in busy.mixed.pools} >= {"a100-80gb"}
    assert any("pools of several GPU types cost" in r for r in busy.reasons)
    assert busy.deployed is not None and busy.deployed.pools  # the mix is what deploys
    assert busy.explain().startswith(f"Chosen: {busy.mixed.summary}")
    assert busy.to_json()["mixed"]["usd_per_hour"] == pytest.approx(
        busy.mixed.usd_per_hour, abs=1e-3
    )


def test_a_mix_respects_the_free_gpus() -> None:
    spec = owning("a100-80gb", 4, 24)
    counted = GpuInventory({"a100-80gb": 8, "gh200": 1}, free={"a100-80gb": (4,), "gh200": (1,)})
    result = plan_target(spec, gpu_inventory=counted)
    if result.mixed is not None:
        for pool in result.mixed.pools:
            assert pool.plan.replicas <= counted.replicas_fit(pool.plan.gpu, pool.plan.tp)
    assert not math.isnan(result.budget_usd_per_hour)


def test_the_mix_deploys_as_one_plan_its_slowest_pool_sizes() -> None:
    """Every pod serves the same rate, so the pool with the least capacity per pod sizes
    the fleet: the plan is that pool's shape at every pod, at the fleet's cost, and keeps
    each pool; ``status.plan`` keeps it whole."""
    plans = [shape("a", 1, 10.0), shape("b", 1, 12.0)]
    prices = {"a": GpuPrice(4.0, owned=4), "b": GpuPrice(2.5)}
    mixed = cheapest_mix(plans, prices, 50.0, 16, 100.0)
    assert mixed is not None
    plan = mixed.plan()
    assert (plan.gpu, plan.replicas, plan.capacity_rps) == ("a", 5, pytest.approx(50.0))
    assert plan.usd_per_hour == pytest.approx(2.5) and plan.mixed
    assert [(p.gpu, p.replicas) for p in plan.pools] == [("a", 4), ("b", 1)]
    back = Plan.from_status(plan.to_status().model_dump(by_alias=True, exclude_none=True))
    assert [(p.gpu, p.replicas, p.usd_per_hour) for p in back.pools] == [
        ("a", 4, 0.0),
        ("b", 1, 2.5),
    ]
    assert back.shape == plan.shape


def two_pools() -> tuple[Plan, FleetPrice]:
    """A fleet of 4 owned A pods ($0, then $4/h each) and 1 B pod ($2.50/h)."""
    plans = [shape("a", 1, 10.0), shape("b", 1, 12.0)]
    prices = {"a": GpuPrice(4.0, owned=4), "b": GpuPrice(2.5)}
    mixed = cheapest_mix(plans, prices, 50.0, 16, 100.0)
    assert mixed is not None
    price = FleetPrice((("a", ReplicaPrice(prices["a"])), ("b", ReplicaPrice(prices["b"]))))
    return mixed.plan(), price


def test_the_loop_grows_onto_owned_gpus_first_then_the_cheapest_pods() -> None:
    """Owned A pods first ($0), then B pods ($2.50) before on-demand A pods ($4): every
    pod serves the same rate, so the cheapest pod is the cheapest capacity per request.
    Shrinking gives back the dearest pod first."""
    _, price = two_pools()
    assert [price.split(n) for n in (2, 4, 6)] == [
        {"a": 2, "b": 0},
        {"a": 4, "b": 0},
        {"a": 4, "b": 2},
    ]
    assert price.usd_per_hour(6) == pytest.approx(5.0)
    assert price.affordable(5.0, 100) == 6 and price.affordable(4.99, 100) == 5
    assert price.affordable(0.0, 100) == 4  # the owned pods cost nothing
    assert "4 on a (4 owned at $0.00/GPU-h, then $4.00/GPU-h)" in price.describe(5)


def test_growth_spills_onto_the_next_type_when_one_types_gpus_are_taken() -> None:
    """B is cheaper than on-demand A, but only 2 B pods fit on the free GPUs: the next
    pods go to A at its on-demand price."""
    plan, price = two_pools()
    full = price.within({"b": 2})
    assert full.split(8) == {"a": 6, "b": 2}
    assert full.room_total > 1000  # A's GPUs are not counted
    grown = rescaled(plan, 8, 32, full)
    assert [(p.gpu, p.replicas, p.max_num_seqs) for p in grown.pools] == [
        ("a", 6, 32),  # the pool that sizes the fleet runs the loop's batch cap
        ("b", 2, 64),
    ]
    assert grown.usd_per_hour == pytest.approx(2 * 4.0 + 2 * 2.5)
    assert (grown.replicas, grown.shape) == (8, plan.shape)
