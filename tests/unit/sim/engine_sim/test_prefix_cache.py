"""The engine's prefix cache, against vLLM V1's rules (``v1/core/block_pool.py``,
``kv_cache_manager.get_computed_blocks``, ``metrics/stats.PrefixCacheStats``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from tests.unit.sim.engine_sim.test_core import drive

from rooftop_sim.engine.core import EngineConfig, EngineCore, Request
from rooftop_sim.engine.truth import TruthModel

TRUTH = TruthModel.for_deployment("llama-3.1-8b", "h100-sxm", 1, "bf16", "auto")


def engine(kv_tokens: int = 100_000, caching: bool = True, seqs: int = 64) -> EngineCore:
    cfg = EngineConfig(kv_tokens, seqs, 2048, enable_prefix_caching=caching)
    return EngineCore(cfg, TRUTH)


def hashes(prefix: int, blocks: int) -> tuple[int, ...]:
    """Chained hashes of a prompt family: ``prefix`` names the prompt."""
    return tuple(prefix * 1000 + k for k in range(blocks))


def run_alone(eng: EngineCore, req: Request) -> Request:
    """Serve one request to its end on an otherwise idle engine."""
    drive(eng, [req])
    return req


@dataclass
class Recorder:
    """A step timer that keeps what each step was priced on."""

    prefills: list[tuple[int, float]] = field(default_factory=list)

    def step_s(self, batch: int, context: int, prefill: int, pairs: float) -> float:
        if prefill:
            self.prefills.append((prefill, pairs))
        return 0.01


def test_a_repeated_prompt_hits_all_but_the_recomputed_tail() -> None:
    """100 tokens are 6 full blocks and a partial one: the repeat finds the 6 blocks
    (96 tokens) and prefills 4. A prompt of exactly 6 blocks finds 5: vLLM looks up
    at most num_tokens - 1 tokens, so the last block is recomputed for the logits."""
    eng = engine()
    first = run_alone(eng, Request("a", 100, 3, 0.0, block_hashes=hashes(1, 6)))
    again = run_alone(eng, Request("b", 100, 3, 1.0, block_hashes=hashes(1, 6)))
    assert (first.cached_tokens, again.cached_tokens) == (0, 96)
    whole = run_alone(eng, Request("c", 96, 3, 2.0, block_hashes=hashes(1, 6)))
    assert whole.cached_tokens == 80


def test_counters_count_tokens_looked_up_and_found_as_vllm_does() -> None:
    """PrefixCacheStats.record: queries are the request's tokens, hits its cached
    tokens, once per admission; a prompt without hashes is looked up and never found."""
    eng = engine()
    for i, h in enumerate((hashes(1, 6), hashes(1, 6), ())):
        run_alone(eng, Request(str(i), 100, 3, float(i), block_hashes=h))
    assert eng.counters.prefix_queries == 300
    assert eng.counters.prefix_hits == 96
    assert eng.counters.prompt_tokens == 300  # every prompt token still counts as a prompt


def test_cached_tokens_are_attended_but_not_prefilled() -> None:
    """The repeat's step prefills 4 tokens, each attending the 96 cached ones plus the
    new ones before it: 4 * 96 + 4 * 5 / 2 attention pairs."""
    timer = Recorder()
    eng = EngineCore(EngineConfig(100_000, 64, 2048), timer)
    run_alone(eng, Request("a", 100, 1, 0.0, block_hashes=hashes(1, 6)))
    run_alone(eng, Request("b", 100, 1, 1.0, block_hashes=hashes(1, 6)))
    assert timer.prefills == [(100, 100 * 101 / 2), (4, 4 * 96 + 4 * 5 / 2)]


def test_two_running_requests_hold_a_shared_prefix_once() -> None:
    """A holds its 10 prompt blocks and 1 for its next token; B, the same prompt,
    finds 9 (the 10th is recomputed into a private copy): 12 blocks in use, not 21."""
    eng = engine()
    a = Request("a", 160, 50, 0.0, block_hashes=hashes(1, 10))
    b = Request("b", 160, 50, 0.0, block_hashes=hashes(1, 10))
    eng.add_request(a)
    eng.step(0.0)
    eng.add_request(b)
    eng.step(1.0)
    assert b.cached_tokens == 144 and eng.num_running == 2
    assert eng.config.num_blocks - eng.free_blocks == 12
    drive(eng, [])
    assert eng.free_blocks == eng.config.num_blocks and eng.kv_usage == 0.0


def test_cached_blocks_of_finished_requests_count_as_free() -> None:
    """vLLM's kv_cache_usage counts free cached blocks as free: an idle engine reads 0
    while it still holds the prompt for the next request."""
    eng = engine()
    run_alone(eng, Request("a", 100, 3, 0.0, block_hashes=hashes(1, 6)))
    assert eng.kv_usage == 0.0 and eng.cache.cached_blocks == 6


def test_a_full_cache_evicts_the_least_recently_used_block_first() -> None:
    """8 blocks. P1, P2, P3 (33 tokens: 2 cached blocks and a partial one each) leave
    6 cached blocks and 2 empty ones; P1 again moves its blocks to the back of the
    queue. P4 (65 tokens) needs 5 blocks: the 2 empty ones, then P2's two (its tail first) and
    P3's second: P2 is then missed, P3 found for one block, P1 for both."""
    eng = engine(kv_tokens=8 * 16)
    p = {i: hashes(i, 2) for i in (1, 2, 3)}
    for t, i in enumerate((1, 2, 3, 1)):
        run_alone(eng, Request(f"p{i}-{t}", 33, 1, float(t), block_hashes=p[i]))
    run_alone(eng, Request("p4", 65, 1, 5.0, block_hashes=hashes(4, 4)))
    found = {i: eng.cache.longest_hit(p[i], 2)[0] for i in (1, 2, 3)}
    assert found == {1: 2, 2: 0, 3: 1}
    missed = run_alone(eng, Request("p2-again", 33, 1, 6.0, block_hashes=p[2]))
    assert missed.cached_tokens == 0


def test_preemption_and_recompute_still_work_with_hashes() -> None:
    """12 requests sharing a 10-block system prompt overflow a 128-block cache: they
    are preempted and recomputed, all finish, every block comes back, and each one's
    tokens are looked up once (a preempted request's re-admission is not counted)."""
    eng = engine(kv_tokens=2048, seqs=16)
    reqs = [
        Request(f"r{i}", 300, 200, 0.0, block_hashes=hashes(0, 10) + hashes(i + 1, 18)[10:])
        for i in range(12)
    ]
    drive(eng, reqs)
    assert eng.counters.preemptions > 0
    assert all(r.out == 200 and r.finished_reason == "length" for r in reqs)
    assert eng.free_blocks == eng.config.num_blocks
    assert eng.counters.prefix_queries == 12 * 300 and eng.counters.prompt_tokens == 12 * 300
    assert eng.counters.prefix_hits >= 11 * 160  # all but the first find the system prompt


def test_a_preempted_request_finds_its_own_prompt_when_it_is_readmitted() -> None:
    """Distinct prompts: no request finds another's blocks, so the counted hits are 0,
    yet recomputing after preemption prefills less than without the cache: the victim's
    prompt blocks were still cached when it came back."""

    def prefilled(caching: bool) -> tuple[int, int, int]:
        timer = Recorder()
        eng = EngineCore(EngineConfig(2048, 16, 2048, enable_prefix_caching=caching), timer)
        reqs = [Request(f"r{i}", 300, 200, 0.0, block_hashes=hashes(i, 18)) for i in range(12)]
        drive(eng, reqs)
        tokens = sum(n for n, _ in timer.prefills)
        return tokens, eng.counters.preemptions, eng.counters.prefix_hits

    cached, preempted, hits = prefilled(True)
    plain, _, _ = prefilled(False)
    assert preempted > 0 and hits == 0
    assert cached < plain


def test_prefix_caching_off_never_hits_nor_counts() -> None:
    """--no-enable-prefix-caching: no look-up, so vLLM records no queries either."""
    eng = engine(caching=False)
    for i in range(2):
        req = run_alone(eng, Request(str(i), 100, 3, float(i), block_hashes=hashes(1, 6)))
        assert req.cached_tokens is None
    assert (eng.counters.prefix_queries, eng.counters.prefix_hits) == (0, 0)
    assert eng.cache.cached_blocks == 0
