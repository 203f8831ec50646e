"""The planner's accuracy, as the docs quote it, is what ``benchmarks/bench_continuous.py``
and ``benchmarks/bench_preemption.py`` (against the engine simulator) and
``benchmarks/gpu_decode_vs_planner.py`` (against steps timed on real GPUs) print now.

All three are deterministic (fixed clients and lengths, no random draws; about 40 s
together), so docs/planner.md carries their tables row for row and the README their
summary figures; a planner or simulator change that moves one fails here until the doc
is re-run.
"""

from __future__ import annotations

import contextlib
import io
import math
import re
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def one_line(path: Path) -> str:
    return " ".join(path.read_text().split())  # prose wraps anywhere


def printed_by(load_benchmark: Callable[[str], ModuleType], name: str, *args: object) -> str:
    """What ``benchmarks/NAME.py``'s ``main(*args)`` prints; it must return no error."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert load_benchmark(name).main(*args) in (None, 0)
    return out.getvalue()


def table_rows(text: str) -> list[str]:
    return [line for line in text.split("\n") if line.startswith("| ") and "---" not in line]


@pytest.fixture(scope="module")
def continuous(load_benchmark: Callable[[str], ModuleType]) -> str:
    return printed_by(load_benchmark, "bench_continuous")


@pytest.fixture(scope="module")
def preemption(load_benchmark: Callable[[str], ModuleType]) -> str:
    return printed_by(load_benchmark, "bench_preemption")


def test_planner_doc_carries_the_continuous_batching_tables(continuous: str) -> None:
    doc = (ROOT / "docs" / "planner.md").read_text()
    rows = table_rows(continuous)
    assert len(rows) > 50  # both tables and their headers
    stale = [row for row in rows if row not in doc]
    assert not stale, "re-run benchmarks/bench_continuous.py into docs/planner.md:\n" + "\n".join(
        stale
    )


def test_readme_quotes_the_continuous_batching_summary(continuous: str) -> None:
    summary = re.search(r"median \|error\| ([\d.]+)% over (\d+) rows", continuous)
    assert summary, continuous
    median, rows = summary.groups()
    assert summary.group(0) in (ROOT / "docs" / "planner.md").read_text()
    readme = one_line(ROOT / "README.md")
    assert f"within {median} % (median over {rows} client counts" in readme
    # the second table: vLLM's per-step token budget binds; the README rounds its worst up
    capped = continuous.split("At vLLM's default caps")[1]
    worst = max(abs(float(e)) for e in re.findall(r"\| ([+-][\d.]+)% \|", capped))
    assert f"and within {math.ceil(worst)} % where vLLM's per-step token budget" in readme


def test_docs_carry_the_eviction_table_and_its_summary(preemption: str) -> None:
    planner_doc = (ROOT / "docs" / "planner.md").read_text()
    rows = table_rows(preemption)
    stale = [row for row in rows if row not in planner_doc]
    assert not stale, "re-run benchmarks/bench_preemption.py into docs/planner.md:\n" + "\n".join(
        stale
    )
    summary = re.search(r"([\d.]+)% with the eviction model, ([\d.]+)% without", preemption)
    assert summary, preemption
    with_model, without = summary.groups()
    cases = len(rows) - 1  # less the header
    readme = one_line(ROOT / "README.md")
    assert f"({with_model} % median over {cases} such cases" in readme
    assert f"{without} % without the model" in readme


def test_docs_quote_the_real_gpu_step_comparison(
    load_benchmark: Callable[[str], ModuleType],
) -> None:
    printed = printed_by(load_benchmark, "gpu_decode_vs_planner", [])
    doc = (ROOT / "docs" / "planner.md").read_text()
    doc_rows = {row.split(" | ")[0]: row.split(" | ")[1:] for row in table_rows(doc)}
    rows = table_rows(printed)[1:]  # less the header
    assert len(rows) == 8
    for row in rows:
        gpu, weights, phase = row.split(" | ")[0].removeprefix("| ").split()
        label = f"| {gpu.replace('h100-sxm', 'H100 SXM').upper()}, {weights}, {phase}"
        assert doc_rows.get(label) == row.split(" | ")[1:], f"docs/planner.md's {label!r}"
    summary = re.search(r"(\d+) rows: median \|error\| ([\d.]+)%; every measured step at least "
                        r"([\d.]+)x", printed)  # fmt: skip
    assert summary, printed
    rows_n, median, floor = summary.groups()
    planner_doc, readme = one_line(ROOT / "docs" / "planner.md"), one_line(ROOT / "README.md")
    assert f"error is {median} % over the {rows_n} rows" in planner_doc
    assert f"at least {floor}x the planner's floor" in planner_doc
    assert f"within {median} % at the median over {rows_n} rows" in readme
