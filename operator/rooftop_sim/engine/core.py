"""A pure, clock-agnostic continuous-batching engine modelled on vLLM V1's scheduler.

No I/O and no clock: the driver passes ``now`` (seconds, any epoch: wall clock for the
HTTP server, simulated time for ``rooftop simulate``). ``step(now)`` schedules one engine
iteration starting at ``now``, advances all request state immediately, and returns the
iteration's duration (from the truth model) plus the tokens it emits at ``now + duration``.
The driver must not call ``step`` again before that end time; requests that arrive in
between are added with ``add_request`` and considered by the next step.

Scheduling (as vLLM V1 with chunked prefill, FCFS policy):
- one token budget per step (``max_num_batched_tokens``) shared by decodes and prefills;
- running requests first, in admission order: one token for a decode, the remaining
  prompt (capped by the budget) for a request still prefilling;
- KV cache in ``block_size``-token blocks; when a running request needs a block and none
  is free, the most recently admitted running request is preempted (recompute: its blocks
  are freed and it goes back to the head of the queue, to prefill prompt+output again);
- waiting requests are admitted FCFS while ``len(running) < max_num_seqs``, budget and
  blocks remain, and no preemption happened in this step.
Token accounting: a request has ``prompt + out`` known tokens; ``computed`` of them have KV.
A step that brings ``computed`` up to ``prompt + out`` samples one new token (``out += 1``).

Prefix caching (vLLM's automatic prefix caching, on by default as in V1; the block rules
are ``prefix_cache.PrefixCache``'s): a request carries the hashes of its prompt's full
blocks (``Request.block_hashes``). When it is admitted with nothing computed, the longest
run of its leading blocks found in the cache counts as computed, capped so that at least
one token is computed (vLLM recomputes the last token for its logits, a whole block when
the prompt fills its blocks exactly). Those tokens are not prefilled but are attended by
the ones that are. Admissions count vLLM's ``prefix_cache_queries`` (the request's tokens)
and ``prefix_cache_hits`` (its cached tokens); a preempted request's look-up on
re-admission is not counted, as vLLM keeps those apart (``PrefixCacheStats.preempted_*``).
Output blocks are never cached: their tokens are not known to the simulator.

Speculative decoding (``EngineConfig.speculation``, vLLM's --speculative-config): each
step looks up the draft length K for its batch size in the schedule (vLLM's
``num_speculative_tokens_per_batch_size``, the last range's K beyond it), and every
decoding request brings 1 + K tokens to the step (budget and KV blocks for all of them;
fewer drafts near its max_tokens). Each request has its own per-token acceptance, drawn
when it arrives from a beta distribution around the configured mean (requests differ:
code and RAG accept more than chat); each draft is accepted with that chance while the
ones before it were, so a step yields 1 + accepted tokens. Rejected drafts' KV is
dropped (their blocks stay allocated). The timer prices the step with its drafts
(``StepTimer``). Counters follow vLLM's spec-decode families: drafts, draft tokens,
accepted tokens, accepted per position.
"""

from __future__ import annotations

import math
import random
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

from rooftop_sim.engine.prefix_cache import PrefixCache


class StepTimer(Protocol):
    """What the engine needs from the truth model (``TruthModel`` satisfies it)."""

    def step_s(
        self,
        decode_batch: int,
        decode_context_tokens: int,
        prefill_tokens: int,
        prefill_attn_pairs: float,
        draft_tokens: int = 0,
        draft_k: int = 0,
    ) -> float: ...


@dataclass(frozen=True)
class Speculation:
    """What the engine drafts: the draft length per batch size (inclusive ranges
    (first, last, K), as vLLM's schedule) and the per-token acceptance requests draw
    theirs around: beta with that mean and ``concentration`` (a + b of the beta; 20
    gives a standard deviation of 0.1 around 0.7). ``lookup``: the method that drafts on
    the host (``ngram``, prompt lookup; ``suffix``, suffix trees; None: none), timed
    there (``TruthModel.with_lookup``); this engine finds a match at every step, so its
    acceptance is per decode step, as the planner's."""

    schedule: tuple[tuple[int, int, int], ...]
    acceptance: float
    concentration: float = 20.0
    seed: int = 0
    num_tokens: int = 0  # vLLM's num_speculative_tokens (0: the schedule's largest K)
    lookup: str | None = None

    @property
    def positions(self) -> int:
        """Draft positions vLLM counts acceptance at: num_speculative_tokens."""
        return self.num_tokens or max((k for _, _, k in self.schedule), default=0)

    def draft_length(self, batch: int) -> int:
        """K for a step of ``batch`` requests (the last range's beyond the schedule)."""
        for first, last, k in self.schedule:
            if first <= batch <= last:
                return k
        return self.schedule[-1][2] if self.schedule else 0


@dataclass(frozen=True)
class EngineConfig:
    """Engine limits. Token counts; ``kv_capacity_tokens`` from ``TruthModel``."""

    kv_capacity_tokens: int
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192  # vLLM V1's default for online serving
    max_model_len: int = 8192
    block_size: int = 16
    enable_prefix_caching: bool = True  # vLLM's --enable-prefix-caching, on in V1
    speculation: Speculation | None = None  # vLLM's --speculative-config

    @property
    def num_blocks(self) -> int:
        """Whole KV blocks in the cache."""
        return self.kv_capacity_tokens // self.block_size


@dataclass(eq=False)
class Request:
    """One request and its lifecycle timestamps (seconds, driver's clock; None = not yet).

    ``block_hashes``: one per full ``block_size``-token block of the prompt, each naming
    the whole prefix through its block (chained); empty: the prompt is never found in the
    prefix cache (it is still looked up). ``cached_tokens``: prompt tokens found there at
    its first admission (vLLM's ``num_cached_tokens``); None until then, and always None
    when prefix caching is off.
    """

    request_id: str
    prompt_tokens: int
    max_tokens: int
    arrival_s: float
    block_hashes: tuple[int, ...] = ()
    cached_tokens: int | None = None
    out: int = 0  # output tokens sampled so far
    computed: int = 0  # tokens whose KV is in the cache
    blocks: int = 0  # KV blocks held, shared cached ones included
    held: list[int] = field(default_factory=list, repr=False)  # cached hashes it holds
    hashed: int = 0  # leading block_hashes already found or cached for this admission
    num_preemptions: int = 0
    acceptance: float = 0.0  # this request's per-token draft acceptance (speculation)
    scheduled_s: float | None = None  # first admitted (end of queueing)
    first_token_s: float | None = None
    last_token_s: float | None = None
    finished_s: float | None = None
    finished_reason: str | None = None  # "length" | "abort"

    @property
    def known(self) -> int:
        """Tokens the model has seen or produced: prompt plus sampled output."""
        return self.prompt_tokens + self.out

    @property
    def queue_s(self) -> float | None:
        """Arrival to first scheduling (vLLM request_queue_time_seconds)."""
        return None if self.scheduled_s is None else self.scheduled_s - self.arrival_s

    @property
    def ttft_s(self) -> float | None:
        """Arrival to first token (vLLM time_to_first_token_seconds)."""
        return None if self.first_token_s is None else self.first_token_s - self.arrival_s

    @property
    def e2e_s(self) -> float | None:
        """Arrival to finish (vLLM e2e_request_latency_seconds)."""
        return None if self.finished_s is None else self.finished_s - self.arrival_s

    @property
    def tpot_s(self) -> float | None:
        """Mean time per output token after the first (request_time_per_output_token)."""
        if self.first_token_s is None or self.last_token_s is None or self.out < 2:
            return None
        return (self.last_token_s - self.first_token_s) / (self.out - 1)


@dataclass(frozen=True)
class TokenEvent:
    """One sampled token: which request, its 0-based output index, and the gap (s) since
    that request's previous token (None for the first token)."""

    request: Request
    index: int
    itl_s: float | None
    # a further token of the same step (an accepted draft): vLLM observes one gap per
    # request and step, so none is counted for it
    drafted: bool = False


@dataclass
class StepResult:
    """One iteration: [start_s, end_s) and what happened in it. Tokens appear at end_s."""

    start_s: float
    duration_s: float
    tokens: list[TokenEvent] = field(default_factory=list)
    finished: list[Request] = field(default_factory=list)
    admitted: list[Request] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)
    prefill_tokens: int = 0
    decode_tokens: int = 0
    prefix_queries: int = 0  # tokens looked up in the prefix cache by this step's admissions
    prefix_hits: int = 0  # of which found there
    draft_tokens: int = 0  # speculative tokens the step verified
    drafts: int = 0  # requests whose drafts it verified
    accepted: int = 0  # draft tokens accepted

    @property
    def end_s(self) -> float:
        """When the iteration's tokens are emitted."""
        return self.start_s + self.duration_s

    @property
    def num_tokens(self) -> int:
        """Tokens processed in the iteration (vLLM iteration_tokens_total)."""
        return self.prefill_tokens + self.decode_tokens


@dataclass
class Counters:
    """Monotonic engine counters (vLLM's *_total counters)."""

    prompt_tokens: int = 0
    generation_tokens: int = 0
    preemptions: int = 0
    prefix_queries: int = 0  # tokens looked up in the prefix cache (vLLM's queries)
    prefix_hits: int = 0  # tokens found there (vLLM's hits)
    finished: dict[str, int] = field(default_factory=dict)  # finished_reason -> count
    # speculative decoding, as vLLM's spec_decode_* counters
    spec_drafts: int = 0  # requests' drafts verified (one per request and step)
    spec_draft_tokens: int = 0
    spec_accepted: int = 0
    spec_accepted_per_pos: list[int] = field(default_factory=list)
    steps: int = 0
    busy_s: float = 0.0


@dataclass
class _Batch:
    """Work chosen for one iteration: (request, new tokens) pairs and step-time inputs."""

    work: list[tuple[Request, int, int]] = field(default_factory=list)  # req, tokens, drafts
    decode_batch: int = 0
    decode_context: int = 0
    prefill_tokens: int = 0
    attn_pairs: float = 0.0
    draft_tokens: int = 0
    draft_k: int = 0

    def add(self, req: Request, n: int, drafts: int = 0) -> None:
        self.work.append((req, n, drafts))
        if n == 1 + drafts and req.computed + 1 == req.known and req.out > 0:
            self.decode_batch += 1
            self.decode_context += req.computed + 1
            self.draft_tokens += drafts
            self.draft_k = max(self.draft_k, drafts)
        else:
            self.prefill_tokens += n
            # each new token attends to the cached context plus the new tokens before it
            self.attn_pairs += n * req.computed + n * (n + 1) / 2


class EngineCore:
    """Continuous-batching engine state machine. See the module docstring."""

    def __init__(self, config: EngineConfig, timer: StepTimer) -> None:
        if config.num_blocks < 1:
            raise ValueError("KV cache holds no block: model does not fit the GPU memory")
        self.config = config
        self.timer = timer
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.cache = PrefixCache(config.num_blocks, config.enable_prefix_caching)
        self.counters = Counters()
        self._ids: dict[str, Request] = {}
        spec = config.speculation
        self._rng = random.Random(spec.seed if spec else 0)
        if spec is not None:
            self.counters.spec_accepted_per_pos = [0] * spec.positions

    # ---- gauges ------------------------------------------------------------------
    @property
    def num_running(self) -> int:
        """Requests admitted and not finished (vllm:num_requests_running)."""
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        """Requests queued, including preempted ones (vllm:num_requests_waiting)."""
        return len(self.waiting)

    @property
    def free_blocks(self) -> int:
        """KV blocks no request holds, cached ones included (vLLM's free queue)."""
        return self.cache.free_blocks

    @property
    def kv_usage(self) -> float:
        """Fraction 0..1 of KV blocks in use (vllm:kv_cache_usage_perc)."""
        return 1.0 - self.free_blocks / self.config.num_blocks

    def has_work(self) -> bool:
        """True when a step would schedule something."""
        return bool(self.running or self.waiting)

    # ---- requests ----------------------------------------------------------------
    def add_request(self, req: Request) -> None:
        """Queue a request. Raises ValueError if it can never be served (too long)."""
        total = req.prompt_tokens + req.max_tokens
        if req.prompt_tokens < 1 or req.max_tokens < 1:
            raise ValueError("prompt_tokens and max_tokens must be >= 1")
        if total > self.config.max_model_len:
            raise ValueError(
                f"prompt ({req.prompt_tokens}) + max_tokens ({req.max_tokens}) = {total} "
                f"exceeds max_model_len {self.config.max_model_len}"
            )
        if math.ceil(total / self.config.block_size) > self.config.num_blocks:
            raise ValueError(f"request needs {total} tokens of KV; cache holds fewer")
        if req.request_id in self._ids:
            raise ValueError(f"duplicate request id {req.request_id!r}")
        self._ids[req.request_id] = req
        spec = self.config.speculation
        if spec is not None:
            a, b = spec.acceptance * spec.concentration, (1 - spec.acceptance) * spec.concentration
            req.acceptance = self._rng.betavariate(a, b)
        self.waiting.append(req)

    def abort(self, request_id: str, now: float) -> Request | None:
        """Drop a request (client went away); frees its KV. None if unknown or done."""
        req = self._ids.pop(request_id, None)
        if req is None:
            return None
        if req in self.running:
            self.running.remove(req)
        else:
            self.waiting.remove(req)
        self._finish(req, now, "abort")
        return req

    def _finish(self, req: Request, now: float, reason: str) -> None:
        self._release(req)
        req.finished_s = now
        req.finished_reason = reason
        self._ids.pop(req.request_id, None)
        self.counters.finished[reason] = self.counters.finished.get(reason, 0) + 1

    def _release(self, req: Request) -> None:
        """Free the request's blocks; its cached ones stay findable until evicted."""
        self.cache.free(req.held, req.blocks - len(req.held))
        req.blocks, req.held, req.hashed = 0, [], 0

    # ---- one iteration -----------------------------------------------------------
    def step(self, now: float) -> StepResult | None:
        """Run one iteration starting at ``now`` (s). None when there is nothing to do.

        State advances immediately; the tokens in the result are emitted at ``end_s``.
        """
        if not self.has_work():
            return None
        res = StepResult(start_s=now, duration_s=0.0)
        batch = _Batch()
        budget = self._schedule_running(batch, self.config.max_num_batched_tokens, res)
        if not res.preempted:  # as vLLM: no new admissions in a step that had to preempt
            self._schedule_waiting(batch, budget, res, now)
        if not batch.work:
            return None
        # the drafts only where there are some: a timer that never speculates takes four
        drafts = (batch.draft_tokens, batch.draft_k) if batch.draft_tokens else ()
        res.duration_s = self.timer.step_s(
            batch.decode_batch,
            batch.decode_context,
            batch.prefill_tokens,
            batch.attn_pairs,
            *drafts,
        )
        res.draft_tokens = batch.draft_tokens
        res.prefill_tokens = batch.prefill_tokens
        res.decode_tokens = batch.decode_batch
        self._complete(batch, res)
        return res

    def _blocks_needed(self, req: Request, n: int) -> int:
        return math.ceil((req.computed + n) / self.config.block_size) - req.blocks

    def _schedule_running(self, batch: _Batch, budget: int, res: StepResult) -> int:
        """Give running requests their tokens, preempting from the tail when KV runs out."""
        i = 0
        spec = self.config.speculation
        k = spec.draft_length(len(self.running)) if spec is not None else 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            n = min(req.known - req.computed, budget)
            drafts = 0
            if k and n == 1 and req.out > 0:  # decoding: drafts ride along, not past max_tokens
                drafts = max(min(k, req.max_tokens - req.out - 1, budget - 1), 0)
                n += drafts
            need = self._blocks_needed(req, n)
            if need:  # most decode steps fill a block they hold already
                if not self._make_room(req, need, res):
                    break  # it preempted itself: every request after it is gone too
                self.cache.allocate(need)
                req.blocks += need
            if req.hashed < len(req.block_hashes):
                self._cache_full_blocks(req, n)
            batch.add(req, n, drafts)
            budget -= n
            i += 1
        return budget

    def _make_room(self, req: Request, need: int, res: StepResult) -> bool:
        """Preempt from the tail until ``need`` blocks are free; False if ``req`` went."""
        while need > self.free_blocks:
            victim = self.running.pop()  # lowest priority under FCFS: admitted last
            self._preempt(victim, res)
            if victim is req:
                return False
        return True

    def _preempt(self, req: Request, res: StepResult) -> None:
        """Recompute-style preemption: drop its KV (its cached blocks stay findable),
        requeue it at the head."""
        self._release(req)
        req.computed = 0
        req.num_preemptions += 1
        self.counters.preemptions += 1
        self.waiting.appendleft(req)
        res.preempted.append(req)

    def _schedule_waiting(self, batch: _Batch, budget: int, res: StepResult, now: float) -> None:
        """Admit queued requests FCFS while seats, token budget and KV blocks last."""
        size, cache = self.config.block_size, self.cache
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            req = self.waiting[0]  # nothing computed: new, or preempted (recompute)
            hit, idle = cache.longest_hit(req.block_hashes, (req.known - 1) // size)
            n = min(req.known - hit * size, budget)
            need = math.ceil((hit * size + n) / size) - hit
            # cached blocks nobody holds leave the free queue as new ones would
            if need + idle > cache.free_blocks:
                break
            self.waiting.popleft()
            cache.touch(req.block_hashes, hit)
            cache.allocate(need)
            req.held, req.hashed = list(req.block_hashes[:hit]), hit
            req.blocks, req.computed = hit + need, hit * size
            self._count_lookup(req, res)
            self._cache_full_blocks(req, n)
            self.running.append(req)
            batch.add(req, n)
            budget -= n
            if req.scheduled_s is None:
                req.scheduled_s = now
                res.admitted.append(req)

    def _count_lookup(self, req: Request, res: StepResult) -> None:
        """vLLM's prefix-cache stats of an admission: its tokens looked up and those
        found (``computed``), counted for requests never preempted only."""
        if not self.cache.enabled:
            return
        if req.cached_tokens is None:
            req.cached_tokens = req.computed
        if req.num_preemptions == 0:
            res.prefix_queries += req.known
            res.prefix_hits += req.computed
            self.counters.prefix_queries += req.known
            self.counters.prefix_hits += req.computed

    def _cache_full_blocks(self, req: Request, n: int) -> None:
        """Cache the prompt blocks that ``n`` more tokens fill (vLLM caches them when it
        schedules those tokens, so a request admitted later in the step finds them)."""
        hashes = req.block_hashes
        full = min(len(hashes), (req.computed + n) // self.config.block_size)
        if full <= req.hashed:
            return
        req.held += self.cache.register(hashes[req.hashed : full])
        req.hashed = full

    def _complete(self, batch: _Batch, res: StepResult) -> None:
        """Apply the iteration: advance KV, sample tokens, retire finished requests."""
        end = res.end_s
        done: list[Request] = []
        for req, n, drafts in batch.work:
            req.computed += n - drafts
            if req.computed < req.known:
                continue  # a prefill chunk that did not reach the end of the prompt
            if req.first_token_s is None:
                req.first_token_s = end
                self.counters.prompt_tokens += req.prompt_tokens
            accepted = self._accepted(req, drafts)
            res.drafts += drafts > 0
            res.accepted += accepted
            itl = None if req.last_token_s is None else end - req.last_token_s
            for extra in range(1 + accepted):  # vLLM observes one gap per request and step
                res.tokens.append(TokenEvent(req, req.out, itl, drafted=extra > 0))
                req.out += 1
            req.computed += accepted
            req.last_token_s = end
            self.counters.generation_tokens += 1 + accepted
            if req.out >= req.max_tokens:
                done.append(req)
        if done:
            gone = set(map(id, done))
            self.running = [r for r in self.running if id(r) not in gone]
            for req in done:
                self._finish(req, end, "length")
            res.finished.extend(done)
        self.counters.steps += 1
        self.counters.busy_s += res.duration_s

    def _accepted(self, req: Request, drafts: int) -> int:
        """Drafts accepted in a row, each with the request's acceptance (the first
        rejection ends the run), counted as vLLM's spec-decode counters are."""
        if drafts == 0:
            return 0
        accepted = 0
        while accepted < drafts and self._rng.random() < req.acceptance:
            accepted += 1
        c = self.counters
        c.spec_drafts += 1
        c.spec_draft_tokens += drafts
        c.spec_accepted += accepted
        for pos in range(accepted):
            c.spec_accepted_per_pos[pos] += 1
        return accepted
