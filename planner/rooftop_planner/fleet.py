"""A fleet of several GPU types behind one Service: the cheapest mix of pools.

The Service spreads requests evenly over ready pods, so every pod of every pool serves
the same rate ``r = Λ / N``: ``N`` pods in all, ``Λ`` the rate the fleet is sized for
(the mean rate with its headroom, or the burst rate held, as the single-type search
sizes it). A pool of shape ``s`` (GPU type, TP, dtypes, prefill chunk, batch cap) meets
the SLO at ``r`` when ``r ≤ c_s``, the most requests/s one of its replicas serves within
the SLO (``Plan.capacity_rps`` over its replicas, from the single-type search). Pods of
a faster GPU then run below their capacity: evenly spread, they get no more requests
than the slowest pool's; that is how the plan equalises the pools' requests per pod.

The mix solves, over ``N`` and one shape ``s_g`` per GPU type ``g``,

    minimise    Σ_g cost_g(n_g · tp_g)              USD/h (``pricing``: owned GPUs first)
    subject to  Σ_g n_g = N ≤ maxReplicas,   Λ / N ≤ c_{s_g} wherever n_g > 0,
                n_g ≤ fit_g(tp_g) (the free GPUs, where counted),   cost ≤ budget.

For one ``N`` the shapes that qualify are fixed; each type's cheapest qualifying pod is
the one with the fewest GPUs (capacity beyond ``r`` is never used), so it takes that
shape. A type's pods cost, one after another, ``tp·p_own`` while owned GPUs last and
``tp·p_demand`` beyond (one pod may straddle the two): marginal costs that never fall
where owned GPUs cost no more than on-demand ones, so taking the ``N`` cheapest pods
over all types is exact. (Owned GPUs priced above on demand make it an upper bound.)
``N`` runs from the fewest pods the fastest shape needs to ``maxReplicas``, or until
every type's cheapest pod serves ``Λ / N`` (beyond, pods only add cost):
``O(N_max · T log T)`` for ``T`` GPU types.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace

from rooftop_planner import explain
from rooftop_planner.plan import Plan
from rooftop_planner.pricing import GpuPrice, ReplicaPrice

# Pods a GPU type offers when its free GPUs are not counted: any number.
UNLIMITED = 1 << 30


@dataclass(frozen=True)
class Pool:
    """One GPU type's pods in a mixed fleet.

    Attributes:
        plan: the pool's shape and batch cap, at its ``replicas`` and their cost.
        capacity_rps: requests/s one of its pods serves within the SLO.
    """

    plan: Plan
    capacity_rps: float


@dataclass(frozen=True)
class MixedFleet:
    """The cheapest mix of pools (module docstring).

    Attributes:
        pools: one per GPU type, cheapest pods first.
        per_pod_rps: the rate every pod serves, requests/s (``Λ / N``).
        usd_per_hour: the fleet's cost.
    """

    pools: tuple[Pool, ...]
    per_pod_rps: float
    usd_per_hour: float

    @property
    def gpus(self) -> int:
        return sum(p.plan.replicas * p.plan.tp for p in self.pools)

    @property
    def summary(self) -> str:
        """``2 replicas of 2x a100-80gb (TP2), max-num-seqs 64 + 1 replica of 1x gh200
        (TP1), max-num-seqs 128: $2.29/h; every pod serves 8.8 req/s (the Service spreads
        requests evenly), within each pool's 9.1 and 20.3 req/s``."""
        pools = " + ".join(explain.describe(p.plan) for p in self.pools)
        within = " and ".join(f"{p.capacity_rps:.3g}" for p in self.pools)
        return (
            f"{pools}: ${self.usd_per_hour:.2f}/h; every pod serves {self.per_pod_rps:.3g} "
            f"req/s (the Service spreads requests evenly), within each pool's {within} req/s"
        )

    def plan(self) -> Plan:
        """The fleet as the one plan the operator deploys and the loop scales: the pool
        whose pods serve the fewest requests/s at the fleet's ``N`` pods (with every pod
        at the same rate, that pool is what sizes the fleet: ``Λ / N ≤ c_min``), the
        fleet's cost, its worst latencies and summed throughput, and every pool's own
        plan in ``pools``."""
        lead = min(self.pools, key=lambda p: p.capacity_rps)
        pods = sum(p.plan.replicas for p in self.pools)
        return replace(
            lead.plan,
            replicas=pods,
            usd_per_hour=self.usd_per_hour,
            capacity_rps=lead.capacity_rps * pods,
            tpot_ms=max(p.plan.tpot_ms for p in self.pools),
            ttft_ms=max(p.plan.ttft_ms for p in self.pools),
            output_tok_s=sum(p.plan.output_tok_s for p in self.pools),
            summary=self.summary,
            session_affinity="",
            pools=tuple(replace(p.plan, summary=explain.describe(p.plan)) for p in self.pools),
        )

    def to_json(self) -> dict[str, object]:
        return {
            "pools": [
                {**p.plan.to_json(), "capacity_rps": round(p.capacity_rps, 3)} for p in self.pools
            ],
            "per_pod_rps": round(self.per_pod_rps, 3),
            "usd_per_hour": round(self.usd_per_hour, 3),
        }


@dataclass(frozen=True)
class _Shape:
    plan: Plan
    capacity_rps: float  # one pod's


@dataclass(frozen=True)
class _Segment:
    """Pods of one GPU type at one marginal cost: ``pods`` pods at ``usd`` USD/h each."""

    usd: float
    tp: int
    gpu: str
    pods: int


def cheapest_mix(
    plans: Iterable[Plan],
    prices: Mapping[str, GpuPrice],
    fleet_rps: float,
    max_replicas: int,
    budget_usd_per_hour: float,
    fit: Callable[[str, int], int] | None = None,
) -> MixedFleet | None:
    """The cheapest fleet that serves ``fleet_rps`` (``Λ``, requests/s) within the
    budget (module docstring; at equal cost, fewer GPUs, then fewer pools), when it
    mixes GPU types; None when it is one type (the single-type search's) or none.

    ``plans``: the single-type search's plans that meet the SLO (any cost); ``fit``:
    (GPU id, TP) -> the pods the cluster's free GPUs hold (None: not counted)."""
    by_gpu = _shapes_by_gpu(plans)
    fastest = max((s.capacity_rps for shapes in by_gpu.values() for s in shapes), default=0.0)
    if fastest <= 0 or fleet_rps <= 0 or len(by_gpu) < 2:
        return None
    start = max(math.ceil(fleet_rps / fastest), 2)
    # once every type's cheapest pod serves the per-pod rate, more pods only add cost
    every_type_serves = min(shapes[0].capacity_rps for shapes in by_gpu.values())
    best: tuple[float, int, int, dict[str, tuple[_Shape, int]]] | None = None
    for pods in range(start, max_replicas + 1):
        if fleet_rps / (pods - 1) <= every_type_serves:
            break  # the last count already had every type's cheapest pods
        chosen = _fill(by_gpu, prices, fleet_rps / pods, pods, fit)
        if chosen is None:
            continue
        cost = sum(prices[g].usd_per_hour(n * s.plan.tp) for g, (s, n) in chosen.items())
        gpus = sum(n * s.plan.tp for s, n in chosen.values())
        key = (round(cost, 6), gpus, len(chosen))
        if cost <= budget_usd_per_hour + 1e-9 and (best is None or key < best[:3]):
            best = (*key, chosen)
    if best is None or len(best[3]) < 2:
        return None  # the cheapest fleet is one GPU type: the single-type search's
    chosen = best[3]
    pods = sum(n for _, n in chosen.values())
    pools = tuple(
        Pool(s.plan.rescaled(n, None, prices[g].usd_per_hour(n * s.plan.tp)), s.capacity_rps)
        for g, (s, n) in sorted(chosen.items(), key=lambda item: item[1][0].plan.gpu)
    )
    return MixedFleet(pools, fleet_rps / pods, best[0])


def _shapes_by_gpu(plans: Iterable[Plan]) -> dict[str, list[_Shape]]:
    """Per GPU type, its shapes with the most capacity per pod each (the largest batch
    cap's plan), cheapest pods first: fewer GPUs, then 16-bit, then more capacity.
    Plans with session affinity are left out: a pinned session's requests do not
    spread evenly."""
    best: dict[tuple[str, int, str, str, int], _Shape] = {}
    for plan in plans:
        if plan.session_affinity or plan.replicas <= 0:
            continue
        key = (plan.gpu, plan.tp, plan.weight_dtype, plan.kv_dtype, plan.max_num_batched_tokens)
        shape = _Shape(plan, plan.capacity_rps / plan.replicas)
        if key not in best or shape.capacity_rps > best[key].capacity_rps:
            best[key] = shape
    by_gpu: dict[str, list[_Shape]] = {}
    for shape in best.values():
        by_gpu.setdefault(shape.plan.gpu, []).append(shape)
    for shapes in by_gpu.values():
        shapes.sort(key=lambda s: (s.plan.tp, explain.quantized(s.plan), -s.capacity_rps))
    return by_gpu


def _fill(
    by_gpu: Mapping[str, list[_Shape]],
    prices: Mapping[str, GpuPrice],
    per_pod_rps: float,
    pods: int,
    fit: Callable[[str, int], int] | None,
) -> dict[str, tuple[_Shape, int]] | None:
    """The ``pods`` cheapest pods whose shapes serve ``per_pod_rps``, one shape per GPU
    type: GPU id -> (shape, pods); None when the types together offer fewer."""
    shapes: dict[str, _Shape] = {}
    segments: list[_Segment] = []
    for gpu, candidates in by_gpu.items():
        shape = next((s for s in candidates if s.capacity_rps >= per_pod_rps), None)
        if shape is None:
            continue
        tp = shape.plan.tp
        room = min(UNLIMITED if fit is None else fit(gpu, tp), pods)
        if room > 0:
            shapes[gpu] = shape
            segments += _segments(gpu, tp, prices[gpu], room)
    taken, left = _cheapest(segments, pods)
    if left > 0:
        return None
    return {g: (shapes[g], n) for g, n in taken.items() if n > 0}


def _cheapest(segments: list[_Segment], pods: int) -> tuple[dict[str, int], int]:
    """GPU id -> pods of the ``pods`` cheapest over ``segments`` (at equal cost, fewer
    GPUs), and how many the segments lacked."""
    taken: dict[str, int] = {}
    left = pods
    for seg in sorted(segments, key=lambda s: (s.usd, s.tp)):
        take = min(seg.pods, left)
        taken[seg.gpu] = taken.get(seg.gpu, 0) + take
        left -= take
    return taken, left


def _segments(gpu: str, tp: int, price: GpuPrice, room: int) -> list[_Segment]:
    """A type's ``room`` pods as runs of one marginal cost: wholly owned pods, the one
    that straddles the owned GPUs' end, and on-demand ones."""
    owned_pods, straddle = divmod(price.owned, tp)
    runs = [(tp * price.owned_usd, owned_pods)]
    if straddle:
        runs.append((straddle * price.owned_usd + (tp - straddle) * price.on_demand_usd, 1))
    runs.append((tp * price.on_demand_usd, room))
    segments: list[_Segment] = []
    for usd, count in runs:
        take = min(count, room)
        if take > 0:
            segments.append(_Segment(usd, tp, gpu, take))
            room -= take
    return segments


@dataclass(frozen=True)
class FleetPrice:
    """What ``n`` pods of a deployed mixed fleet cost, and on which pools they run.

    Every pod serves the same rate, so a pod's cost is its cost per request: the ``n``
    pods are the ``n`` cheapest over the pools (``_segments``: a type's owned GPUs
    first, then on demand), within each type's ``room`` (the pods its free GPUs hold,
    where counted). Growing the fleet adds its next cheapest pod and shrinking removes
    its dearest one; once a type's room is used up, growth spills onto the next type.
    Pods beyond every type's room (which the loop never decides: its inventory limit is
    ``room_total``) are priced on the type with the cheapest on-demand pod.

    Attributes:
        pools: (GPU id, what its replicas cost), in the plan's pool order.
        room: GPU id -> the most pods of its pool the free GPUs hold; absent: any number.
    """

    pools: tuple[tuple[str, ReplicaPrice], ...]
    room: Mapping[str, int] = field(default_factory=dict)

    def within(self, room: Mapping[str, int]) -> FleetPrice:
        """The same pools, each within ``room`` pods."""
        return replace(self, room=dict(room))

    @property
    def room_total(self) -> int:
        """The most pods the pools' room holds (``UNLIMITED`` where any is uncounted)."""
        return min(sum(self.room.get(g, UNLIMITED) for g, _ in self.pools), UNLIMITED)

    def split(self, pods: int) -> dict[str, int]:
        """GPU id -> pods of the ``pods`` cheapest (class docstring); every pool named."""
        segments: list[_Segment] = []
        for gpu, price in self.pools:
            room = min(self.room.get(gpu, UNLIMITED), pods)
            segments += _segments(gpu, price.tp, price.gpu, room)
        taken, left = _cheapest(segments, pods)
        counts = {gpu: taken.get(gpu, 0) for gpu, _ in self.pools}
        if left > 0:  # beyond every type's room: priced where on-demand pods cost least
            gpu, _ = min(self.pools, key=lambda item: item[1].tp * item[1].gpu.on_demand_usd)
            counts[gpu] += left
        return counts

    def usd_per_hour(self, replicas: int) -> float:
        """What ``replicas`` pods cost, USD/h, each pool priced on its own tiers."""
        counts = self.split(replicas)
        return sum(price.usd_per_hour(counts[gpu]) for gpu, price in self.pools)

    def affordable(self, budget_usd_per_hour: float, at_most: int) -> int:
        """The most pods (up to ``at_most``) the budget pays for: the cost never falls as
        pods are added, so a binary search."""
        low, high = 0, at_most
        while low < high:
            mid = (low + high + 1) // 2
            if self.usd_per_hour(mid) <= budget_usd_per_hour + 1e-9:
                low = mid
            else:
                high = mid - 1
        return low

    def describe(self, replicas: int) -> str:
        """``3 pods: 2 on a100-80gb (2 owned at $0.00/GPU-h, then $3.40/GPU-h), 1 on l4
        ($0.80/GPU-h)``."""
        counts = self.split(replicas)
        parts = ", ".join(f"{counts[g]} on {g} ({p.gpu.describe()})" for g, p in self.pools)
        return f"{replicas} pods: {parts}"


def rescaled(plan: Plan, pods: int, max_num_seqs: int, price: FleetPrice) -> Plan:
    """A mixed ``plan`` at ``pods`` pods: each pool at its share of the cheapest split
    (``FleetPrice.split``); the pool that sizes the fleet (the plan's own GPU) at
    ``max_num_seqs``, the batch cap the loop chose with its planner, the others at
    theirs."""
    counts = price.split(pods)
    prices = dict(price.pools)
    pools = tuple(
        pool.rescaled(
            counts.get(pool.gpu, 0),
            max_num_seqs if pool.gpu == plan.gpu else None,
            prices[pool.gpu].usd_per_hour(counts.get(pool.gpu, 0)) if pool.gpu in prices else None,
        )
        for pool in plan.pools
    )
    cost = sum(p.usd_per_hour for p in pools)
    return replace(plan, replicas=pods, max_num_seqs=max_num_seqs, usd_per_hour=cost, pools=pools)
