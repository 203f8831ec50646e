"""Does a second day help? Issue 5's two rooftop targets on day 2 of the day-shaped
trace, for a controller that carries what it learned on day 1.

    .venv/bin/python benchmarks/bench_warm.py [--reality 0.7,1.0,1.3] [--seeds 0,1,2]
        [--jobs 2]

The operator keeps its step-time factor and latency trim in the ServingTarget's status,
so a fleet that has run for a day starts the next one with them. Here each seed replays
the diurnal trace cold (day 1, exactly ``bench_targets.py``'s ``default`` row), then
again with the factor and trim it ended at (``simulate.Prior``: a settled factor and a
trim that keeps learning with the shipped gains) and fresh noise (seed + 100). The
warped day starts and ends at its trough, so day 2 picks up where day 1 stopped. Each
day's cost is divided by the oracle of its own noise seed, as in ``bench_simulate.py``.

If one trim fitted the whole day, day 2 would meet the targets the cold day misses. It
does not when the trim a day ends at (learned at the trough, one pod, fast steps) is
lower than the peak needs: the planner's capacity error changes with load
(docs/benchmarks.md), and one integral trim remembers only the latest load.
"""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_simulate  # noqa: E402  (sibling scripts, not a package)
import bench_targets  # noqa: E402

NEXT_DAY_SEED = 100  # day 2's noise seed offset: the same trace, other step-time noise
Job = tuple[float, int, bool]  # reality, seed, oracle? (the oracle's seed: day 2 + 100)
Result = tuple[Job, list[tuple[float, float, float]]]  # per day: attainment, USD, trim


def run_job(job: Job) -> Result:
    """One noise seed's oracle, or one seed's two days of rooftop."""
    from rooftop_sim import simulate
    from rooftop_sim.cluster import Cluster
    from rooftop_sim.policies import RooftopPolicy
    from rooftop_sim.report import summary as summarize

    reality, seed, oracle = job
    spec = bench_simulate.load_spec(None)
    workload = simulate.workload_from_trace(str(bench_simulate.DEFAULT_TRACE), True)
    scn = simulate.scenario(spec, workload, reality_factor=reality, seed=seed)
    if oracle:
        _, summary = simulate.run(scn, "oracle")
        return job, [(summary["slo_attainment_tpot"], summary["usd"], float("nan"))]
    prior, days = simulate.Prior(), []
    for day in range(2):
        day_scn = simulate.scenario(spec, workload, reality_factor=reality,
                                    seed=seed + day * NEXT_DAY_SEED)  # fmt: skip
        policy, _ = simulate.make_policy(day_scn, "rooftop", prior=prior)
        assert isinstance(policy, RooftopPolicy)
        res = Cluster(day_scn.workload, day_scn.sim).run(policy)
        summary = summarize(res, day_scn.slo, reality)
        state = policy.state
        days.append((summary["slo_attainment_tpot"], summary["usd"], state.trim))
        prior = simulate.Prior(factor=state.calibration.factor, trim=state.trim)
    return job, days


def table(results: list[Result], realities: list[float]) -> str:
    """Markdown: per reality factor, each day's worst TPOT share and mean cost against
    that day's seed's oracle, with the trims the seeds ended day 1 at."""
    oracle = {job[:2]: days[0][1] for job, days in results if job[2]}
    lines = ["| reality | day 1 trims end | day 1: worst TPOT / x oracle | day 2 | targets met "
             "(day 1, day 2) |", "|---|---|---|---|---|"]  # fmt: skip
    for reality in realities:
        runs = [(job[1], days) for job, days in results if job[0] == reality and not job[2]]
        cells, met = [], []
        for day in range(2):
            bases = [oracle[(reality, seed + day * NEXT_DAY_SEED)] for seed, _ in runs]
            text, n = bench_targets.cell([d[day][0] for _, d in runs],
                                         [d[day][1] for _, d in runs], bases)  # fmt: skip
            cells.append(text)
            met.append(f"{n} of 2")
        trims = ", ".join(f"{d[0][2]:.2f}" for _, d in runs)
        lines.append(f"| {reality:g} | {trims} | {cells[0]} | {cells[1]} | {', '.join(met)} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    bench_targets.add_run_arguments(ap)
    args = ap.parse_args(argv)
    realities, seeds = bench_targets.realities_and_seeds(args)
    jobs: list[Job] = [(r, s + day * NEXT_DAY_SEED, True) for r in realities for s in seeds
                       for day in range(2)]  # fmt: skip
    jobs += [(r, s, False) for r in realities for s in seeds]
    started = time.perf_counter()
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        results = bench_simulate.map_reporting(pool, run_job, jobs, "bench_warm")
    print(table(results, realities))
    print(f"{len(jobs)} jobs ({len(realities) * 4 * len(seeds)} replays) in "
          f"{time.perf_counter() - started:.0f} s.")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
