"""Prometheus metrics with vLLM's exact names, types, labels and default buckets.

Source of truth: the vLLM release Rooftop deploys (settings.VLLM_VERSION, 0.32.0):
tests/e2e/test_vllm_metrics.py checks every family Rooftop reads against its CPU build,
family by family (name, type, help, label names, buckets). Everything lives in a dedicated
``CollectorRegistry`` so several simulated engines can run in one process (tests)
without clashing.
prometheus_client appends ``_total`` to counters, so counters are named without it;
``vllm:iteration_tokens_total`` is a histogram in vLLM and keeps its odd name.
All durations are observed in the engine's (simulated) seconds.
"""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from rooftop_sim.engine.core import EngineCore, Request, StepResult

TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
ITL_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
REQUEST_LATENCY_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
ITERATION_TOKENS_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
LABELS = ("model_name", "engine")
# vLLM 0.32 pre-creates request_success for every finish reason it has (checked against
# the real engine by tests/e2e/test_vllm_metrics.py); the simulator finishes requests
# with stop, length or abort only.
FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")


def build_1_2_5_buckets(max_value: int) -> list[float]:
    """vLLM's 1-2-5 series up to and including ``max_value``: 1, 2, 5, 10, 20, 50, ..."""
    out: list[float] = []
    exp = 0
    while True:
        for m in (1, 2, 5):
            v = m * 10**exp
            if v > max_value:
                return out
            out.append(float(v))
        exp += 1


class VllmMetrics:
    """The metric families engine-sim exposes, bound to one (model_name, engine="0")."""

    def __init__(
        self,
        model_name: str,
        max_model_len: int,
        cache_info: dict[str, str],
        num_speculative_tokens: int = 0,
    ) -> None:
        self.registry = CollectorRegistry()
        self._lv = (model_name, "0")
        self.running = self._gauge(
            "vllm:num_requests_running", "Number of requests in model execution batches."
        )
        self.waiting = self._gauge(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed."
        )
        self.kv_usage = self._gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."
        )
        keys = sorted(cache_info)
        info = Gauge(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            (*keys, "engine"),
            registry=self.registry,
        )
        info.labels(*(cache_info[k] for k in keys), "0").set(1)
        self.prompt_tokens = self._counter(
            "vllm:prompt_tokens", "Number of prefill tokens processed."
        )
        self.generation_tokens = self._counter(
            "vllm:generation_tokens", "Number of generation tokens processed."
        )
        # vLLM counts prefix-cache look-ups in tokens, once per admission of a request
        # never preempted (PrefixCacheStats), as the engine's counters do
        self.prefix_cache_queries = self._counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
        )
        self.prefix_cache_hits = self._counter(
            "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."
        )
        self.preemptions = self._counter(
            "vllm:num_preemptions", "Cumulative number of preemption from the engine."
        )
        self._success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            (*LABELS, "finished_reason"),
            registry=self.registry,
        )
        for reason in FINISHED_REASONS:  # pre-created, so rate() has a baseline
            self._success.labels(*self._lv, reason)
        self._build_histograms(max_model_len)
        self._spec: tuple[Counter, Counter, Counter, list[Counter]] | None = None
        if num_speculative_tokens:
            self._build_spec_decode(num_speculative_tokens)

    def _build_spec_decode(self, num_speculative_tokens: int) -> None:
        """vLLM's SpecDecodingProm (vllm/v1/spec_decode/metrics.py): present only when
        the engine speculates; the per-position counter for each draft position."""
        per_pos = Counter(
            "vllm:spec_decode_num_accepted_tokens_per_pos",
            "Accepted tokens per draft position.",
            (*LABELS, "position"),
            registry=self.registry,
        )
        self._spec_seen = [0] * (3 + num_speculative_tokens)  # totals counted so far
        self._spec = (
            self._counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts."),
            self._counter("vllm:spec_decode_num_draft_tokens", "Number of draft tokens."),
            self._counter("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens."),
            [per_pos.labels(*self._lv, str(pos)) for pos in range(num_speculative_tokens)],
        )

    def count_spec_decode(self, engine: EngineCore) -> None:
        """Bring the spec-decode counters up to the engine's (its counters are totals)."""
        if self._spec is None:
            return
        drafts, tokens, accepted, per_pos = self._spec
        c = engine.counters
        pairs = [(drafts, c.spec_drafts), (tokens, c.spec_draft_tokens)]
        pairs += [(accepted, c.spec_accepted), *zip(per_pos, c.spec_accepted_per_pos, strict=True)]
        for i, (counter, total) in enumerate(pairs):
            counter.inc(total - self._spec_seen[i])
            self._spec_seen[i] = total

    def _gauge(self, name: str, doc: str) -> Gauge:
        g: Gauge = Gauge(name, doc, LABELS, registry=self.registry).labels(*self._lv)
        return g

    def _counter(self, name: str, doc: str) -> Counter:
        c: Counter = Counter(name, doc, LABELS, registry=self.registry).labels(*self._lv)
        return c

    def _hist(self, name: str, doc: str, buckets: Sequence[float]) -> Histogram:
        h = Histogram(name, doc, LABELS, buckets=buckets, registry=self.registry)
        child: Histogram = h.labels(*self._lv)
        return child

    def _build_histograms(self, max_model_len: int) -> None:
        h, lat = self._hist, REQUEST_LATENCY_BUCKETS
        self.iteration_tokens = h(
            "vllm:iteration_tokens_total",
            "Histogram of number of tokens per engine_step.",
            ITERATION_TOKENS_BUCKETS,
        )
        self.ttft = h(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            TTFT_BUCKETS,
        )
        self.itl = h(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            ITL_BUCKETS,
        )
        self.tpot = h(
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            ITL_BUCKETS,
        )
        self.e2e = h(
            "vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", lat
        )
        self.queue = h(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            lat,
        )
        self.inference = h(
            "vllm:request_inference_time_seconds",
            "Histogram of time spent in RUNNING phase for request.",
            lat,
        )
        self.prefill = h(
            "vllm:request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request.",
            lat,
        )
        self.decode = h(
            "vllm:request_decode_time_seconds",
            "Histogram of time spent in DECODE phase for request.",
            lat,
        )
        tok = build_1_2_5_buckets(max_model_len)
        self.req_prompt = h(
            "vllm:request_prompt_tokens", "Number of prefill tokens processed.", tok
        )
        self.req_gen = h(
            "vllm:request_generation_tokens", "Number of generation tokens processed.", tok
        )
        self.req_max_tokens = h(
            "vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.", tok
        )

    def set_gauges(self, engine: EngineCore) -> None:
        """Refresh running / waiting / KV usage from the engine."""
        self.running.set(engine.num_running)
        self.waiting.set(engine.num_waiting)
        self.kv_usage.set(engine.kv_usage)

    def on_step(self, res: StepResult) -> None:
        """Per-iteration observations: tokens, TTFT, inter-token gaps, preemptions."""
        self.iteration_tokens.observe(res.num_tokens)
        if res.prefix_queries:
            self.prefix_cache_queries.inc(res.prefix_queries)
            self.prefix_cache_hits.inc(res.prefix_hits)
        if res.preempted:
            self.preemptions.inc(len(res.preempted))
        self.generation_tokens.inc(len(res.tokens))
        for ev in res.tokens:
            if ev.drafted:
                continue  # one gap per request and step, as vLLM observes
            if ev.itl_s is None:
                ttft = ev.request.ttft_s
                self.ttft.observe(ttft if ttft is not None else 0.0)
                self.prompt_tokens.inc(ev.request.prompt_tokens)
            else:
                self.itl.observe(ev.itl_s)

    def count_finished(self, reason: str) -> None:
        """One more request finished for ``reason`` (stop, length, abort...)."""
        self._success.labels(*self._lv, reason).inc()

    def on_finish(self, req: Request) -> None:
        """Per-request observations, made when it finishes (as vLLM does)."""
        self.count_finished(req.finished_reason or "abort")
        if req.finished_s is None:
            return
        self.e2e.observe(req.finished_s - req.arrival_s)
        self.req_prompt.observe(req.prompt_tokens)
        self.req_gen.observe(req.out)
        self.req_max_tokens.observe(req.max_tokens)
        if req.scheduled_s is not None:
            self.queue.observe(req.scheduled_s - req.arrival_s)
            last = req.last_token_s if req.last_token_s is not None else req.finished_s
            self.inference.observe(last - req.scheduled_s)
            if req.first_token_s is not None:
                self.prefill.observe(req.first_token_s - req.scheduled_s)
                self.decode.observe(last - req.first_token_s)
        if req.tpot_s is not None:
            self.tpot.observe(req.tpot_s)
