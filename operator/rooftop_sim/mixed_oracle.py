"""The hindsight fleet allowed to mix GPU types: the cheapest fixed pools that keep
the SLO's percentiles on this very trace, as a cost bound for mixed fleets.

Behind a Service that picks a ready pod at random, each of ``N`` pods gets each request
with probability ``1/N`` whatever its pool, and the pods of a fixed fleet never
interact. So the share of a mix's requests within a bound is, in expectation, the
average over its pods:

    A(n) = Σ_s n_s · a_s(N) / N,        N = Σ_s n_s

where ``a_s(N)`` is the share within the bound of the requests a pod of shape ``s``
serves when it gets ``1/N`` of the trace. ``a_s(N)`` is measured once per shape and
``N`` by simulating ``m = min(N, 4)`` such pods behind the same random balancer on a
random ``m/N`` of the trace's requests (the whole trace for ``N ≤ 4``), so measuring
costs at most four pods' share whatever ``N``. A mix meets the SLO where ``A`` reaches
the SLO's percentile for TPOT and for TTFT: unlike the planner's mixes, a pool may miss
on its own where the other over-achieves, since the SLO is a percentile over all
requests.

The search covers every set of at most three shapes, every ``N`` up to the first at
which every shape meets the SLO alone (from there any ``N`` pods meet it, and more pods
never cost less), and every split of ``N`` among the set: ``O(S³ N³)`` sums over
measured shares, a third of a second for 6 shapes and 32 pods. ``A`` is an expectation over
the balancer's picks, and a replay is one draw, so the candidates are replayed on the
whole trace, cheapest first, and the first whose replay meets the SLO is the answer.
Cost is what the spec's pricing charges for each GPU type's GPUs (owned ones first).

The shapes are the planner's (GPU type, TP, dtypes and batch cap as the planner chose
them; the oracle chooses only the counts), so the bound says what hindsight about the
traffic buys, not what a better shape would: the pools of the planner's mixed fleet,
and its single-type plans of each GPU type the target owns GPUs of and of the
``KEPT_TYPES`` others that cost least per request at on-demand prices by the planner's
capacity estimate (every catalog type would cost minutes of simulation per type for
types that never enter a cheap mix). Shapes of one GPU type share its owned GPUs.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from rooftop_planner.plan import Plan
from rooftop_planner.pricing import GpuPrice
from rooftop_sim.cluster import Cluster, ClusterConfig, RequestStream, SimResult
from rooftop_sim.policies import FixedPolicy
from rooftop_sim.report import Slo, attainment
from rooftop_sim.simulate import with_pools

# Pods simulated per measured share: beyond four, a pod's share of a random balancer's
# requests is measured on a thinned trace rather than on N pods.
PODS_MEASURED = 4
# GPU types without owned GPUs the oracle mixes from: the cheapest per request.
KEPT_TYPES = 3
# The most shapes one fleet mixes.
MOST_SHAPES = 3

# Whether the cluster's free GPUs hold these pods of these shapes.
Fits = Callable[[Sequence[Plan], Sequence[int]], bool]


@dataclass(frozen=True)
class Shares:
    """Shares 0..1 of a pod's requests within the TPOT and TTFT bounds (TTFT 1.0 where
    the SLO has none)."""

    tpot: float
    ttft: float


@dataclass(frozen=True)
class MixedFit:
    """The cheapest mix found.

    Attributes:
        counts: pods per shape, in the order the shapes were given (zeros included).
        usd_per_hour: what those pods cost, USD/h.
        replayed: the shares of its requests within the bounds, replayed.
        measured: how many shape and fleet-size shares were simulated.
    """

    counts: tuple[int, ...]
    usd_per_hour: float
    replayed: Shares
    measured: int


@dataclass
class ShareTable:
    """``a_s(N)``, measured on demand and kept (module docstring)."""

    stream: RequestStream
    base: ClusterConfig
    slo: Slo
    model: str
    seed: int = 7
    measured: dict[tuple[int, int], Shares] = field(default_factory=dict)

    def share(self, shapes: Sequence[Plan], s: int, n: int) -> Shares:
        """The shares of a pod of ``shapes[s]`` that gets ``1/n`` of the requests."""
        if (s, n) not in self.measured:
            self.measured[s, n] = self._simulate(shapes[s], n)
        return self.measured[s, n]

    def _simulate(self, shape: Plan, n: int) -> Shares:
        pods = min(n, PODS_MEASURED)
        stream = thinned(self.stream, pods / n, self.seed + n)
        config = with_pools(self.base, self.model, [(shape, pods)])
        result = Cluster(stream, config).run(FixedPolicy(pods, shape.max_num_seqs, "probe"))
        return _shares(result, self.slo)


def oracle_shapes(
    singles: Iterable[Plan], prices: Mapping[str, GpuPrice], pools: Iterable[Plan] = ()
) -> list[Plan]:
    """The shapes the oracle mixes (module docstring): the mixed fleet's ``pools``, the
    single-type plans of GPU types with owned GPUs, then the ``KEPT_TYPES`` others
    cheapest per request/s at on-demand prices (``tp · p_demand / c`` USD/h per req/s,
    ``c`` one pod's capacity, req/s); each shape once."""
    singles = list(singles)
    owned = [p for p in singles if prices[p.gpu].owned]
    others = sorted(
        (p for p in singles if not prices[p.gpu].owned),
        key=lambda p: p.tp * prices[p.gpu].on_demand_usd * p.replicas / max(p.capacity_rps, 1e-9),
    )
    shapes: dict[tuple[object, ...], Plan] = {}
    for plan in [*pools, *owned, *others[:KEPT_TYPES]]:
        shapes.setdefault(_shape(plan), plan)
    return list(shapes.values())


def _shape(plan: Plan) -> tuple[object, ...]:
    """What a pod of ``plan`` runs, whatever the replica count."""
    pod = (plan.weight_dtype, plan.kv_dtype, plan.max_num_seqs, plan.max_num_batched_tokens)
    return (plan.gpu, plan.tp, *pod, plan.max_model_len)


def thinned(stream: RequestStream, keep: float, seed: int) -> RequestStream:
    """Each request kept with probability ``keep`` (what ``keep·N`` of ``N`` pods behind
    a random balancer get), its arrival time unchanged."""
    if keep >= 1.0:
        return stream
    mask = np.random.default_rng(seed).random(len(stream.arrival_s)) < keep
    return RequestStream(
        stream.arrival_s[mask],
        stream.prompt_tokens[mask],
        stream.output_tokens[mask],
        f"{stream.name}, {keep:.0%} of it",
    )


def mixed_fit(
    shapes: Sequence[Plan],
    prices: Mapping[str, GpuPrice],
    table: ShareTable,
    targets: Shares,
    max_replicas: int,
    tries: int = 6,
    fits: Fits | None = None,
) -> MixedFit | None:
    """The cheapest counts of ``shapes`` (at most ``MOST_SHAPES`` of them used, at most
    ``max_replicas`` pods) whose expected shares reach ``targets`` and whose replay on
    the whole trace (``replay``) does too: candidates are replayed cheapest first (at
    equal cost, the higher expected TPOT share first), at most ``tries`` of them, since
    ``A`` is an expectation over the balancer's picks and one replay is one draw.
    ``fits``: whether the cluster's free GPUs hold those counts (None: any counts). None
    where no candidate passes."""
    found = _candidates(shapes, prices, table, targets, max_replicas, fits)
    for candidate in sorted(found)[:tries]:
        usd, _, counts = candidate
        shares = replay(shapes, counts, table)
        if _meets(shares, targets):
            return MixedFit(counts, usd, shares, len(table.measured))
    return None


def _candidates(
    shapes: Sequence[Plan],
    prices: Mapping[str, GpuPrice],
    table: ShareTable,
    targets: Shares,
    max_replicas: int,
    fits: Fits | None = None,
) -> list[tuple[float, float, tuple[int, ...]]]:
    """(USD/h, minus the expected TPOT share, counts) of every split the free GPUs hold
    (``fits``) whose expected shares reach ``targets``."""
    found = []
    for n in range(1, max_replicas + 1):
        shares = [table.share(shapes, s, n) for s in range(len(shapes))]
        for counts in _splits(len(shapes), n):
            if fits is not None and not fits(shapes, counts):
                continue
            expected = _expected(counts, shares)
            if _meets(expected, targets):
                usd = pools_usd_per_hour(zip(shapes, counts, strict=True), prices)
                found.append((usd, -expected.tpot, counts))
        if all(_meets(share, targets) for share in shares):
            break  # every shape meets alone: more pods never cost less
    return found


def replay(shapes: Sequence[Plan], counts: Sequence[int], table: ShareTable) -> Shares:
    """The shares of the mix's requests within the bounds, every pod of it serving the
    whole trace behind the random balancer (the first pool's pods as the policy's, the
    others as fixed pools beside them)."""
    pools = [(shape, n) for shape, n in zip(shapes, counts, strict=True) if n]
    first, pods = pools[0]
    config = with_pools(table.base, table.model, pools)
    result = Cluster(table.stream, config).run(FixedPolicy(pods, first.max_num_seqs, "mix"))
    return _shares(result, table.slo)


def _shares(result: SimResult, slo: Slo) -> Shares:
    """The shares of a run's requests within the bounds."""
    att = attainment(result, slo)
    return Shares(att.tpot_requests, 1.0 if att.ttft_requests is None else att.ttft_requests)


def _splits(shapes: int, n: int) -> Iterable[tuple[int, ...]]:
    """Every way to give ``n`` pods to at most ``MOST_SHAPES`` of the shapes, each of
    those at least one."""
    for used in range(1, min(MOST_SHAPES, shapes, n) + 1):
        for chosen in itertools.combinations(range(shapes), used):
            for cuts in itertools.combinations(range(1, n), used - 1):
                sizes = [b - a for a, b in zip((0, *cuts), (*cuts, n), strict=True)]
                counts = [0] * shapes
                for s, size in zip(chosen, sizes, strict=True):
                    counts[s] = size
                yield tuple(counts)


def _expected(counts: Sequence[int], shares: Sequence[Shares]) -> Shares:
    """``A(n)``: the pods' shares averaged, each pod weighted alike."""
    n = sum(counts)
    tpot = sum(c * share.tpot for c, share in zip(counts, shares, strict=True)) / n
    ttft = sum(c * share.ttft for c, share in zip(counts, shares, strict=True)) / n
    return Shares(tpot, ttft)


def _meets(shares: Shares, targets: Shares) -> bool:
    return shares.tpot >= targets.tpot and shares.ttft >= targets.ttft


def pools_usd_per_hour(pools: Iterable[tuple[Plan, int]], prices: Mapping[str, GpuPrice]) -> float:
    """USD/h of pools of ``(plan, pods)``: each GPU type's GPUs priced together (owned
    ones first)."""
    gpus: dict[str, int] = {}
    for shape, pods in pools:
        gpus[shape.gpu] = gpus.get(shape.gpu, 0) + pods * shape.tp
    return math.fsum(prices[gpu].usd_per_hour(n) for gpu, n in gpus.items() if n)
