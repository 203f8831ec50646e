"""The planner's decode and prefill steps against steps timed on a real GPU.

    python benchmarks/gpu_decode_vs_planner.py [--rows] [CSV ...]

The CSVs (default: data/measured/gpu_decode_steps.csv and gpu_prefill_steps.csv) come from
``benchmarks/gpu_decode_steps.py``: a Llama layer stack's kernels (cuBLAS/cuBLASLt GEMMs,
PyTorch's attention over a contiguous cache) replayed as a CUDA graph on the GPU itself;
data/README.md says where and how they ran. Each row is priced three ways:

- measured: the GEMMs alone, the attention (the whole step minus the step without it),
  and the whole kernel step (with norms and element-wise kernels, no CPU work);
- the simulated engine: the same GEMMs and attention interpolated directly in the
  vendored tables measured inside vLLM (``rooftop_sim.engine``, with its floors);
- the planner: ``step_breakdown`` with vLLM's fitted curves; its step adds the fitted
  fixed costs, which stand for the norms and element-wise kernels and the engine's CPU
  work together.

No all-reduce is in any of them (tensor-parallel shards were timed on one GPU). Prints,
per GPU, weight dtype and phase, the median signed error of each against the measurement
(+ = slower than measured); ``--rows`` prints every row.
"""

from __future__ import annotations

import csv
import statistics
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from rooftop_planner.catalog import load_catalog
from rooftop_planner.efficiency import load_efficiency
from rooftop_planner.perf import EngineShape, floor_s, step_breakdown
from rooftop_sim.engine.truth import TruthModel

MEASURED = Path(__file__).resolve().parents[1] / "data" / "measured"
DEFAULT_CSVS = (MEASURED / "gpu_decode_steps.csv", MEASURED / "gpu_prefill_steps.csv")


@dataclass(frozen=True)
class Priced:
    """One step's GEMMs, attention and whole step (ms) by one source."""

    gemm_ms: float
    attention_ms: float
    step_ms: float


@dataclass(frozen=True)
class Step:
    """What one row runs: ``batch`` decodes over ``context`` tokens each, or one prompt of
    ``prompt`` tokens prefilled (batch and context 0)."""

    gpu: str
    model: str
    tp: int
    weights: str
    batch: int = 0
    context: int = 0
    prompt: int = 0

    @property
    def phase(self) -> str:
        return "prefill" if self.prompt else "decode"

    @property
    def pairs(self) -> float:
        """(query, key) pairs of a prompt's causal attention."""
        return self.prompt * (self.prompt + 1) / 2.0


@dataclass(frozen=True)
class Row:
    """One measured step and what the simulated engine and the planner make of it."""

    step: Step
    measured: Priced
    simulated: Priced
    planner: Priced
    floor_ms: float

    @property
    def group(self) -> str:
        return f"{self.step.gpu} {self.step.weights} {self.step.phase}"

    def error(self, source: str, part: str) -> float:
        """Signed relative error of ``source``'s ``part`` against the measurement."""
        return float(getattr(getattr(self, source), part) / getattr(self.measured, part) - 1)


def measured(line: dict[str, str]) -> Priced:
    """The step (decode: with the faster attention of the two timed), its GEMMs and its
    attention."""
    step = float(line["step_ms"]) if "step_ms" in line else min(
        float(line["bmm_step_ms"]), float(line["sdpa_step_ms"]))  # fmt: skip
    return Priced(float(line["gemms_ms"]), step - float(line["none_step_ms"]), step)


def simulated(s: Step) -> Priced:
    """The step's GEMMs and attention in the simulated engine's kernels (ms)."""
    k = TruthModel.for_deployment(s.model, s.gpu, s.tp, s.weights, "auto").kernels
    tokens, sampled = (s.prompt, 1) if s.prompt else (s.batch, s.batch)
    gemm = k.gemms_ms(tokens, sampled)
    per_layer = (
        k.prefill_attn_ms(s.prompt, s.pairs) if s.prompt else k.decode_attn(s.batch, s.context)
    )
    attention = k.num_layers * per_layer
    return Priced(gemm, attention, gemm + attention)


def planned(dep: EngineShape, s: Step) -> Priced:
    """The planner's GEMMs, attention and kernels plus fixed costs (no all-reduce: the
    shard ran alone), ms."""
    parts = step_breakdown(dep, s.batch, s.batch * s.context, s.prompt, s.pairs)
    kernels = parts.kernels_s - parts.allreduce_s  # every part of the step but the all-reduce
    return Priced(parts.gemm_s * 1e3, parts.attention_s * 1e3, kernels * 1e3)


def price(lines: Iterable[dict[str, str]]) -> list[Row]:
    catalog, efficiency = load_catalog(), load_efficiency()
    out = []
    for line in lines:
        s = Step(line["gpu"], line["model"], int(line["tp"]), line["weights"],
                 int(line.get("batch") or 0), int(line.get("context") or 0),
                 int(line.get("prompt_tokens") or 0))  # fmt: skip
        dep = EngineShape(catalog.model(s.model), catalog.gpu(s.gpu), s.tp, s.weights, "auto",
                         efficiency.lookup(catalog.gpu(s.gpu), "vllm"))  # fmt: skip
        floor = floor_s(dep, s.batch + s.prompt, s.batch * s.context) * 1e3
        out.append(Row(s, measured(line), simulated(s), planned(dep, s), floor))
    return out


def read(*paths: Path) -> list[Row]:
    rows = []
    for path in paths:
        with path.open() as handle:
            rows += price(csv.DictReader(handle))
    return rows


def median_error(rows: Iterable[Row], source: str, part: str) -> float:
    return statistics.median(r.error(source, part) for r in rows)


def print_rows(rows: list[Row]) -> None:
    print("| deployment | batch | context | prompt | measured GEMMs / attention / step ms | "
          "simulated GEMMs / attention | planner GEMMs / attention / step |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        s, m, t, p = r.step, r.measured, r.simulated, r.planner
        print(f"| {s.model} {s.weights} TP{s.tp} shard on {s.gpu} | {s.batch} | {s.context} | "
              f"{s.prompt} | {m.gemm_ms:.2f} / {m.attention_ms:.2f} / {m.step_ms:.2f} | "
              f"{t.gemm_ms:.2f} / {t.attention_ms:.2f} | "
              f"{p.gemm_ms:.2f} / {p.attention_ms:.2f} / {p.step_ms:.2f} |")  # fmt: skip
    print()


def main(argv: list[str]) -> int:
    paths = [Path(a) for a in argv if not a.startswith("--")] or list(DEFAULT_CSVS)
    rows = read(*paths)
    if "--rows" in argv:
        print_rows(rows)
    print("| GPU, weights, phase | rows | simulated engine: GEMMs / attention | "
          "planner: GEMMs / attention / whole step |")  # fmt: skip
    print("|---|---|---|---|")
    for group in sorted({r.group for r in rows}):
        mine = [r for r in rows if r.group == group]
        sim = [median_error(mine, "simulated", p) for p in ("gemm_ms", "attention_ms")]
        plan = [median_error(mine, "planner", p) for p in ("gemm_ms", "attention_ms", "step_ms")]
        print(f"| {group} | {len(mine)} | " + " / ".join(f"{e:+.0%}" for e in sim) + " | "
              + " / ".join(f"{e:+.0%}" for e in plan) + " |")  # fmt: skip
    decode = [r for r in rows if r.step.phase == "decode"]
    if decode:
        step_error = statistics.median(abs(r.error("planner", "step_ms")) for r in decode)
        over_floor = min(r.measured.step_ms / r.floor_ms for r in decode)
        print(f"\ndecode, whole step, {len(decode)} rows: median |error| {step_error:.1%}; "
              f"every measured step at least {over_floor:.2f}x the planner's floor")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
