"""Where in the trace rooftop misses TPOT that the hindsight oracle does not: misses and
ready pods per two-minute bin of arrivals, both policies side by side.

    .venv/bin/python benchmarks/misses_by_minute.py [--reality 1.3] [--seed 1]
        [--recorded] [--bin-s 120]

``bench_simulate.py``'s target and trace (day-shaped unless ``--recorded``); the oracle
is searched for the same seed (about 40 s).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_simulate  # noqa: E402  (a sibling script, not a package)


def ready_at(timeline: list, t_s: float) -> int:
    """Ready pods at the last scrape at or before ``t_s``."""
    ready = 0
    for tick in timeline:
        if tick.t_s > t_s:
            break
        ready = tick.ready
    return ready


def main(argv: list[str] | None = None) -> int:
    from rooftop_sim import simulate

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reality", type=float, default=1.3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--recorded", action="store_true", help="the trace as recorded")
    ap.add_argument("--bin-s", type=float, default=120.0)
    args = ap.parse_args(argv)
    spec = bench_simulate.load_spec(None)
    workload = simulate.workload_from_trace(str(bench_simulate.DEFAULT_TRACE), not args.recorded)
    scn = simulate.scenario(spec, workload, reality_factor=args.reality, seed=args.seed)
    bins = (workload.arrival_s // args.bin_s).astype(int)
    runs = {name: simulate.run(scn, name)[0] for name in ("rooftop", "oracle")}
    missed = {n: np.bincount(bins, weights=~(r.tpot_s <= scn.slo.tpot_ms / 1e3))
              for n, r in runs.items()}  # fmt: skip
    print("| minute | requests | rooftop misses | ready | oracle misses | ready |")
    print("|---|---|---|---|---|---|")
    for i, n in enumerate(np.bincount(bins)):
        mid = (i + 0.5) * args.bin_s
        print(f"| {i * args.bin_s / 60:g} | {n} | {missed['rooftop'][i]:.0f} | "
              f"{ready_at(runs['rooftop'].timeline, mid)} | {missed['oracle'][i]:.0f} | "
              f"{ready_at(runs['oracle'].timeline, mid)} |")  # fmt: skip
    totals = {name: int(m.sum()) for name, m in missed.items()}
    print(f"\nmisses: rooftop {totals['rooftop']}, oracle {totals['oracle']} "
          f"of {len(workload.arrival_s)} requests")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
