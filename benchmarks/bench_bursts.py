"""How bursty the bundled Azure traces arrive, and what requests in a burst get.

    .venv/bin/python benchmarks/bench_bursts.py [--seed 0] [--out benchmarks/bursts_table.md]
        [--write-docs]

First table: each trace (as recorded, and re-timed into ``bench_unseen``'s days) by its
burstiness as the operator reads it (``rooftop_planner.bursts.dispersion`` of the 15-s
counts, median over 15-minute ranges), the plain variance over mean of the same counts
(which a day's drift inflates), and the share of requests arriving into 15-s intervals
that run above twice the trace's mean rate.

Second table: fixed fleets of 3 to 6 replicas of ``bench_unseen``'s code-day target in
the simulated engine, each request binned by the rate of the 15-s interval it arrived
into, against the fleet's capacity C (replicas x the planner's requests/s per replica
for Poisson arrivals): the share of the bin's requests within the TPOT bound, beside
C/r, the share an interval above capacity could serve at most. The planner's rule
(``bursts.burst_rate``) counts every request above capacity as missed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_simulate  # noqa: E402  (sibling scripts, not a package)
import bench_unseen  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
START, END = "<!-- bursts-table:start -->", "<!-- bursts-table:end -->"
RANGE_INTERVALS = 60  # 15 minutes of 15-s intervals
CODE_DAY = "code, 2:1 peak at 70 %"
FLEETS = (3, 4, 5, 6)
BINS = ((0.0, 0.5), (0.5, 1.0), (1.0, 1.5), (1.5, 2.0), (2.0, 3.0))


def trace_row(name: str, arrival_s: Any) -> tuple[str, float, float, float]:
    """(name, burstiness, plain variance over mean, share above twice the mean rate)."""
    from rooftop_planner.bursts import BURST_INTERVAL_S, dispersion, interval_counts

    counts = interval_counts(arrival_s).astype(float)
    ranges = [counts[i : i + RANGE_INTERVALS] for i in range(0, counts.size - RANGE_INTERVALS, 20)]
    burst = float(np.median([dispersion(r) for r in ranges]))
    plain = float(np.median([r.var() / r.mean() for r in ranges]))
    per_request = counts[(np.asarray(arrival_s) // BURST_INTERVAL_S).astype(int)]
    share = float(np.mean(per_request > 2.0 * counts.mean()))
    return name, burst, plain, share


def traces_table() -> list[str]:
    from rooftop_sim import simulate

    lines = [
        "| trace | burstiness (15 s) | plain variance / mean | requests above 2x the mean rate |",
        "|---|---|---|---|",
    ]
    days = [
        (trace, simulate.workload_from_trace(str(bench_unseen.TRACES / trace)).arrival_s)
        for trace in ("azure_llm_2023_conv.csv", "azure_llm_2023_code.csv")
    ]
    days += [
        (f"{bench_unseen.SHAPES[shape][0]}, {shape}", bench_unseen.day(shape).arrival_s)
        for shape in bench_unseen.SHAPES
    ]
    row = "| {} | {:.1f} | {:.1f} | {:.0%} |"
    return lines + [row.format(*trace_row(name, arrival)) for name, arrival in days]


def fleets_table(seed: int) -> list[str]:
    from rooftop_planner.bursts import BURST_INTERVAL_S
    from rooftop_sim import simulate
    from rooftop_sim.cluster import Cluster
    from rooftop_sim.policies import FixedPolicy

    spec = bench_unseen.spec_for(CODE_DAY)
    stream = bench_unseen.day(CODE_DAY)
    scn = simulate.scenario(spec, stream, reality_factor=1.0, seed=seed)
    poisson = scn.planner.size(spec.workload.requests_per_second, 1.0)
    per_replica = poisson.capacity_rps or 0.0
    arrival = stream.arrival_s
    index = (arrival // BURST_INTERVAL_S).astype(int)
    rate = np.bincount(index)[index] / BURST_INTERVAL_S
    header = " | ".join(f"r in {lo:g}-{hi:g} C" for lo, hi in BINS)
    lines = [
        f"| replicas | C (req/s) | within TPOT | {header} |",
        "|---|---|---|" + "---|" * len(BINS),
    ]
    for fleet in FLEETS:
        capacity = fleet * per_replica
        res = Cluster(scn.workload, scn.sim).run(FixedPolicy(fleet, poisson.max_num_seqs))
        met = res.tpot_s * 1e3 <= spec.slo.tpot_ms
        cells = []
        for lo, hi in BINS:
            inside = (rate >= lo * capacity) & (rate < hi * capacity)
            if not inside.any():
                cells.append("-")
                continue
            bound = float(np.mean(np.minimum(1.0, capacity / rate[inside])))
            share, within = inside.mean(), np.nanmean(met[inside])
            cells.append(f"{share:.0%} of requests: {within:.2f} (C/r {bound:.2f})")
        row = f"| {fleet} | {capacity:.1f} | {np.nanmean(met):.1%} | "
        lines.append(row + " | ".join(cells) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "bursts_table.md"))
    ap.add_argument("--write-docs", action="store_true")
    args = ap.parse_args(argv)
    command = "python benchmarks/bench_bursts.py " + " ".join(argv or sys.argv[1:])
    text = "\n".join(
        [f"Command: `{command.strip()}`", "", *traces_table(), "", *fleets_table(args.seed)]
    )
    Path(args.out).write_text(text + "\n")
    if args.write_docs:
        bench_simulate.splice(ROOT / "docs" / "benchmarks.md", text + "\n", START, END)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
