"""The planner's decode step against decode steps timed on a real GPU.

    python benchmarks/gpu_decode_vs_planner.py [--rows] [data/measured/gpu_decode_steps.csv]

The CSV comes from ``benchmarks/gpu_decode_steps.py``: a Llama layer stack's kernels
(cuBLAS/cuBLASLt GEMMs, PyTorch's FlashAttention over a contiguous cache) replayed as a
CUDA graph on the GPU itself; data/README.md says where and how it ran. Each row is
priced three ways:

- measured: the GEMMs alone, the attention (the whole step minus the step without it),
  and the whole kernel step (with norms and element-wise kernels, no CPU work);
- vLLM's kernel tables: the same GEMMs and decode attention interpolated in the vendored
  tables measured inside vLLM (``rooftop_sim.engine``, the simulated engine's truth);
- the planner: ``step_breakdown`` with vLLM's fitted curves; its step adds the fitted
  fixed costs, which stand for the norms and element-wise kernels and the engine's CPU
  work together.

No all-reduce is in any of them (tensor-parallel shards were timed on one GPU). Prints,
per GPU and weight dtype, the median signed error of each against the measurement
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
from rooftop_planner.perf import Deployment, floor_s, step_breakdown
from rooftop_sim.engine.truth import TruthModel

DEFAULT_CSV = Path(__file__).resolve().parents[1] / "data/measured/gpu_decode_steps.csv"


@dataclass(frozen=True)
class Priced:
    """One decode step's GEMMs, attention and whole step (ms) by one source."""

    gemm_ms: float
    attention_ms: float
    step_ms: float


@dataclass(frozen=True)
class Row:
    """One measured row and what the tables and the planner make of it."""

    gpu: str
    model: str
    tp: int
    weights: str
    batch: int
    context: int
    measured: Priced
    tables: Priced
    planner: Priced
    floor_ms: float

    @property
    def group(self) -> str:
        return f"{self.gpu} {self.weights}"

    def error(self, source: str, part: str) -> float:
        """Signed relative error of ``source``'s ``part`` against the measurement."""
        return float(getattr(getattr(self, source), part) / getattr(self.measured, part) - 1)


def measured(line: dict[str, str]) -> Priced:
    """The step with the faster attention of the two timed, its GEMMs and its attention."""
    step = min(float(line["bmm_step_ms"]), float(line["sdpa_step_ms"]))
    return Priced(float(line["gemms_ms"]), step - float(line["none_step_ms"]), step)


def from_tables(model: str, gpu: str, tp: int, weights: str, batch: int, context: int) -> Priced:
    """GEMMs and decode attention interpolated in vLLM's measured kernel tables (ms)."""
    k = TruthModel.for_deployment(model, gpu, tp, weights, "auto").kernels
    gemm = k.num_layers * (k.qkv(batch) + k.o_proj(batch) + k.mlp_ms(batch)) + k.lm_head(batch)
    attention = k.num_layers * k.decode_attn(batch, context)
    return Priced(gemm, attention, gemm + attention)


def price(lines: Iterable[dict[str, str]]) -> list[Row]:
    catalog, efficiency = load_catalog(), load_efficiency()
    out = []
    for line in lines:
        gpu, model, weights = line["gpu"], line["model"], line["weights"]
        tp, batch, context = int(line["tp"]), int(line["batch"]), int(line["context"])
        dep = Deployment(catalog.model(model), catalog.gpu(gpu), tp, weights, "auto",
                         efficiency.lookup(gpu, "vllm"))  # fmt: skip
        parts = step_breakdown(dep, batch, batch * context)
        # no all-reduce: the shard ran alone
        kernels = parts.gemm_s + parts.attention_s + parts.overhead_s
        planner = Priced(parts.gemm_s * 1e3, parts.attention_s * 1e3, kernels * 1e3)
        tables = from_tables(model, gpu, tp, weights, batch, context)
        floor = floor_s(dep, batch, batch * context) * 1e3
        out.append(Row(gpu, model, tp, weights, batch, context, measured(line), tables,
                       planner, floor))  # fmt: skip
    return out


def read(path: Path) -> list[Row]:
    with path.open() as handle:
        return price(csv.DictReader(handle))


def median_error(rows: Iterable[Row], source: str, part: str) -> float:
    return statistics.median(r.error(source, part) for r in rows)


def print_rows(rows: list[Row]) -> None:
    print(
        "| deployment | batch | context | measured GEMMs / attention / step ms | "
        "tables GEMMs / attention | planner GEMMs / attention / step |"
    )
    print("|---|---|---|---|---|---|")
    for r in rows:
        m, t, p = r.measured, r.tables, r.planner
        print(f"| {r.model} {r.weights} TP{r.tp} shard on {r.gpu} | {r.batch} | {r.context} | "
              f"{m.gemm_ms:.2f} / {m.attention_ms:.2f} / {m.step_ms:.2f} | "
              f"{t.gemm_ms:.2f} / {t.attention_ms:.2f} | "
              f"{p.gemm_ms:.2f} / {p.attention_ms:.2f} / {p.step_ms:.2f} |")  # fmt: skip
    print()


def main(argv: list[str]) -> int:
    paths = [a for a in argv if not a.startswith("--")]
    rows = read(Path(paths[0]) if paths else DEFAULT_CSV)
    if "--rows" in argv:
        print_rows(rows)
    print(
        "| GPU, weights | rows | vLLM's tables: GEMMs / attention | "
        "planner: GEMMs / attention / whole step |"
    )
    print("|---|---|---|---|")
    for group in sorted({r.group for r in rows}):
        mine = [r for r in rows if r.group == group]
        tables = [median_error(mine, "tables", p) for p in ("gemm_ms", "attention_ms")]
        planner = [median_error(mine, "planner", p) for p in ("gemm_ms", "attention_ms", "step_ms")]
        print(f"| {group} | {len(mine)} | " + " / ".join(f"{e:+.0%}" for e in tables) + " | "
              + " / ".join(f"{e:+.0%}" for e in planner) + " |")  # fmt: skip
    step_error = statistics.median(abs(r.error("planner", "step_ms")) for r in rows)
    over_floor = min(r.measured.step_ms / r.floor_ms for r in rows)
    print(f"\nwhole step, all {len(rows)} rows: median |error| {step_error:.1%}; "
          f"every measured step at least {over_floor:.2f}x the planner's floor")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
