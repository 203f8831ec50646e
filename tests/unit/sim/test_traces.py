"""Azure-format trace loading, its error messages, and the diurnal time warp."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from rooftop_sim.traces import (
    TraceError,
    TraceWarning,
    diurnal_rate,
    diurnal_warp,
    load_trace,
)

BUNDLED = Path(__file__).resolve().parents[3] / "examples/traces/azure_llm_2023_conv.csv"
HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "t.csv"
    p.write_text(text)
    return p


def test_loads_iso_timestamps_with_seven_fraction_digits(tmp_path: Path) -> None:
    p = write(tmp_path, HEADER + "2023-11-16 18:17:03.9799600,4808,10\n"
              "2023-11-16 18:17:05.4799600,100,0\n")  # fmt: skip
    t = load_trace(p)
    assert len(t) == 2 and t.arrival_s[0] == 0.0
    assert t.arrival_s[1] == pytest.approx(1.5)
    assert list(t.prompt_tokens) == [4808, 100] and list(t.output_tokens) == [10, 0]
    assert t.requests()[1] == (pytest.approx(1.5), 100, 1)  # replay clamps to >= 1 token


def test_numeric_seconds_and_speedup_and_window(tmp_path: Path) -> None:
    p = write(tmp_path, HEADER + "10,1,1\n11,2,2\n14,3,3\n")
    t = load_trace(p)
    assert list(t.arrival_s) == [0.0, 1.0, 4.0] and t.mean_rate == pytest.approx(0.5)
    assert list(t.speedup(2.0).arrival_s) == [0.0, 0.5, 2.0]
    assert list(t.window(0.5, 5.0).arrival_s) == [0.5, 3.5]


def test_unsorted_rows_are_sorted_with_warning(tmp_path: Path) -> None:
    p = write(tmp_path, HEADER + "3,30,3\n1,10,1\n2,20,2\n")
    with pytest.warns(TraceWarning, match=r"t\.csv: 1 timestamp\(s\) out of order .*line 3"):
        t = load_trace(p)
    assert list(t.prompt_tokens) == [10, 20, 30]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("TIMESTAMP,ContextTokens\n1,2\n", r"t\.csv:1: missing column\(s\) GeneratedTokens"),
        (HEADER + "1,2,3\n2,abc,3\n", r"t\.csv:3: column ContextTokens: not a number: 'abc'"),
        (HEADER + "1,2,-3\n", r"t\.csv:2: column GeneratedTokens: must be a non-negative"),
        (HEADER + "1,2.5,3\n", r"t\.csv:2: column ContextTokens: must be a non-negative"),
        (HEADER + "yesterday,2,3\n", r"t\.csv:2: column TIMESTAMP: not a date-time"),
        (HEADER + "1,2,3\nnan,2,3\n", r"t\.csv:3: column TIMESTAMP: must be a finite number"),
        (HEADER + "inf,2,3\n", r"t\.csv:2: column TIMESTAMP: must be a finite number"),
        (HEADER, r"t\.csv: no data rows"),
    ],
)
def test_bad_files_name_file_line_column(tmp_path: Path, body: str, message: str) -> None:
    with pytest.raises(TraceError, match=message):
        load_trace(write(tmp_path, body))


def test_a_binary_file_is_named_not_a_traceback(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_bytes(HEADER.encode() + b"\xff\xfe\x00garbage\n")
    with pytest.raises(TraceError, match=r"t\.csv: not a UTF-8 text CSV"):
        load_trace(path)


def test_a_spreadsheet_byte_order_mark_is_not_part_of_the_header(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_bytes(b"\xef\xbb\xbf" + (HEADER + "1,2,3\n").encode())
    assert list(load_trace(path).prompt_tokens) == [2]


def test_missing_file() -> None:
    with pytest.raises(TraceError, match="cannot open"):
        load_trace("/nonexistent/trace.csv")


def test_bundled_azure_trace_loads_whole() -> None:
    # the simulate benchmark's input: examples/traces/README.md says one hour,
    # 19,366 requests, mean 1,155 prompt / 211 output tokens, 3-8 req/s
    t = load_trace(BUNDLED)
    assert len(t) == 19_366 and np.all(np.diff(t.arrival_s) >= 0)
    assert 3500 < t.arrival_s[-1] - t.arrival_s[0] <= 3600
    assert 3.0 < t.mean_rate < 8.0
    assert round(float(t.prompt_tokens.mean())) == 1155
    assert round(float(t.output_tokens.mean())) == 211


def test_diurnal_rate_shape() -> None:
    r = diurnal_rate(np.linspace(0, 100, 1001), period_s=100, peak_to_trough=3.0)
    assert r.max() / r.min() == pytest.approx(3.0, rel=1e-3)
    assert float(np.argmax(r)) / 1000 == pytest.approx(0.5, abs=0.01)
    assert r[:-1].mean() == pytest.approx(1.0, abs=1e-3)


def test_diurnal_warp_follows_curve_and_preserves_count() -> None:
    steady = np.sort(np.random.default_rng(0).uniform(0, 1000, 20_000))
    warped = diurnal_warp(steady, peak_to_trough=4.0)
    assert len(warped) == len(steady) and np.all(np.diff(warped) >= 0)
    assert warped[0] == steady[0] and warped[-1] == pytest.approx(steady[-1])
    counts, _ = np.histogram(warped, bins=10, range=(steady[0], steady[-1]))
    # busiest tenth (middle) vs quietest (an edge) near the 4:1 peak-to-trough ratio
    assert 2.5 < counts[4:6].max() / min(counts[0], counts[-1]) < 4.5


# ---- Mooncake's JSON-lines format


def write_jsonl(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "t.jsonl"
    p.write_text(text)
    return p


MOONCAKE = (
    '{"timestamp": 0, "input_length": 6758, "output_length": 500, "hash_ids": [0, 1]}\n'
    '{"timestamp": 1500, "input_length": 700, "output_length": 49, "hash_ids": [0, 14]}\n'
    "\n"
    '{"timestamp": 4000, "input_length": 12, "output_length": 0, "hash_ids": [2]}\n'
)


def test_a_mooncake_trace_reads_milliseconds_and_lengths(tmp_path: Path) -> None:
    trace = load_trace(write_jsonl(tmp_path, MOONCAKE))
    assert trace.arrival_s.tolist() == [0.0, 1.5, 4.0]
    assert trace.prompt_tokens.tolist() == [6758, 700, 12]
    assert trace.output_tokens.tolist() == [500, 49, 0]


@pytest.mark.parametrize(
    ("line", "needle"),
    [
        ("{not json", ":2: not JSON"),
        ("[1, 2, 3]", ":2: expected a JSON object, got list"),
        ('{"timestamp": 5, "input_length": 10}', ":2: missing key(s) output_length"),
        ('{"timestamp": 5, "input_length": -1, "output_length": 3}', ":2: key input_length"),
        ('{"timestamp": 2.5, "input_length": 1, "output_length": 3}', ":2: key timestamp"),
    ],
)
def test_a_bad_mooncake_line_is_named_with_the_key(tmp_path: Path, line: str, needle: str) -> None:
    good = '{"timestamp": 0, "input_length": 5, "output_length": 3}\n'
    with pytest.raises(TraceError, match=re.escape(needle)):
        load_trace(write_jsonl(tmp_path, good + line + "\n"))


def test_an_empty_mooncake_trace_says_what_a_line_holds(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="one JSON object per line"):
        load_trace(write_jsonl(tmp_path, "\n\n"))


def test_mooncake_lines_out_of_order_name_their_own_line(tmp_path: Path) -> None:
    text = (
        '{"timestamp": 2000, "input_length": 5, "output_length": 3}\n'
        '{"timestamp": 1000, "input_length": 5, "output_length": 3}\n'
    )
    with pytest.warns(TraceWarning, match="first at line 2"):
        trace = load_trace(write_jsonl(tmp_path, text))
    assert trace.arrival_s.tolist() == [0.0, 1.0]
