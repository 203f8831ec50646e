"""docs/planner.md's fit-error tables are the stored fit's (``kernel_fit --stored``).

A refit (``make calibrate``) that moves a figure fails here until the doc is updated.
"""

from __future__ import annotations

import json
import re

import pytest

from rooftop_fit import kernel_fit

DOC = kernel_fit.REPO / "docs" / "planner.md"
STORED = json.loads(kernel_fit.OUTPUT.read_text())
# docs/planner.md's fit-error columns and the stored curve each one shows
CURVE_COLUMNS = (
    ("gemm", "bf16"),
    ("gemm", "fp8"),
    ("decode_attention", "bf16"),
    ("prefill_attention", "bf16"),
    ("moe", "bf16"),
)


def table_rows(first_header_cell: str) -> list[list[str]]:
    """The cells of every body row of the doc's table whose header starts with this."""
    lines = DOC.read_text().split("\n")
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {first_header_cell} "))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def percent(value: float) -> str:
    return f"{value * 100:.1f}%"


def test_the_curve_fit_error_table_is_the_stored_fit() -> None:
    rows = {(r[0], r[1]): r[2:] for r in table_rows("engine")}
    for kc in STORED["curves"]:
        key = (f"{kc['engine']} {kc['engine_version']}", kc["table_gpu"])
        assert key in rows, f"docs/planner.md's fit errors have no row for {key}"
        for (kind, dtype), cell in zip(CURVE_COLUMNS, rows.pop(key), strict=True):
            curve = kc[kind].get(dtype)
            want = percent(curve["median_error"]) if curve else "–"
            assert cell == want, f"{key} {kind}.{dtype}: doc {cell}, stored {want}"
    assert not rows, f"docs/planner.md lists tables the stored fit lacks: {sorted(rows)}"


def test_the_engine_costs_sentence_is_the_stored_fit() -> None:
    trtllm = STORED["engine_overhead"]["trtllm"]
    text = " ".join(DOC.read_text().split())
    sentence = (
        f"Engine costs fitted: {round(trtllm['step_s'] * 1e3, 3):g} ms per step, "
        f"{trtllm['layer_s'] * 1e6:.1f} µs per layer per step"
    )
    assert sentence in text
    assert f"at {trtllm['elementwise_mem_eff'] * 100:.1f} % of peak HBM" in text


@pytest.mark.parametrize("metric", ["tpot_s", "ttft_s"])
def test_the_bias_by_batch_table_is_the_stored_fit(metric: str) -> None:
    bands = STORED["calibration_bias_by_batch"][f"nvidia-dli:{metric}"]
    label = metric.split("_")[0].upper()
    row = next(r for r in table_rows("DLI rows") if r[0] == label)
    want = [f"{bands[band] * 100:+.1f} %" for _, band in kernel_fit.BATCH_BANDS]
    assert row[1:] == want


def test_the_whole_model_table_is_the_stored_fit() -> None:
    doc_rows = table_rows("source")
    for key, stored in STORED["calibration_error"].items():
        source, metric = key.split(":")
        named = {"nvidia-dli": "DLI", "argonne-trtllm": "Argonne TensorRT-LLM",
                 "argonne-vllm": "Argonne vLLM"}[source]  # fmt: skip
        label = {"tpot_s": "TPOT", "ttft_s": "TTFT", "output_tok_s": "output tok/s"}[metric]
        row = next(r for r in doc_rows if named in r[0] and r[1] == label)
        assert row[2] == f"{stored['rows']:,}", key
        assert row[3:] == [percent(stored["median_error"]), percent(stored["p90_error"])], key


def test_the_tables_are_found() -> None:
    # the helpers above would pass vacuously on an empty table
    assert len(table_rows("engine")) == len(STORED["curves"])
    assert re.search(r"\| TPOT \| [-+]", DOC.read_text())
