"""The continuous-batching engine core, driven in simulated time."""

from __future__ import annotations

import numpy as np
import pytest

from rooftop_sim.engine.core import EngineConfig, EngineCore, Request
from rooftop_sim.engine.truth import TruthModel

TRUTH = TruthModel.for_deployment("llama-3.1-8b", "h100-sxm", 1, "bf16", "auto")


def engine(**kw: int) -> EngineCore:
    cfg = {"kv_capacity_tokens": 100_000, "max_num_seqs": 64, "max_num_batched_tokens": 2048}
    cfg.update(kw)
    return EngineCore(EngineConfig(**cfg), TRUTH)


def drive(eng: EngineCore, reqs: list[Request]) -> float:
    """Discrete-event loop: add arrivals when due, step while busy. Returns the end time."""
    pending = sorted(reqs, key=lambda r: r.arrival_s)
    now, i = 0.0, 0
    while i < len(pending) or eng.has_work():
        while i < len(pending) and pending[i].arrival_s <= now:
            eng.add_request(pending[i])
            i += 1
        res = eng.step(now)
        if res is not None:
            now = res.end_s
        elif i < len(pending):
            now = pending[i].arrival_s  # idle until the next arrival
    return now


def test_single_request_lifecycle() -> None:
    eng = engine()
    req = Request("a", prompt_tokens=100, max_tokens=5, arrival_s=0.0)
    eng.add_request(req)
    first = eng.step(0.0)
    assert first is not None and first.prefill_tokens == 100 and len(first.tokens) == 1
    assert req.first_token_s == pytest.approx(first.duration_s)
    end = drive(eng, [])
    assert req.out == 5 and req.finished_reason == "length" and req.finished_s == end
    assert req.queue_s == 0.0 and req.tpot_s is not None and req.tpot_s > 0
    assert eng.counters.generation_tokens == 5 and eng.counters.prompt_tokens == 100
    assert eng.free_blocks == eng.config.num_blocks and eng.kv_usage == 0.0
    assert eng.step(end) is None


def test_queueing_beyond_max_num_seqs() -> None:
    eng = engine(max_num_seqs=4)
    reqs = [Request(f"r{i}", 50, 20, 0.0) for i in range(10)]
    for r in reqs:
        eng.add_request(r)
    eng.step(0.0)
    assert eng.num_running == 4 and eng.num_waiting == 6
    drive(eng, [])
    queue = [r.queue_s for r in reqs]
    assert queue[:4] == [0.0] * 4 and all(q is not None and q > 0 for q in queue[4:])
    assert all(r.out == 20 for r in reqs)


def test_chunked_prefill_splits_long_prompt() -> None:
    eng = engine(max_num_batched_tokens=512)
    long = Request("long", 3000, 3, 0.0)
    eng.add_request(long)
    steps = 0
    while long.first_token_s is None:
        res = eng.step(steps * 1.0)
        assert res is not None and res.num_tokens <= 512
        steps += 1
    assert steps == 6  # ceil(3000 / 512)


def test_decodes_interleave_with_a_long_prefill() -> None:
    eng = engine(max_num_batched_tokens=256)
    short = Request("short", 10, 50, 0.0)
    eng.add_request(short)
    eng.step(0.0)
    eng.add_request(Request("long", 4000, 2, 0.0))
    res = eng.step(1.0)
    assert res is not None and res.decode_tokens == 1 and res.prefill_tokens == 255
    assert [t.request.request_id for t in res.tokens] == ["short"]


def test_preemption_when_kv_runs_out() -> None:
    eng = engine(kv_capacity_tokens=2048, max_num_seqs=16)
    reqs = [Request(f"r{i}", 300, 200, 0.0) for i in range(12)]
    drive(eng, reqs)
    assert eng.counters.preemptions > 0
    assert sum(r.num_preemptions for r in reqs) == eng.counters.preemptions
    assert all(r.out == 200 and r.finished_reason == "length" for r in reqs)
    assert eng.free_blocks == eng.config.num_blocks
    # recompute re-prefills but counts the prompt once
    assert eng.counters.prompt_tokens == 12 * 300


def test_ttft_grows_with_load() -> None:
    def mean_ttft(rate: float) -> float:
        rng = np.random.default_rng(1)
        t = np.cumsum(rng.exponential(1 / rate, size=150))
        reqs = [Request(f"r{i}", 1000, 100, float(a)) for i, a in enumerate(t)]
        drive(engine(max_num_seqs=32), reqs)
        return float(np.mean([r.ttft_s for r in reqs]))

    light, heavy = mean_ttft(2.0), mean_ttft(60.0)
    assert heavy > 3 * light


def test_rejects_impossible_requests_and_aborts() -> None:
    eng = engine(max_model_len=1000)
    with pytest.raises(ValueError, match="max_model_len"):
        eng.add_request(Request("x", 900, 200, 0.0))
    with pytest.raises(ValueError):
        eng.add_request(Request("y", 0, 10, 0.0))
    req = Request("z", 100, 50, 0.0)
    eng.add_request(req)
    eng.step(0.0)
    assert eng.kv_usage > 0
    assert eng.abort("z", 1.0) is req and req.finished_reason == "abort"
    assert eng.kv_usage == 0.0 and not eng.has_work()
    assert eng.counters.finished == {"abort": 1}
