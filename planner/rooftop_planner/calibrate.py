"""Fit the efficiency parameters on measured benchmarks and print the fit error.

    python -m rooftop_planner.calibrate [--data CSV] [--write]

Data: shared/data/measured/calibration.csv (NVIDIA DLI TensorRT-LLM 0.9.0 static batches
with TPOT and TTFT; Argonne LLM-Inference-Bench vLLM/TensorRT-LLM static batches with
output tokens/s only). Per GPU it fits bandwidth efficiency, FLOP efficiency and step
overhead; fleet-wide it fits per-layer overhead, all-reduce latency and the TensorRT-LLM
overhead factor relative to vLLM. Residuals are log ratios (predicted/measured), so a
2x miss counts the same either way. ``--write`` stores the result in
``catalog/efficiency.yaml``; only this command writes that file.
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
import sys
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from rooftop_planner.catalog import load_catalog
from rooftop_planner.efficiency import Efficiency, EfficiencyTable
from rooftop_planner.scenarios import Scenario, ScenarioError, scenario_from_row

DEFAULT_DATA = Path(__file__).resolve().parents[2] / ".." / "shared/data/measured/calibration.csv"
OUTPUT = Path(__file__).resolve().parent / "catalog" / "efficiency.yaml"
GPU_PARAMS = ("bandwidth_efficiency", "flops_efficiency", "step_overhead_s")
# Bounds keep the fit physical: nobody beats peak, nobody is below 20% of it.
BOUNDS = {
    "bandwidth_efficiency": (0.2, 0.92),
    "flops_efficiency": (0.1, 0.9),
    "step_overhead_s": (1e-5, 0.02),
    "layer_overhead_s": (0.0, 1e-4),
    "allreduce_latency_s": (1e-6, 2e-4),
    "trtllm_factor": (0.2, 3.0),
}


@dataclass(frozen=True)
class Observation:
    scenario: Scenario
    metric: str  # tpot_s | ttft_s | output_tok_s
    measured: float
    source: str


def load_observations(path: Path) -> list[Observation]:
    """Every measured metric of every row we can parse, as separate observations."""
    catalog = load_catalog()
    table = EfficiencyTable(Efficiency(), {}, {})
    observations: list[Observation] = []
    with path.open(newline="") as handle:
        for row in csv.DictReader(handle):
            try:
                scenario = scenario_from_row(row, catalog, table)
            except ScenarioError:
                continue
            source = "argonne" if "argonne" in row["source"] else "nvidia-dli"
            for column, metric, scale in (
                ("tpot_ms", "tpot_s", 1e-3),
                ("ttft_ms", "ttft_s", 1e-3),
                ("output_tok_s_total", "output_tok_s", 1.0),
            ):
                if row.get(column):
                    # DLI rows give TPOT and TTFT; their tok/s is derived from the same two.
                    if source == "nvidia-dli" and metric == "output_tok_s":
                        continue
                    value = float(row[column]) * scale
                    observations.append(Observation(scenario, metric, value, source))
    return observations


class Fit:
    """Maps a parameter vector to an EfficiencyTable and residuals."""

    def __init__(self, observations: Sequence[Observation]) -> None:
        self.observations = observations
        self.gpus = sorted({o.scenario.deployment.gpu.id for o in observations})
        self.names = [f"{g}.{p}" for g in self.gpus for p in GPU_PARAMS]
        self.names += ["layer_overhead_s", "allreduce_latency_s", "trtllm_factor"]

    def initial(self) -> np.ndarray:
        base = Efficiency()
        per_gpu = [getattr(base, p) for _ in self.gpus for p in GPU_PARAMS]
        return np.array([*per_gpu, base.layer_overhead_s, base.allreduce_latency_s, 0.5])

    def bounds(self) -> tuple[list[float], list[float]]:
        keys = [n.split(".")[-1] for n in self.names]
        return [BOUNDS[k][0] for k in keys], [BOUNDS[k][1] for k in keys]

    def table(self, x: np.ndarray) -> EfficiencyTable:
        values = dict(zip(self.names, x.tolist(), strict=True))
        per_gpu = {
            g: Efficiency(
                **{p: values[f"{g}.{p}"] for p in GPU_PARAMS},
                layer_overhead_s=values["layer_overhead_s"],
                allreduce_latency_s=values["allreduce_latency_s"],
            )
            for g in self.gpus
        }
        default = Efficiency(
            **{p: statistics.median(getattr(e, p) for e in per_gpu.values()) for p in GPU_PARAMS},
            layer_overhead_s=values["layer_overhead_s"],
            allreduce_latency_s=values["allreduce_latency_s"],
        )
        factors = {"vllm": 1.0, "trtllm": values["trtllm_factor"]}
        return EfficiencyTable(default, per_gpu, factors)

    def residuals(self, x: np.ndarray) -> np.ndarray:
        table = self.table(x)
        return np.array([log_error(o, table) for o in self.observations])


def predicted(observation: Observation, table: EfficiencyTable) -> float:
    scenario = observation.scenario
    dep = replace(
        scenario.deployment,
        efficiency=table.lookup(scenario.deployment.gpu.id, scenario.engine),
    )
    prediction = replace(scenario, deployment=dep).predict()
    value: float = getattr(prediction, observation.metric)
    return value


def log_error(observation: Observation, table: EfficiencyTable) -> float:
    value = predicted(observation, table)
    if not math.isfinite(value) or value <= 0:
        return 3.0  # a row we claim does not fit but was measured: a large, bounded penalty
    return math.log(value / observation.measured)


def report(observations: Sequence[Observation], table: EfficiencyTable) -> str:
    """Median and p90 absolute percentage error per source, metric and GPU."""
    groups: dict[tuple[str, str], list[float]] = defaultdict(list)
    for o in observations:
        err = abs(math.exp(log_error(o, table)) - 1.0) * 100
        groups[(o.source, o.metric)].append(err)
        groups[(f"gpu={o.scenario.deployment.gpu.id}", o.metric)].append(err)
    lines = [f"{'group':<22} {'metric':<13} {'rows':>5} {'median %':>9} {'p90 %':>7}"]
    for (group, metric), errors in sorted(groups.items()):
        p90 = float(np.percentile(errors, 90))
        median = statistics.median(errors)
        lines.append(f"{group:<22} {metric:<13} {len(errors):>5} {median:>9.1f} {p90:>7.1f}")
    return "\n".join(lines)


def fit(observations: Sequence[Observation]) -> EfficiencyTable:
    from scipy.optimize import least_squares  # type: ignore[import-untyped]

    problem = Fit(observations)
    result = least_squares(
        problem.residuals,
        problem.initial(),
        bounds=problem.bounds(),
        loss="soft_l1",
        f_scale=0.2,
        x_scale="jac",
        max_nfev=60,
    )
    return problem.table(result.x)


def table_to_yaml(table: EfficiencyTable, data: Path, rows: int) -> str:
    def as_dict(e: Efficiency) -> dict[str, float]:
        return {k: float(f"{v:.4g}") for k, v in e.__dict__.items()}

    doc: dict[str, Any] = {
        "default": as_dict(table.default),
        "gpus": {g: as_dict(e) for g, e in sorted(table.per_gpu.items())},
        "engine_overhead_factor": {k: round(v, 4) for k, v in table.engine_overhead_factor.items()},
    }
    header = (
        "# Written by `python -m rooftop_planner.calibrate --write`; do not edit by hand.\n"
        f"# Fitted on {rows} observations from shared/data/measured/calibration.csv\n"
        "# (NVIDIA DLI TensorRT-LLM 0.9.0 sizing data;\n"
        "#  Argonne LLM-Inference-Bench, arXiv 2411.00136).\n"
    )
    return header + yaml.safe_dump(doc, sort_keys=False)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rooftop_planner.calibrate")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA.resolve())
    parser.add_argument("--write", action="store_true", help="store the fit in the catalog")
    args = parser.parse_args(argv)
    if not args.data.is_file():
        print(f"--data: {args.data} not found", file=sys.stderr)
        return 2
    observations = load_observations(args.data)
    print(f"{len(observations)} observations from {args.data}")
    print("before fit (defaults):")
    print(report(observations, EfficiencyTable(Efficiency(), {}, {})))
    table = fit(observations)
    print("after fit:")
    print(report(observations, table))
    if args.write:
        OUTPUT.write_text(table_to_yaml(table, args.data, len(observations)))
        print(f"wrote {OUTPUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
