"""Request traces in the Azure LLM inference trace format or Mooncake's, and a diurnal
time warp.

Mooncake's format (kvcache-ai/Mooncake, FAST'25 traces; a ``.jsonl`` file): one JSON
object per line with ``timestamp`` (milliseconds), ``input_length`` and
``output_length`` (tokens), and ``hash_ids``: one id per 512-token block of the prompt,
the last one partial, each naming the whole prefix through its block (ids are chained:
a later turn of a conversation repeats its earlier turns' ids). A line without
``hash_ids`` has no blocks (it never shares a prefix). The session of a request is the
first block id after the part every request of the file shares (in Mooncake's
conversation trace, block 0 is common to all and block 1 names the conversation); a
request with no such block is a session of its own. ``PrefixBlocks.engine_hashes`` turns
a request's ids into the simulated engine's block hashes. The same rules as below apply
(a line that is not such an object is an error naming the line and the key).

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
from collections.abc import Sequence
from dataclasses import dataclass, replace
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


# Tokens per block of Mooncake's hash_ids
MOONCAKE_BLOCK_TOKENS = 512


@dataclass(frozen=True)
class PrefixBlocks:
    """The prompts' blocks as a trace names them, ``block_tokens`` tokens each: request
    i's block ids are ``ids[starts[i]:starts[i + 1]]``, each naming the whole prefix
    through its block (ragged rows in two flat arrays: a trace holds millions of ids)."""

    ids: IntArray
    starts: IntArray  # one more than there are requests
    block_tokens: int = MOONCAKE_BLOCK_TOKENS

    @classmethod
    def from_lists(cls, rows: Sequence[Sequence[int]], block_tokens: int) -> PrefixBlocks:
        """From one list of block ids per request."""
        starts = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum([len(r) for r in rows], out=starts[1:])
        flat = [h for r in rows for h in r]
        return cls(np.array(flat, dtype=np.int64), starts, block_tokens)

    def __len__(self) -> int:
        return len(self.starts) - 1

    def of(self, i: int) -> IntArray:
        """Request ``i``'s block ids."""
        return self.ids[self.starts[i] : self.starts[i + 1]]

    def take(self, index: npt.NDArray[np.int64] | npt.NDArray[np.bool_]) -> PrefixBlocks:
        """The rows ``index`` selects (a mask or positions, in that order)."""
        rows = np.flatnonzero(index) if index.dtype == np.bool_ else np.asarray(index)
        lengths = (self.starts[1:] - self.starts[:-1])[rows]
        starts = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(lengths, out=starts[1:])
        shift = np.repeat(self.starts[rows] - starts[:-1], lengths)
        return PrefixBlocks(self.ids[np.arange(starts[-1]) + shift], starts, self.block_tokens)

    def engine_hashes(self, i: int, prompt_tokens: int, block_size: int) -> tuple[int, ...]:
        """Request ``i``'s prompt as the engine's chained block hashes, one per full
        ``block_size``-token block of its ``prompt_tokens`` that its ids cover.

        Engine block k ends at token e = (k + 1) * block_size - 1, inside trace block
        j = e // block_tokens, whose id h already names the prefix through block j:
        (h, e mod block_tokens) names the prefix through engine block k, encoded as
        h * block_tokens + e mod block_tokens (distinct per pair). A trace block cut by
        the prompt's end yields only the engine blocks the prompt fills.
        """
        ids = self.of(i)
        blocks = min(prompt_tokens, len(ids) * self.block_tokens) // block_size
        if blocks <= 0:
            return ()
        end = np.arange(1, blocks + 1, dtype=np.int64) * block_size - 1
        hashes = ids[end // self.block_tokens] * self.block_tokens + end % self.block_tokens
        return tuple(hashes.tolist())


def session_keys(rows: Sequence[Sequence[int]]) -> IntArray:
    """Each request's session: its first block id after the ids every request starts
    with; -1 - i for a request i with none (a session of its own)."""
    common = list(rows[0]) if rows else []
    for row in rows:
        n = 0
        while n < len(common) and n < len(row) and row[n] == common[n]:
            n += 1
        del common[n:]
    shared = len(common)
    return np.array(
        [row[shared] if len(row) > shared else -1 - i for i, row in enumerate(rows)],
        dtype=np.int64,
    )


@dataclass(frozen=True)
class Trace:
    """Arrival offsets (s, from the first request, ascending) and token lengths; for a
    trace that names its prompts' blocks (Mooncake), those and each request's session
    key (``session_keys``), else None."""

    source: str
    arrival_s: FloatArray
    prompt_tokens: IntArray
    output_tokens: IntArray
    prefix: PrefixBlocks | None = None
    session: IntArray | None = None

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
        return replace(self, arrival_s=self.arrival_s / factor)

    def window(self, start_s: float, end_s: float) -> Trace:
        """Requests arriving in [start_s, end_s), re-based to start at 0."""
        m = (self.arrival_s >= start_s) & (self.arrival_s < end_s)
        return self.take(m, self.arrival_s[m] - start_s)

    def take(
        self, index: npt.NDArray[np.int64] | npt.NDArray[np.bool_], arrival_s: FloatArray
    ) -> Trace:
        """The requests ``index`` selects (mask or positions), arriving at ``arrival_s``."""
        return Trace(
            self.source,
            arrival_s,
            self.prompt_tokens[index],
            self.output_tokens[index],
            None if self.prefix is None else self.prefix.take(index),
            None if self.session is None else self.session[index],
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
    blocks: list[list[int]] = []
    named = False  # some line has hash_ids
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
        named = named or "hash_ids" in row
        blocks.append(_block_ids(row.get("hash_ids", []), f"{path}:{line}: key hash_ids"))
    if not times:
        raise TraceError(f"{path}: no requests (expected one JSON object per line)")
    prefix = PrefixBlocks.from_lists(blocks, MOONCAKE_BLOCK_TOKENS) if named else None
    session = session_keys(blocks) if named else None
    return _build(
        str(path), np.array(times), np.array(prompts), np.array(outputs), 1, prefix, session
    )


def _block_ids(value: object, where: str) -> list[int]:
    """A line's ``hash_ids``: a list of non-negative integers."""
    if not isinstance(value, list):
        raise TraceError(f"{where}: must be a list of block ids, got {value!r:.60}")
    for k, h in enumerate(value):
        if not isinstance(h, int) or isinstance(h, bool) or h < 0:
            raise TraceError(f"{where}: item {k} must be a non-negative integer, got {h!r:.40}")
    return value


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


def _build(
    source: str,
    t: FloatArray,
    p: IntArray,
    o: IntArray,
    first_line: int = 2,
    prefix: PrefixBlocks | None = None,
    session: IntArray | None = None,
) -> Trace:
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
        prefix = None if prefix is None else prefix.take(order)
        session = None if session is None else session[order]
    return Trace(
        source,
        (t - t[0]).astype(np.float64),
        p.astype(np.int64),
        o.astype(np.int64),
        prefix,
        session,
    )


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
