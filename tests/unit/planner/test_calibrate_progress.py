"""``python -m rooftop_fit.kernel_fit`` reports each fitted table on a terminal only."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from rooftop_fit import kernel_fit
from rooftop_planner.catalog import Catalog, load_catalog
from rooftop_planner.kernels import KernelCurves
from rooftop_planner.progress import Progress

STORED = {
    (kc.table_gpu, kc.engine): kc
    for kc in (KernelCurves.from_mapping(e)
               for e in json.loads(kernel_fit.OUTPUT.read_text())["curves"])
}  # fmt: skip


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_one_line_per_fitted_table() -> None:
    kc = STORED["h100_sxm", "vllm"]
    lines = kernel_fit.curve_lines(kc)
    tables = len(kc.gemm) + len(kc.decode_attention) + len(kc.prefill_attention) + len(kc.moe)
    assert kc.quant is not None  # vLLM's fp8 input quantization, timed on its own
    assert len(lines) == tables + 1
    assert any(line.startswith("calibrate: h100_sxm/vllm quant.fp8: ") for line in lines)
    gemm = kc.gemm["bf16"]
    assert (f"calibrate: h100_sxm/vllm gemm.bf16: {gemm.rows} rows, median |error| "
            f"{gemm.median_error:.1%}") in lines  # fmt: skip


def _stored(ops: Path, table_gpu: str, engine: str, catalog: Catalog) -> KernelCurves | None:
    """``fit_engine_curves`` without the minutes of fitting: the stored result."""
    return STORED.get((table_gpu, engine))


@pytest.mark.parametrize("tty", [True, False])
def test_fit_every_engine_reports_each_table_only_on_a_terminal(
    monkeypatch: pytest.MonkeyPatch, tty: bool
) -> None:
    monkeypatch.setattr(kernel_fit, "fit_engine_curves", _stored)
    stream = Terminal() if tty else io.StringIO()
    curves = kernel_fit.fit_every_engine(kernel_fit.DEFAULT_OPS, load_catalog(), Progress(stream))
    assert len(curves) == len(STORED)
    if not tty:
        assert stream.getvalue() == ""
        return
    shown = stream.getvalue()
    lasting = [ln.split("\x1b[K")[-1] for ln in shown.split("\n")[:-1]]
    assert lasting == [line for kc in curves for line in kernel_fit.curve_lines(kc)]
    assert "calibrate: fitting a100_sxm/vllm" in shown
    assert shown.endswith("\n")  # no status line left behind
