"""A mixed fleet against the single-type plan in the simulated engine.

The planner offers pools of several GPU types where they cost less than its single-type
plan (``rooftop_planner.fleet``). Here both fleets serve the same requests, held at the
planner's sizes, behind a balancer that picks a ready pod at random (a Kubernetes
Service): the share of requests within the SLO and the cost of each, per noise seed. The
engine simulator's step times are its own (measured kernel tables), not the planner's,
so the planner's claim that every pool keeps up at the even share can fail here.

The requests are the Azure LLM conversation trace's, re-timed to the target's declared
rate (arrival gaps scaled by one factor), its first ``--minutes``.

    python benchmarks/bench_mixed.py [--target examples/owned-a100s.yaml] [--seeds 0,1,2]

``--loop`` adds the operator's loop on each fleet (``rooftop simulate``'s ``rooftop``
and ``rooftop-mixed`` policies): the single-type plan's replicas, or the mix's pods grown
onto its cheapest pool, as the observed load asks.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from rooftop_api.manifest import load_target
from rooftop_api.spec import ServingTargetSpec
from rooftop_planner.bursts import dispersion, interval_counts
from rooftop_planner.catalog import Catalog, load_catalog
from rooftop_planner.inventory import GpuInventory
from rooftop_planner.plan import Plan
from rooftop_planner.pricing import GpuPrice, gpu_prices
from rooftop_planner.search import plan_target
from rooftop_sim.cluster import Cluster, ClusterConfig, RequestStream
from rooftop_sim.mixed_oracle import (
    Fits,
    Shares,
    ShareTable,
    mixed_fit,
    oracle_shapes,
    pools_usd_per_hour,
)
from rooftop_sim.policies import FixedPolicy
from rooftop_sim.report import Slo, attainment, cost
from rooftop_sim.simulate import MIXED_LOOP, replica_of, scenario, with_pools, workload_from_trace
from rooftop_sim.simulate import run as simulate_run

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "examples" / "traces" / "azure_llm_2023_conv.csv"


def retimed(stream: RequestStream, rate: float, minutes: float) -> RequestStream:
    """The trace's requests at ``rate`` req/s on average, its first ``minutes``."""
    gaps_scale = (len(stream.arrival_s) / stream.horizon_s) / rate
    arrivals = stream.arrival_s * gaps_scale
    keep = arrivals <= minutes * 60.0
    return RequestStream(
        arrivals[keep],
        stream.prompt_tokens[keep],
        stream.output_tokens[keep],
        f"{stream.name} at {rate:g} req/s",
    )


def run(
    spec: ServingTargetSpec, pools: list[Plan], stream: RequestStream, seed: int
) -> tuple[float, float, float]:
    """(share within TPOT, share within TTFT, USD/h) of a fleet held at ``pools``' sizes:
    the first pool is the policy's, the others fixed beside it."""
    first = pools[0]
    base = ClusterConfig(
        replica_of(spec.model, first),
        seed=seed,
        routing="random",
        tpot_quantile=spec.slo.tpot_percentile.quantile,
        ttft_quantile=spec.slo.ttft_percentile.quantile,
        tpot_slo_ms=spec.slo.tpot_ms,
    )
    config = with_pools(base, spec.model, [(p, p.replicas) for p in pools])
    result = Cluster(stream, config).run(FixedPolicy(first.replicas, first.max_num_seqs))
    att = attainment(result, Slo(spec.slo.tpot_ms, spec.slo.ttft_ms))
    usd_per_hour = cost(result)[1] / (stream.horizon_s / 3600.0)
    return att.tpot_requests, att.ttft_requests or float("nan"), usd_per_hour


def declaring(
    spec: ServingTargetSpec, stream: RequestStream, args: argparse.Namespace
) -> ServingTargetSpec:
    """``spec`` declaring the trace's lengths (mean and p90, or with ``--histogram`` their
    distribution) and burstiness at ``--rate``, with the owned GPUs, budget and replica
    limit the flags give."""
    declare = _histogram if args.histogram else _mean_p90
    lengths: dict[str, object] = {
        "promptTokens": declare(stream.prompt_tokens),
        "outputTokens": declare(stream.output_tokens),
    }
    doc = spec.model_dump(by_alias=True, exclude_none=True)
    # the burstiness the operator reads (15-s counts), so bursts are held as it would
    burstiness = round(max(dispersion(interval_counts(stream.arrival_s)), 1.0), 1)
    lengths["arrivalDispersion"] = burstiness
    doc["workload"] = {
        **doc["workload"],
        **lengths,
        "requestsPerSecond": args.rate or spec.workload.requests_per_second,
    }
    if args.owned == "none":
        doc.get("pricing", {}).pop("owned", None)
    elif args.owned:
        gpu, count = args.owned.split(":")
        doc["pricing"] = {"owned": {gpu: {"count": int(count)}}}
    if args.budget:
        doc["budget"] = {"usdPerHour": args.budget}
    if args.max_replicas:
        doc["constraints"] = {**doc.get("constraints", {}), "maxReplicas": args.max_replicas}
    return ServingTargetSpec.model_validate(doc)


def _histogram(tokens: np.ndarray, bins: int = 50) -> dict[str, object]:
    """``bins`` equal shares of the requests, each at its share's mean length."""
    ordered = np.sort(tokens)
    shares = np.array_split(ordered, bins)
    return {
        "histogram": [
            {"tokens": max(int(round(float(share.mean()))), 1), "weight": len(share)}
            for share in shares
            if len(share)
        ]
    }


def _mean_p90(tokens: np.ndarray) -> dict[str, object]:
    return {
        "mean": round(float(tokens.mean()), 1),
        "p90": round(float(np.quantile(tokens, 0.9)), 1),
    }


def hindsight_mix(
    spec: ServingTargetSpec,
    stream: RequestStream,
    pools: list[Plan],
    inventory: GpuInventory | None = None,
) -> list[Plan]:
    """The cheapest fixed pools of at most three of the planner's shapes (its mixed fleet's
    ``pools`` and single-type plans) that keep the SLO's percentiles on ``stream`` in
    hindsight (``rooftop_sim.mixed_oracle``), within ``inventory``'s free GPUs."""
    catalog = load_catalog()
    prices = gpu_prices(spec, catalog)
    shapes = oracle_shapes(single_type_plans(spec, catalog, inventory), prices, pools)
    base = ClusterConfig(
        replica_of(spec.model, shapes[0]),
        seed=0,
        routing="random",
        startup_s=0.0,
        tpot_quantile=spec.slo.tpot_percentile.quantile,
        ttft_quantile=spec.slo.ttft_percentile.quantile,
        tpot_slo_ms=spec.slo.tpot_ms,
    )
    table = ShareTable(stream, base, Slo(spec.slo.tpot_ms, spec.slo.ttft_ms), spec.model)
    targets = Shares(spec.slo.tpot_percentile.quantile, spec.slo.ttft_percentile.quantile)
    fits = None if inventory is None else within(inventory)
    fit = mixed_fit(shapes, prices, table, targets, spec.constraints.max_replicas, fits=fits)
    if fit is None:
        print("hindsight mix: no fleet of the planner's shapes keeps the SLO on this trace",
              file=sys.stderr)  # fmt: skip
        return []
    names = ", ".join(f"{s.gpu} TP{s.tp}" for s in shapes)
    print(f"hindsight mix of {names}: {fit.measured} pod shares simulated; "
          f"replayed (seed 0) TPOT met {fit.replayed.tpot:.3%}, TTFT met "
          f"{fit.replayed.ttft:.3%}", file=sys.stderr)  # fmt: skip
    chosen = [(shape, n) for shape, n in zip(shapes, fit.counts, strict=True) if n]
    return [shape.rescaled(n, shape.max_num_seqs, _pool_usd(chosen, i, prices))
            for i, (shape, n) in enumerate(chosen)]  # fmt: skip


def _pool_usd(chosen: list[tuple[Plan, int]], i: int, prices: Mapping[str, GpuPrice]) -> float:
    """Pool ``i``'s share of what its GPU type's pods cost together (owned GPUs go to
    the pools in order), USD/h."""
    shape, _ = chosen[i]
    before = sum(s.tp * n for s, n in chosen[:i] if s.gpu == shape.gpu)
    upto = before + shape.tp * chosen[i][1]
    price = prices[shape.gpu]
    return price.usd_per_hour(upto) - price.usd_per_hour(before)


def within(inventory: GpuInventory) -> Fits:
    """Whether ``inventory``'s free GPUs hold pods of shapes: each shape's pods on the
    nodes, and each GPU type's pods together within its free GPUs."""

    def fits(shapes: Sequence[Plan], counts: Sequence[int]) -> bool:
        gpus: dict[str, int] = {}
        for shape, n in zip(shapes, counts, strict=True):
            if n > inventory.replicas_fit(shape.gpu, shape.tp):
                return False
            gpus[shape.gpu] = gpus.get(shape.gpu, 0) + n * shape.tp
        return all(n <= inventory.free_gpus(gpu) for gpu, n in gpus.items())

    return fits


def parse_inventory(text: str) -> GpuInventory:
    """``GPU:NODESxGPUS,...`` (``h100-sxm:1x8,l40s:2x4``): that many nodes of each type,
    every GPU free."""
    free: dict[str, tuple[int, ...]] = {}
    for item in text.split(","):
        gpu, shape = item.split(":")
        nodes, gpus = (int(x) for x in shape.split("x"))
        free[gpu] = (gpus,) * nodes
    biggest = {gpu: max(sizes) for gpu, sizes in free.items()}
    return GpuInventory(gpus_per_node=biggest, free=free, nodes=sum(map(len, free.values())))


def single_type_plans(
    spec: ServingTargetSpec, catalog: Catalog, inventory: GpuInventory | None = None
) -> list[Plan]:
    """The planner's plan on each GPU type the target may use alone (those with one),
    within ``inventory``'s free GPUs."""
    allowed = spec.constraints.gpu_types or sorted(catalog.gpus)
    plans = []
    for gpu in allowed:
        constraints = spec.constraints.model_copy(update={"gpu_types": [gpu]})
        alone = spec.model_copy(update={"constraints": constraints})
        plan = plan_target(alone, gpu_inventory=inventory).plan
        if plan is not None:
            plans.append(plan)
    return plans


def priced(spec: ServingTargetSpec, pools: list[Plan]) -> float:
    """USD/h of the pools: each GPU type's GPUs priced together (owned ones first)."""
    prices = gpu_prices(spec, load_catalog())
    return pools_usd_per_hour(((pool, pool.replicas) for pool in pools), prices)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default=str(ROOT / "examples" / "owned-a100s.yaml"))
    parser.add_argument("--trace", default=str(TRACE))
    parser.add_argument("--rate", type=float, default=0.0, help="req/s (default: the target's)")
    parser.add_argument(
        "--owned", default="", help="GPU:COUNT owned at $0, or none (default: the target's)"
    )
    parser.add_argument("--budget", type=float, default=0.0)
    parser.add_argument("--max-replicas", type=int, default=0)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument(
        "--oracle", action="store_true", help="add the hindsight fleet allowed to mix"
    )
    parser.add_argument(
        "--histogram",
        action="store_true",
        help="declare the trace's length distributions, not their mean and p90",
    )
    parser.add_argument("--loop", action="store_true", help="add the operator's loop on each fleet")
    parser.add_argument(
        "--inventory",
        default="",
        help="GPU:NODESxGPUS,... the cluster's nodes (every GPU free); default: any number",
    )
    args = parser.parse_args(argv)
    spec = load_target(args.target).spec
    rate = args.rate or spec.workload.requests_per_second
    stream = retimed(workload_from_trace(args.trace), rate, args.minutes)
    spec = declaring(spec, stream, args)
    inventory = parse_inventory(args.inventory) if args.inventory else None
    result = plan_target(spec, gpu_inventory=inventory)
    fleets: dict[str, list[Plan]] = {}
    if result.plan is not None:
        fleets["single type"] = [result.plan]
    if result.mixed is not None:
        fleets["mixed"] = [p.plan for p in result.mixed.pools]
    if not fleets:
        print(f"{args.target}: no plan: {result.reasons[0]}", file=sys.stderr)
        return 1
    if result.mixed is None:
        print(f"{args.target}: the planner offers no mixed fleet", file=sys.stderr)
    if args.oracle:
        hindsight = hindsight_mix(spec, stream, fleets.get("mixed", []), inventory)
        fleets.update({"hindsight mix": hindsight} if hindsight else {})
    print(f"{Path(args.trace).name}: {len(stream.arrival_s)} requests over "
          f"{stream.horizon_s / 60:.1f} min at {rate:g} req/s; {spec.model}, SLO "
          f"{spec.slo.tpot_percentile.value} TPOT <= {spec.slo.tpot_ms:g} ms")  # fmt: skip
    print("| fleet | pods | planned $/h | seed | TPOT met | TTFT met | simulated $/h |")
    print("|---|---|---|---|---|---|---|")
    for name, pools in fleets.items():
        pods = " + ".join(f"{p.replicas}x {p.gpu} TP{p.tp} (cap {p.max_num_seqs})" for p in pools)
        planned = priced(spec, pools)
        for seed in (int(s) for s in args.seeds.split(",")):
            tpot, ttft, usd = run(spec, pools, stream, seed)
            print(f"| {name} | {pods} | {planned:.2f} | {seed} | {tpot:.3%} | {ttft:.3%} | "
                  f"{usd:.2f} |")  # fmt: skip
    if args.loop:
        looped(spec, stream, [int(s) for s in args.seeds.split(",")], result.mixed is not None)
    return 0


def looped(spec: ServingTargetSpec, stream: RequestStream, seeds: list[int], mix: bool) -> None:
    """The operator's loop on the single-type plan and, where there is one, on the mix:
    one row per policy and seed."""
    print("\n| loop on | seed | TPOT met | TTFT met | simulated $/h | mean pods |")
    print("|---|---|---|---|---|---|")
    hours = stream.horizon_s / 3600.0
    for seed in seeds:
        scn = scenario(spec, stream, seed=seed, routing="random")
        for name in ("rooftop", *((MIXED_LOOP,) if mix else ())):
            _, out = simulate_run(scn, name)
            fleet = "the mix" if name == MIXED_LOOP else "the single type"
            print(f"| {fleet} | {seed} | {out['slo_attainment_tpot']:.3%} | "
                  f"{out['slo_attainment_ttft']:.3%} | {out['usd'] / hours:.2f} | "
                  f"{out['mean_replicas']:.2f} |")  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
