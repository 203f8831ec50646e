"""The prefix benchmark (``benchmarks/bench_prefix.py``): what it states about a trace
is what a user would measure on it, and the target it plans states just that."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

from rooftop_sim.traces import load_trace


@pytest.fixture(scope="module")
def bench(load_benchmark: Callable[[str], ModuleType]) -> ModuleType:
    return load_benchmark("bench_prefix")


def test_the_measured_hits_and_gaps_are_the_traces(bench: ModuleType, tmp_path: Path) -> None:
    """Session 1's second turn repeats its two blocks (1,024 of 2,000 tokens hit, on top
    of block 0 for every later prompt); its turns are 10 s apart, session 2 has one."""
    rows = [
        {"timestamp": 0, "input_length": 1024, "output_length": 10, "hash_ids": [0, 1]},
        {"timestamp": 4000, "input_length": 1000, "output_length": 10, "hash_ids": [0, 5]},
        {"timestamp": 10000, "input_length": 2000, "output_length": 30, "hash_ids": [0, 1, 2, 3]},
    ]
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    stats = bench.measured(load_trace(path))
    assert stats["hit_one_replica"] == pytest.approx((512 + 1024) / 4024)
    assert stats["session_gap_s"] == pytest.approx(10.0)
    assert stats["rate"] == pytest.approx(3 / 10.0)


def test_the_stated_session_share_is_what_one_unbounded_replica_hits(bench: ModuleType) -> None:
    stats = {"rate": 3.0, "prompt_mean": 10_000.0, "prompt_p90": 20_000.0, "output_mean": 300.0,
             "output_p90": 600.0, "hit_one_replica": 0.4, "session_gap_s": 90.0}  # fmt: skip
    prefix = bench.target(stats, prefix=True, client_ip=False).workload.prefix
    assert prefix.shared_tokens == bench.SHARED_TOKENS
    assert 512 + prefix.session_share * (10_000 - 512) == pytest.approx(4000, abs=10)
    assert prefix.session_gap_seconds == 90.0
    assert bench.target(stats, prefix=False, client_ip=False).workload.prefix is None
