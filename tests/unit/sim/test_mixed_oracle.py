"""The hindsight fleet allowed to mix GPU types (rooftop_sim.mixed_oracle)."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from rooftop_api.manifest import load_target
from rooftop_api.spec import ServingTargetSpec
from rooftop_planner.plan import Plan
from rooftop_planner.pricing import GpuPrice
from rooftop_planner.search import plan_target
from rooftop_sim import mixed_oracle
from rooftop_sim.cluster import ClusterConfig, RequestStream
from rooftop_sim.mixed_oracle import Shares, ShareTable, mixed_fit, replay, thinned
from rooftop_sim.report import Slo
from rooftop_sim.simulate import replica_of

ROOT = Path(__file__).resolve().parents[3]
TARGETS = Shares(0.9, 0.9)


def owned_a100s() -> ServingTargetSpec:
    return load_target(ROOT / "examples" / "owned-a100s.yaml").spec


def single(spec: ServingTargetSpec, gpu: str) -> Plan:
    constraints = spec.constraints.model_copy(update={"gpu_types": [gpu]})
    plan = plan_target(spec.model_copy(update={"constraints": constraints})).plan
    assert plan is not None
    return plan


def stream(n: int, rate: float, prompt: int = 1000, output: int = 200) -> RequestStream:
    arrivals = np.arange(n, dtype=np.float64) / rate
    return RequestStream(arrivals, np.full(n, prompt), np.full(n, output), "even")


def table_for(spec: ServingTargetSpec, shapes: list[Plan], requests: RequestStream) -> ShareTable:
    base = ClusterConfig(
        replica_of(spec.model, shapes[0]),
        noise=0.0,
        startup_s=0.0,
        routing="random",
        tpot_slo_ms=spec.slo.tpot_ms,
    )
    return ShareTable(requests, base, Slo(spec.slo.tpot_ms, spec.slo.ttft_ms), spec.model)


def test_thinning_keeps_the_share_asked_in_arrival_order() -> None:
    whole = stream(10_000, 10.0)
    kept = thinned(whole, 0.25, seed=3)
    assert len(kept.arrival_s) == pytest.approx(2_500, rel=0.05)
    assert np.all(np.diff(kept.arrival_s) > 0) and set(kept.arrival_s) <= set(whole.arrival_s)
    assert thinned(whole, 1.0, seed=3) is whole


def test_splits_give_every_count_of_at_most_three_shapes() -> None:
    """Against every count vector summing to n with at most three shapes in use."""
    for shapes, n in ((1, 4), (2, 5), (4, 6), (5, 3)):
        got = list(mixed_oracle._splits(shapes, n))
        every = [c for c in itertools.product(range(n + 1), repeat=shapes)
                 if sum(c) == n and sum(1 for x in c if x) <= mixed_oracle.MOST_SHAPES]  # fmt: skip
        assert len(got) == len(set(got)) and set(got) == set(every)


def test_the_search_finds_the_cheapest_split_brute_force_finds() -> None:
    """Shares given (no simulation): four owned A100 pods that miss alone beside paid
    GH200 pods that over-achieve. The cheapest split meeting 90 % is what trying every
    count of one or two shapes finds, and it leans on the owned pods missing on their
    own, which the planner's rule (every pool meets the SLO) would not allow."""
    spec = owned_a100s()
    shapes = [single(spec, "a100-80gb"), single(spec, "gh200")]
    prices = {"a100-80gb": GpuPrice(1.6, owned=4), "gh200": GpuPrice(2.29)}
    table = table_for(spec, shapes, stream(10, 1.0))
    for n in range(1, 9):  # the a100 pods reach 90 % at 5 pods, the gh200 pods at 3
        table.measured[0, n] = Shares(min(0.8 + 0.02 * n, 0.95), 1.0)
        table.measured[1, n] = Shares(min(0.6 + 0.12 * n, 0.99), 1.0)
    found = min(mixed_oracle._candidates(shapes, prices, table, TARGETS, 16))

    def usd(a: int, g: int) -> float:
        return prices["a100-80gb"].usd_per_hour(a * shapes[0].tp) + prices["gh200"].usd_per_hour(
            g * shapes[1].tp
        )

    def meets(a: int, g: int) -> bool:
        n = a + g
        share = (a * table.measured[0, min(n, 8)].tpot + g * table.measured[1, min(n, 8)].tpot) / n
        return share >= 0.9

    brute = min(
        usd(a, g)
        for a, g in itertools.product(range(17), repeat=2)
        if 0 < a + g <= 8 and meets(a, g)
    )
    assert found[0] == pytest.approx(brute)
    a100_pods, gh200_pods = found[2]
    assert a100_pods and gh200_pods  # a mix
    assert table.measured[0, a100_pods + gh200_pods].tpot < 0.9  # the owned pods miss alone


def test_the_oracle_fleet_keeps_the_slo_when_replayed_and_mixing_never_costs_more() -> None:
    """A short even trace the simulated engine serves: the fleet returned was replayed on
    the whole trace and kept 90 % within both bounds; allowed two GPU types it costs no
    more than the cheapest fleet of either type alone."""
    spec = owned_a100s()
    shapes = [single(spec, "a100-80gb"), single(spec, "gh200")]
    prices = {"a100-80gb": GpuPrice(1.6, owned=4), "gh200": GpuPrice(2.29)}
    requests = stream(240, 8.0)
    mixed = mixed_fit(shapes, prices, table_for(spec, shapes, requests), TARGETS, 8)
    assert mixed is not None
    assert mixed.replayed.tpot >= 0.9 and mixed.replayed.ttft >= 0.9
    assert replay(shapes, mixed.counts, table_for(spec, shapes, requests)) == mixed.replayed
    for alone in ([shapes[0]], [shapes[1]]):
        fit = mixed_fit(alone, prices, table_for(spec, alone, requests), TARGETS, 8)
        assert fit is None or mixed.usd_per_hour <= fit.usd_per_hour + 1e-9


def test_the_kept_shapes_are_the_owned_types_and_the_cheapest_per_request() -> None:
    spec = owned_a100s()
    plans = [single(spec, g) for g in ("a100-80gb", "gh200", "h100-sxm", "h200", "b200")]
    prices = {p.gpu: GpuPrice(p.usd_per_replica_hour / p.tp) for p in plans}
    prices["a100-80gb"] = GpuPrice(1.6, owned=4)
    kept = mixed_oracle.oracle_shapes(plans, prices)
    assert kept[0].gpu == "a100-80gb" and len(kept) == 1 + mixed_oracle.KEPT_TYPES

    def per_request(p: Plan) -> float:
        return p.tp * prices[p.gpu].on_demand_usd * p.replicas / p.capacity_rps

    others = sorted((p for p in plans if p.gpu != "a100-80gb"), key=per_request)
    assert [p.gpu for p in kept[1:]] == [p.gpu for p in others[: mixed_oracle.KEPT_TYPES]]
    # a mixed fleet's pools come first; a pool of a shape already there (whatever its
    # replica count) is not mixed twice
    pool = plans[0].rescaled(7, plans[0].max_num_seqs, 1.0)
    wider = plans[0].rescaled(2, plans[0].max_num_seqs // 2, 1.0)
    with_pools = mixed_oracle.oracle_shapes(plans, prices, [wider, pool])
    assert with_pools[:2] == [wider, pool] and len(with_pools) == len(kept) + 1
