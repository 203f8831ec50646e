"""What a right prior would buy: issue 5's two rooftop targets when the controller
starts out knowing what it otherwise has to learn during the run.

    .venv/bin/python benchmarks/bench_prior.py [--reality 0.7,1.0,1.3] [--seeds 0,1,2]
        [--jobs 2]

The shipped controller starts cold (step-time factor 1, latency trim 1) and learns both
online; ``bench_targets.py`` shows that no tuning of that learning meets both targets.
Here it starts with the step-time factor a perfectly calibrated controller would hold
(``simulate.true_factor``, as a settled estimate that later windows still move) and a
latency trim frozen at a chosen value (its gains are 1e-9: ``TrimConfig`` refuses 0),
sized from the first five minutes with both (``simulate.Prior``). Everything else is
the operator's loop: forecast, scale-down window, reactive breaches. So this is the
loop as it would run if the planner's capacity were right from the first minute.

For each reality factor the script bisects a grid of trims (0.5 to 2.0 in 2.5 % steps)
for the smallest trim that keeps >= 99 % of requests within the TPOT bound on every
seed (attainment rises with the trim), and prints its cost against each seed's own
oracle (mean over seeds, as ``bench_simulate.py``), next to the largest trim found to
miss.
Where even that trim costs more than 1.15x the oracle, a right capacity estimate alone
would not meet the targets: what is left is how the loop follows the trace.
"""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import Executor, ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_simulate  # noqa: E402  (sibling scripts, not a package)
import bench_targets  # noqa: E402

from rooftop_planner.progress import Progress  # noqa: E402

TRIMS = tuple(0.5 * 1.025**k for k in range(57))  # 0.5 .. 1.99
FROZEN_GAIN = 1e-9
TPOT_TARGET = bench_targets.TPOT_TARGET
Job = tuple[float, int, float | None]  # reality, seed, trim (None: the oracle)
Result = tuple[Job, float, float]  # job, TPOT attainment 0..1, USD


def run_job(job: Job) -> Result:
    """One diurnal replay: the oracle, or rooftop with the right factor and a frozen trim."""
    from rooftop_control.calibration import TrimConfig
    from rooftop_sim import simulate

    reality, seed, trim = job
    spec = bench_simulate.load_spec(None)
    workload = simulate.workload_from_trace(str(bench_simulate.DEFAULT_TRACE), True)
    scn = simulate.scenario(spec, workload, reality_factor=reality, seed=seed)
    if trim is None:
        _, summary = simulate.run(scn, "oracle")
    else:
        cap = scn.planner.size(spec.workload.requests_per_second, 1.0).max_num_seqs
        prior = simulate.Prior(factor=simulate.true_factor(scn, cap / 2), trim=trim)
        frozen = {"trim": TrimConfig(up=FROZEN_GAIN, down=FROZEN_GAIN)}
        _, summary = simulate.run(scn, "rooftop", controller=frozen, prior=prior)
    return job, summary["slo_attainment_tpot"], summary["usd"]


def next_index(fails: int, passes: int | None, top: int) -> int | None:
    """The grid index to try next, or None when the search is over.

    ``fails``: the largest index known to miss the TPOT target (-1: none yet);
    ``passes``: the smallest known to meet it (None: none yet). The top of the grid
    goes first: if it misses, no trim on the grid will do.
    """
    if passes is None:
        return None if fails >= top else top
    if passes - fails <= 1:
        return None
    return (fails + passes) // 2


def search(
    realities: list[float], seeds: list[int], pool: Executor, progress: Progress | None = None
) -> list[Result]:
    """Bisect every reality factor's trim at once (one batch of replays per round;
    ``progress`` gets a line per round, on a terminal)."""
    progress = progress or Progress()
    bounds: dict[float, tuple[int, int | None]] = {r: (-1, None) for r in realities}
    results: list[Result] = []
    while True:
        todo = {r: next_index(*bounds[r], len(TRIMS) - 1) for r in realities}
        todo = {r: i for r, i in todo.items() if i is not None}
        if not todo:
            return results
        jobs: list[Job] = [(r, s, TRIMS[i]) for r, i in todo.items() for s in seeds]
        progress.status(f"bench_prior: bisection, {len(jobs)} replays running", force=True)
        batch = list(pool.map(run_job, jobs))
        progress.line(f"bench_prior: bisection round of {len(jobs)} replays done, "
                      f"{len(results) + len(batch)} in all")  # fmt: skip
        results += batch
        for reality, index in todo.items():
            worst = min(a for job, a, _ in batch if job[0] == reality)
            fails, passes = bounds[reality]
            met = worst >= TPOT_TARGET
            bounds[reality] = (fails, index) if met else (index, passes)


def table(results: list[Result], realities: list[float]) -> str:
    """Markdown: per reality factor, the cheapest trim meeting the TPOT target on every
    seed and the largest trim that missed it, with both targets' marks."""
    oracle = {job[:2]: usd for job, _, usd in results if job[2] is None}
    lines = ["| reality | trim | worst TPOT / x oracle | targets met |", "|---|---|---|---|"]
    for reality in realities:
        runs: dict[float, list[tuple[float, float, float]]] = {}
        for (r, seed, trim), att, usd in results:
            if r == reality and trim is not None:
                runs.setdefault(trim, []).append((att, usd, oracle[(r, seed)]))
        passing = [t for t, rows in runs.items() if min(a for a, _, _ in rows) >= TPOT_TARGET]
        cheapest = min(passing, default=None)
        missing = [t for t in runs if cheapest is None or t < cheapest]
        for label, trim in (("largest missing", max(missing, default=None)),
                            ("smallest meeting", cheapest)):  # fmt: skip
            if trim is None:
                lines.append(f"| {reality:g} | {label}: none on the grid | | |")
                continue
            rows = runs[trim]
            text, met = bench_targets.cell([a for a, _, _ in rows], [u for _, u, _ in rows],
                                           [o for _, _, o in rows])  # fmt: skip
            lines.append(f"| {reality:g} | {label}: {trim:.3f} | {text} | {met} of 2 |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    bench_targets.add_run_arguments(ap)
    args = ap.parse_args(argv)
    realities, seeds = bench_targets.realities_and_seeds(args)
    started = time.perf_counter()
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        first: list[Job] = [(r, s, None) for r in realities for s in seeds]
        results = bench_simulate.map_reporting(pool, run_job, first, "bench_prior")
        results += search(realities, seeds, pool)
    print(table(results, realities))
    print(f"{len(results)} replays in {time.perf_counter() - started:.0f} s.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
