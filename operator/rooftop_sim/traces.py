"""Request traces in the Azure LLM inference trace format or Mooncake's, and a diurnal
time warp.

Mooncake's format (kvcache-ai/Mooncake, FAST'25 traces; a ``.jsonl`` file): one JSON
object per line with ``timestamp`` (milliseconds), ``input_length`` and
``output_length`` (tokens); its ``hash_ids`` (the prompt's 512-token blocks) are not
read: the simulated engine has no prefix cache yet. The same rules as below apply (a
line that is not such an object is an error naming the line and the key).

Azure's format (Azure/AzurePublicDataset, 2023): a CSV with a header naming at least
``TIMESTAMP,ContextTokens,GeneratedTokens``. TIMESTAMP is an ISO date-time
(``2023-11-16 18:17:03.9799600``; digits beyond microseconds are dropped) or a plain
number of seconds. Token counts are non-negative integers; rows with 0 generated tokens
are kept (callers that need >= 1 output token clamp, see ``Trace.requests``).

Unsorted timestamps: the rows are sorted by time and a ``TraceWarning`` names the file
and the first out-of-order line. Reordering loses nothing a replay needs, and real
exports do interleave writers; refusing the file would be less useful than a warning.
Everything else that is wrong (missing column, unparsable or negative value, empty file)
raises ``TraceError`` naming the file, the line (1-based, header = line 1) and the column.
"""

from __future__ import annotations

import csv
import json
import math
import warnings
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import IO

import numpy as np
import numpy.typing as npt

from rooftop_sim.errors import SimError

COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


class TraceError(SimError):
    """A trace file cannot be used; the message names file, line and column."""


class TraceWarning(UserWarning):
    """A trace file was usable after a fix-up (rows re-sorted by time)."""


@dataclass(frozen=True)
class Trace:
    """Arrival offsets (s, from the first request, ascending) and token lengths."""

    source: str
    arrival_s: FloatArray
    prompt_tokens: IntArray
    output_tokens: IntArray

    def __len__(self) -> int:
        return len(self.arrival_s)

    @property
    def duration_s(self) -> float:
        """Seconds from the first to the last arrival."""
        return float(self.arrival_s[-1]) if len(self) else 0.0

    @property
    def mean_rate(self) -> float:
        """Requests per second over the trace (0 for fewer than 2 requests)."""
        return (len(self) - 1) / self.duration_s if self.duration_s > 0 else 0.0

    def speedup(self, factor: float) -> Trace:
        """Same requests, arrivals compressed ``factor`` times (2.0: twice the rate)."""
        if not factor > 0:
            raise ValueError(f"speedup must be > 0, got {factor}")
        return Trace(self.source, self.arrival_s / factor, self.prompt_tokens, self.output_tokens)

    def window(self, start_s: float, end_s: float) -> Trace:
        """Requests arriving in [start_s, end_s), re-based to start at 0."""
        m = (self.arrival_s >= start_s) & (self.arrival_s < end_s)
        return Trace(
            self.source, self.arrival_s[m] - start_s, self.prompt_tokens[m], self.output_tokens[m]
        )

    def requests(self) -> list[tuple[float, int, int]]:
        """(arrival_s, prompt_tokens >= 1, output_tokens >= 1) per request, for replay."""
        return [
            (float(a), max(1, int(p)), max(1, int(o)))
            for a, p, o in zip(self.arrival_s, self.prompt_tokens, self.output_tokens, strict=True)
        ]


def _parse_time(text: str, where: str) -> float:
    """Seconds: a plain number, or an ISO date-time as a POSIX timestamp."""
    text = text.strip()
    try:
        seconds = float(text)
    except ValueError:
        pass
    else:
        if not math.isfinite(seconds):
            raise TraceError(f"{where}: must be a finite number of seconds, got {text!r}")
        return seconds
    head, dot, frac = text.partition(".")
    if dot:  # fromisoformat wants at most 6 fractional digits on some versions
        text = f"{head}.{frac[:6]}"
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        raise TraceError(f"{where}: not a date-time or number of seconds: {text!r}") from None


def _parse_count(text: str, where: str) -> int:
    try:
        value = float(text)
    except ValueError:
        raise TraceError(f"{where}: not a number: {text!r}") from None
    if not math.isfinite(value) or value < 0 or value != int(value):
        raise TraceError(f"{where}: must be a non-negative integer, got {text!r}")
    return int(value)


# Mooncake's JSON keys: arrival in milliseconds, prompt and output lengths in tokens
MOONCAKE_KEYS = ("timestamp", "input_length", "output_length")


def load_trace(path: str | Path, max_rows: int | None = None) -> Trace:
    """Read an Azure-format trace CSV, or a Mooncake ``.jsonl`` trace (see the module
    docstring for the rules)."""
    path = Path(path)
    try:
        fh = path.open(newline="", encoding="utf-8-sig")  # -sig: spreadsheets add a BOM
    except OSError as err:
        raise TraceError(f"{path}: cannot open: {err.strerror}") from err
    try:
        with fh:
            if path.suffix == ".jsonl":
                return _read_json_lines(path, fh, max_rows)
            return _read_rows(path, fh, max_rows)
    except UnicodeDecodeError as err:
        raise TraceError(
            f"{path}: not a UTF-8 text CSV ({err.reason}); export the trace as CSV text"
        ) from None


def _read_rows(path: Path, fh: IO[str], max_rows: int | None) -> Trace:
    times: list[float] = []
    prompts: list[int] = []
    outputs: list[int] = []
    reader = csv.DictReader(fh)
    missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
    if missing:
        raise TraceError(
            f"{path}:1: missing column(s) {', '.join(missing)}; header is "
            f"{reader.fieldnames!r}, expected {','.join(COLUMNS)}"
        )
    for row in reader:
        line = reader.line_num
        if max_rows is not None and len(times) >= max_rows:
            break
        cell = {c: (row.get(c) or "") for c in COLUMNS}
        times.append(_parse_time(cell["TIMESTAMP"], f"{path}:{line}: column TIMESTAMP"))
        prompts.append(_parse_count(cell["ContextTokens"], f"{path}:{line}: column ContextTokens"))
        outputs.append(
            _parse_count(cell["GeneratedTokens"], f"{path}:{line}: column GeneratedTokens")
        )
    if not times:
        raise TraceError(f"{path}: no data rows after the header")
    return _build(str(path), np.array(times), np.array(prompts), np.array(outputs))


def _read_json_lines(path: Path, fh: IO[str], max_rows: int | None) -> Trace:
    times: list[float] = []
    prompts: list[int] = []
    outputs: list[int] = []
    for line, text in enumerate(fh, start=1):
        if max_rows is not None and len(times) >= max_rows:
            break
        if not text.strip():
            continue
        row = _json_object(text, f"{path}:{line}")
        where = {k: f"{path}:{line}: key {k}" for k in MOONCAKE_KEYS}
        times.append(_parse_count(str(row["timestamp"]), where["timestamp"]) / 1e3)
        prompts.append(_parse_count(str(row["input_length"]), where["input_length"]))
        outputs.append(_parse_count(str(row["output_length"]), where["output_length"]))
    if not times:
        raise TraceError(f"{path}: no requests (expected one JSON object per line)")
    return _build(str(path), np.array(times), np.array(prompts), np.array(outputs), 1)


def _json_object(text: str, where: str) -> dict[str, object]:
    """One line as a JSON object holding ``MOONCAKE_KEYS``."""
    try:
        row = json.loads(text)
    except json.JSONDecodeError as err:
        raise TraceError(f"{where}: not JSON ({err.msg}); expected one object per line") from None
    if not isinstance(row, dict):
        raise TraceError(f"{where}: expected a JSON object, got {type(row).__name__}")
    missing = [k for k in MOONCAKE_KEYS if k not in row]
    if missing:
        raise TraceError(
            f"{where}: missing key(s) {', '.join(missing)}; a Mooncake trace line has "
            f"{', '.join(MOONCAKE_KEYS)} (and hash_ids)"
        )
    return row


def _build(source: str, t: FloatArray, p: IntArray, o: IntArray, first_line: int = 2) -> Trace:
    """Sort by time (warning when needed) and re-base arrivals to the first request
    (``first_line``: the file's line of the first request, for the warning)."""
    back = np.flatnonzero(np.diff(t) < 0)
    if len(back):
        warnings.warn(
            f"{source}: {len(back)} timestamp(s) out of order (first at line "
            f"{back[0] + 1 + first_line}); "
            "rows sorted by time",
            TraceWarning,
            stacklevel=4,  # load_trace's caller
        )
        order = np.argsort(t, kind="stable")
        t, p, o = t[order], p[order], o[order]
    return Trace(source, (t - t[0]).astype(np.float64), p.astype(np.int64), o.astype(np.int64))


# --------------------------------------------------------------------------------------
# Diurnal time warp
# --------------------------------------------------------------------------------------


def diurnal_rate(
    t_s: FloatArray | float, period_s: float, peak_to_trough: float = 3.0, peak_at: float = 0.5
) -> FloatArray:
    """Relative request rate (mean 1 over a period) of a day-shaped cosine curve.

    peak_to_trough: busiest / quietest rate (3.0 is typical of chat services);
    peak_at: where the peak falls, as a fraction of the period (0.5 = "mid-afternoon").
    """
    if period_s <= 0 or peak_to_trough < 1:
        raise ValueError("period_s must be > 0 and peak_to_trough >= 1")
    amp = (peak_to_trough - 1) / (peak_to_trough + 1)
    phase = 2 * np.pi * (np.asarray(t_s, dtype=np.float64) / period_s - peak_at)
    out: FloatArray = 1.0 + amp * np.cos(phase)
    return out


def diurnal_warp(
    arrival_s: FloatArray,
    period_s: float | None = None,
    peak_to_trough: float = 3.0,
    peak_at: float = 0.5,
) -> FloatArray:
    """Re-time arrivals so their rate follows ``diurnal_rate`` (count and span preserved).

    Each original arrival u in [0, T] moves to t with Lambda(t) = Lambda(T) * u / T,
    Lambda being the integral of the day-shaped rate: a (roughly) steady trace becomes a
    day compressed into T seconds, keeping its short-term burstiness. ``period_s``
    defaults to T (one day across the trace).
    """
    a = np.asarray(arrival_s, dtype=np.float64)
    span = float(a[-1] - a[0]) if len(a) > 1 else 0.0
    if span <= 0:
        return a.copy()
    grid = np.linspace(0.0, span, 4097)
    rate = diurnal_rate(grid, period_s or span, peak_to_trough, peak_at)
    cum = np.concatenate([[0.0], np.cumsum((rate[1:] + rate[:-1]) / 2 * np.diff(grid))])
    target = (a - a[0]) / span * cum[-1]
    warped: FloatArray = a[0] + np.interp(target, cum, grid)
    return warped
