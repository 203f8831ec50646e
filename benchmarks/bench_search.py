"""How long one full SLO/budget search takes (target: < 100 ms on a 2-core machine).

    python benchmarks/bench_search.py [--repeat 20]

Prints milliseconds per full search for each bundled example, and, because shared
machines are noisy, the ratio to a baseline measured in the same run: one single-scenario
continuous-batching prediction (``rooftop predict``'s unit of work).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from rooftop_api.manifest import load_target
from rooftop_planner.batching import predict_continuous
from rooftop_planner.catalog import load_catalog
from rooftop_planner.efficiency import load_efficiency
from rooftop_planner.perf import EngineShape
from rooftop_planner.search import plan_target

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def median_seconds(func: Callable[[], object], repeat: int) -> float:
    func()  # warm caches (catalog, efficiency table)
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        func()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    catalog = load_catalog()
    dep = EngineShape(
        catalog.model("llama-3.1-8b"),
        catalog.gpu("h100-sxm"),
        efficiency=load_efficiency().lookup(catalog.gpu("h100-sxm")),
    )
    baseline = median_seconds(lambda: predict_continuous(dep, 32, 1000, 200), args.repeat * 10)
    print(f"baseline: one continuous-batching prediction = {baseline * 1e3:.3f} ms")
    print(f"{'example':<28} {'ms/search':>10} {'x baseline':>11} {'candidates':>11}")
    for path in sorted(EXAMPLES.glob("*.yaml")):
        spec = load_target(path).spec
        result = plan_target(spec)
        seconds = median_seconds(lambda spec=spec: plan_target(spec), args.repeat)
        evaluated = len(result.candidates) + len(result.rejections)
        print(f"{path.stem:<28} {seconds * 1e3:>10.1f} {seconds / baseline:>11.0f} {evaluated:>11}")


if __name__ == "__main__":
    main()
