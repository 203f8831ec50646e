"""Mooncake's prompt blocks (``hash_ids``): kept per request, with a session key, and
turned into the simulated engine's block hashes."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from tests.unit.sim.test_traces import BUNDLED, write_jsonl

from rooftop_sim.traces import TraceError, TraceWarning, load_trace

# block 0 is shared by every request; 5 names a conversation of two turns, 9 another;
# the last request has nothing beyond the shared block
CONVERSATIONS = (
    '{"timestamp": 0, "input_length": 1000, "output_length": 5, "hash_ids": [0, 5]}\n'
    '{"timestamp": 1000, "input_length": 700, "output_length": 5, "hash_ids": [0, 9]}\n'
    '{"timestamp": 2000, "input_length": 1600, "output_length": 5, "hash_ids": [0, 5, 6, 7]}\n'
    '{"timestamp": 3000, "input_length": 300, "output_length": 5, "hash_ids": [0]}\n'
)


def test_the_reader_keeps_block_ids_and_derives_session_keys(tmp_path: Path) -> None:
    trace = load_trace(write_jsonl(tmp_path, CONVERSATIONS))
    assert trace.prefix is not None and trace.session is not None
    assert [trace.prefix.of(i).tolist() for i in range(4)] == [[0, 5], [0, 9], [0, 5, 6, 7], [0]]
    assert trace.session.tolist() == [5, 9, 5, -4]  # the last one: a session of its own


def test_speedup_window_and_sorting_carry_the_blocks_along(tmp_path: Path) -> None:
    trace = load_trace(write_jsonl(tmp_path, CONVERSATIONS))
    part = trace.speedup(2.0).window(0.5, 1.5)
    assert part.arrival_s.tolist() == [0.0, 0.5]
    assert part.prefix is not None and part.session is not None
    assert [part.prefix.of(i).tolist() for i in range(2)] == [[0, 9], [0, 5, 6, 7]]
    assert part.session.tolist() == [9, 5]
    late_first = "".join(reversed(CONVERSATIONS.splitlines(keepends=True)))
    with pytest.warns(TraceWarning):
        resorted = load_trace(write_jsonl(tmp_path, late_first))
    assert resorted.prefix is not None
    assert resorted.prefix.of(2).tolist() == [0, 5, 6, 7]
    assert resorted.session is not None and resorted.session.tolist()[:3] == [5, 9, 5]


def test_lines_without_hash_ids_and_csv_traces_have_no_blocks(tmp_path: Path) -> None:
    plain = '{"timestamp": 0, "input_length": 5, "output_length": 3}\n' * 2
    assert load_trace(write_jsonl(tmp_path, plain)).prefix is None
    assert load_trace(BUNDLED, max_rows=10).prefix is None


@pytest.mark.parametrize(
    ("ids", "needle"),
    [
        ("3", ":2: key hash_ids: must be a list of block ids, got 3"),
        ("[1, -2]", ":2: key hash_ids: item 1 must be a non-negative integer, got -2"),
        ("[1, 2.5]", ":2: key hash_ids: item 1 must be a non-negative integer, got 2.5"),
        ('["a"]', ":2: key hash_ids: item 0 must be a non-negative integer, got 'a'"),
        ("[true]", ":2: key hash_ids: item 0 must be a non-negative integer, got True"),
    ],
)
def test_bad_hash_ids_are_refused_naming_the_line(tmp_path: Path, ids: str, needle: str) -> None:
    good = '{"timestamp": 0, "input_length": 5, "output_length": 3, "hash_ids": [0]}\n'
    bad = f'{{"timestamp": 1, "input_length": 5, "output_length": 3, "hash_ids": {ids}}}\n'
    with pytest.raises(TraceError, match=re.escape(needle)):
        load_trace(write_jsonl(tmp_path, good + bad))


def test_engine_hashes_split_each_block_into_chained_16_token_blocks(tmp_path: Path) -> None:
    """1600 tokens over ids [0, 5, 6, 7] are 100 full 16-token blocks: 32 per 512-token
    block, all distinct. A prompt with the same first three ids shares exactly their
    96 blocks; one that differs at block 1 shares the first 32 only."""
    trace = load_trace(write_jsonl(tmp_path, CONVERSATIONS))
    assert trace.prefix is not None
    turn = trace.prefix.engine_hashes(2, 1600, 16)
    assert len(turn) == len(set(turn)) == 100
    first = trace.prefix.engine_hashes(0, 1000, 16)  # [0, 5]: the same conversation
    other = trace.prefix.engine_hashes(1, 700, 16)  # [0, 9]
    assert turn[: len(first)] == first
    assert sum(a == b for a, b in zip(turn, other, strict=False)) == 32


def test_engine_hashes_cut_at_the_prompt_and_at_the_ids(tmp_path: Path) -> None:
    """1000 tokens over two ids: 62 full blocks, the 63rd is partial and never hashed;
    a prompt longer than its ids cover is hashed as far as they go."""
    trace = load_trace(write_jsonl(tmp_path, CONVERSATIONS))
    assert trace.prefix is not None
    assert len(trace.prefix.engine_hashes(0, 1000, 16)) == 62
    assert len(trace.prefix.engine_hashes(0, 5000, 16)) == 64
    assert trace.prefix.engine_hashes(3, 15, 16) == ()
    assert len(trace.prefix.engine_hashes(3, 300, 32)) == 9  # other block sizes too
    assert np.all(np.diff(trace.prefix.starts) >= 0)
