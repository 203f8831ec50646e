"""How far the planner's per-replica capacity is from the simulated engine's, by SLO share.

    .venv/bin/python benchmarks/bench_capacity.py [--target YAML] [--trace CSV]
        [--reality 0.7,1.0,1.3] [--shares 0.9,0.99] [--fleet 5]

For ``bench_simulate.py``'s target and trace, at each reality factor:

- ``planner``: the requests/s one replica serves within the TPOT SLO's percentile, as
  ``PlanTargetPlanner.size`` states it at the step-time factor a perfectly calibrated
  loop would learn (``simulate.true_factor``: truth over planner mean step time at half
  the batch cap, times the reality factor), before the 1.2 rate headroom;
- ``measured @ s``: the highest Poisson rate per replica at which a fleet of ``--fleet``
  simulated replicas (the same truth model as ``rooftop simulate``, the trace's own
  prompt and output lengths, no start-up) keeps the share ``s`` of requests within the
  TPOT bound (``sim.oracle.measure_capacity``, the oracle's own capacity probe).

The ratio measured / planner is what the closed loop's latency trim has to make up
online. A ratio that moves with the reality factor means the planner's capacity has
the wrong slope in step time, not only the wrong level; see docs/benchmarks.md.

``--percentiles`` adds a second table on why: the probe fleet run at the planner's
capacity, the rate at which the planner predicts the SLO's TPOT percentile reaches the
bound (4,000 Poisson requests), with the engine's per-request TPOT mean, p90 and p99
there, and the extra step time one mean-length prompt adds (chunked prefill, batch 8)
in the planner's model and in the simulated engine's truth model, both at their
factors. The planner's percentile is its mean step plus the batch's Poisson spread
only, so where the engine's p99 stands above its mean, and where a prompt costs the
planner more than the engine, the trim has to make up the difference.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_simulate as bench  # noqa: E402  (a sibling script, not a package)


def sized(spec: Any, workload: Any, reality: float) -> tuple[Any, float, Any]:
    """The scenario, the factor a calibrated loop learns, and the planner's sizing there."""
    from rooftop_sim import simulate

    scn = simulate.scenario(spec, workload, reality_factor=reality)
    factor = simulate.true_factor(scn, scn.plan.max_num_seqs / 2)
    return scn, factor, scn.planner.size(len(workload.arrival_s) / workload.horizon_s, factor)


def row(spec: Any, workload: Any, reality: float, shares: list[float], fleet: int) -> str:
    """One markdown row: reality, learned factor, planner capacity, measured ones."""
    from rooftop_sim.oracle import OracleConfig, measure_capacity

    scn, factor, size = sized(spec, workload, reality)
    planned = float(size.capacity_rps or 0.0)
    cells = [f"{reality:g}", f"{factor:.2f}", f"{size.max_num_seqs}", f"{planned:.2f}"]
    for share in shares:
        cfg = OracleConfig(tpot_share=share, ttft_share=0.0)
        got = measure_capacity(workload, scn.sim, scn.slo, size.max_num_seqs, fleet,
                               planned, cfg)  # fmt: skip
        cells.append(f"{got:.2f} ({got / planned:.2f}x)")
    return "| " + " | ".join(cells) + " |"


def percentile_row(spec: Any, workload: Any, reality: float, fleet: int) -> str:
    """One markdown row: sim TPOT mean/p90/p99 at the planner's capacity; prefill cost."""
    from dataclasses import replace

    import numpy as np

    from rooftop_sim.cluster import Cluster
    from rooftop_sim.engine.truth import TruthModel
    from rooftop_sim.oracle import probe_workload
    from rooftop_sim.policies import FixedPolicy

    scn, factor, size = sized(spec, workload, reality)
    per_replica = float(size.capacity_rps or 0.0)
    probe, _, _ = probe_workload(workload, per_replica * fleet, 4000, seed=7)
    sim = replace(scn.sim, startup_s=0.0, outages=())
    res = Cluster(probe, sim).run(FixedPolicy(fleet, size.max_num_seqs, "probe"))
    tpot_ms = res.tpot_s[400:] * 1e3  # the first tenth is the warm-up
    tpot_ms = tpot_ms[np.isfinite(tpot_ms)]
    mean, p90, p99 = tpot_ms.mean(), np.quantile(tpot_ms, 0.9), np.quantile(tpot_ms, 0.99)
    r = scn.sim.replica
    truth = TruthModel.for_deployment(r.model, r.gpu, r.tp, r.weight_dtype, r.kv_dtype)
    isl, osl = float(np.mean(workload.prompt_tokens)), float(np.mean(workload.output_tokens))
    batch = 8
    context = int(batch * (isl + osl / 2))
    truth_ms = (truth.step_s(batch, context, int(isl), isl * isl / 2)
                - truth.step_s(batch, context, 0, 0)) * 1e3 * reality  # fmt: skip
    planner_ms = _planner_prefill_extra_ms(scn, batch, isl, osl) * factor
    cells = [f"{reality:g}", f"{per_replica:.2f}", f"{mean:.0f} / {p90:.0f} / {p99:.0f}",
             f"{planner_ms:.0f} / {truth_ms:.0f}"]  # fmt: skip
    return "| " + " | ".join(cells) + " |"


def _planner_prefill_extra_ms(scn: Any, batch: int, isl: float, osl: float) -> float:
    """The planner's extra step time (ms, unscaled) of one ``isl``-token prompt chunk."""
    from rooftop_planner import perf

    dep = scn.planner.deployment  # the plan's own deployment, at the prior efficiency
    context = batch * (isl + osl / 2)
    with_prompt = perf.forward_time_s(dep, batch, context, isl, isl * isl / 2)
    return (with_prompt - perf.forward_time_s(dep, batch, context)) * 1e3


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", help="ServingTarget YAML (default: bench_simulate's)")
    ap.add_argument("--trace", default=str(bench.DEFAULT_TRACE))
    ap.add_argument("--reality", default="0.7,1.0,1.3", help="comma-separated factors")
    ap.add_argument("--shares", default="0.9,0.99", help="TPOT shares to measure at")
    ap.add_argument("--fleet", type=int, default=5, help="replicas in the probe fleet")
    ap.add_argument("--percentiles", action="store_true",
                    help="also: engine TPOT mean/p90/p99 at the planner's capacity")  # fmt: skip
    args = ap.parse_args(argv)
    if not Path(args.trace).exists():
        print(f"bench_capacity: trace {args.trace} not found (use --trace)", file=sys.stderr)
        return 2
    shares = [float(s) for s in args.shares.split(",") if s.strip()]
    started = time.perf_counter()
    head = ["reality", "learned factor", "cap", "planner req/s/replica"]
    head += [f"measured @ {s:.0%} within TPOT" for s in shares]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    from rooftop_sim import simulate

    spec = bench.load_spec(args.target)
    workload = simulate.workload_from_trace(args.trace, diurnal=True)
    realities = [float(r) for r in args.reality.split(",")]
    lines += [row(spec, workload, r, shares, args.fleet) for r in realities]
    if args.percentiles:
        q = spec.slo.tpot_percentile.value
        head = ["reality", "planner req/s/replica",
                f"engine TPOT mean / p90 / p99 at that rate, ms (planner: {q} = SLO)",
                "one mean prompt adds, ms: planner / engine"]  # fmt: skip
        lines += ["", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += [percentile_row(spec, workload, r, args.fleet) for r in realities]
    lines.append(f"\n{time.perf_counter() - started:.0f} s.")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
