"""What the controller sees: one window's readings of one target.

``Reading`` is a metric value with whether it can be trusted (``MetricState``: ok,
missing, stale, nan); ``Observation`` is every reading of a window plus the
Deployment's pod counts. Separate from the decision (``control``) because the operator's
Prometheus client and the simulator's metrics window build these, and neither needs the
control law or the planner to do it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum
from typing import Final, Literal

from rooftop_control.signals import (
    ITERATION_TOKENS_HISTOGRAM,
    ITL_HISTOGRAM,
    OUTPUT_TOKENS_HISTOGRAM,
    PREFIX_HITS_COUNTER,
    PREFIX_QUERIES_COUNTER,
    PROMPT_TOKENS_HISTOGRAM,
    REQUEST_TPOT_HISTOGRAM,
    RUNNING_GAUGE,
    SERVED_QUANTILES,
    SPEC_ACCEPTED_COUNTER,
    SPEC_DRAFT_TOKENS_COUNTER,
    SPEC_DRAFTS_COUNTER,
    SUCCESS_COUNTER,
    TTFT_HISTOGRAM,
    WAITING_GAUGE,
    Arrivals,
    Attainment,
    Fallback,
    Gauge,
    IntervalCounts,
    Quantile,
    Rate,
    Ratio,
    Served,
    declared,
    query_names,
    signal,
)
from rooftop_planner.bursts import BURST_INTERVAL_S


class MetricState(StrEnum):
    """Whether a reading can be trusted."""

    OK = "ok"
    MISSING = "missing"  # no series (target down, never scraped, query returned nothing)
    STALE = "stale"  # the newest sample is older than the scrape allows
    NAN = "nan"  # NaN or infinite (histogram_quantile over an empty window)


_BADNESS = {MetricState.OK: 0, MetricState.NAN: 1, MetricState.STALE: 2, MetricState.MISSING: 3}


@dataclass(frozen=True)
class Reading:
    """One metric value and whether it can be trusted; ``value`` is NaN unless OK."""

    value: float = math.nan
    state: MetricState = MetricState.MISSING

    @classmethod
    def of(cls, value: float | None, age_s: float = 0.0, max_age_s: float = math.inf) -> Reading:
        """Classify a raw sample: None is missing, NaN/inf is nan, too old is stale."""
        if value is None:
            return cls()
        if not math.isfinite(value):
            return cls(math.nan, MetricState.NAN)
        if age_s > max_age_s:
            return cls(math.nan, MetricState.STALE)
        return cls(float(value), MetricState.OK)

    @property
    def ok(self) -> bool:
        """True when the value is usable."""
        return self.state is MetricState.OK


def served_name(length: str, of: str | float) -> str:
    """A served-length reading's field (and query) name: ``served_prompt_tokens`` for
    the mean, ``served_prompt_tokens_p90`` for the 0.9 quantile."""
    base = f"served_{length}_tokens"
    return base if of == "mean" else f"{base}_p{round(float(of) * 100)}"


def _served(length: Literal["prompt", "output"], of: Literal["mean"] | float) -> Reading:
    """The row of one served-length reading (the 15-minute prompt or output lengths):
    every such row differs only in the length and what of it is read."""
    histogram = PROMPT_TOKENS_HISTOGRAM if length == "prompt" else OUTPUT_TOKENS_HISTOGRAM
    figure = "mean" if of == "mean" else f"p{round(of * 100)}"
    return signal(
        Reading(),
        query=served_name(length, of),
        promql=Served(histogram, of),
        scale=1.0,
        unit="tokens",
        simulated=f"{figure} {length} length over the served range",
    )


@dataclass(frozen=True)
class Observation:
    """What the metrics said over the last window (all replicas of one target).

    Attributes:
        tpot_ms: the SLO's percentile of per-request time per output token, ms.
        ttft_ms: the SLO's percentile of time to first token, ms.
        requests_per_second: arrival (or completion) rate over the window, req/s.
        running: requests in running batches, summed over ready replicas.
        waiting: requests queued, summed over ready replicas.
        kv_usage_ratio: KV-cache usage, mean over ready replicas, 0..1.
        step_ms: mean inter-token latency over the window, ms (for calibration).
        step_batch: decode tokens per engine iteration over the same window, the mean
            running batch of one replica's step (inter-token latency count over the
            iterations' count); unlike ``running``, an instant gauge, it describes the
            steps ``step_ms`` averages, so the two still agree while the fleet or the
            load changes within the window.
        tpot_attainment: share 0..1 of the window's requests whose TPOT met the bound
            (a histogram bucket at the bound over the count).
        prompt_tokens / output_tokens: mean lengths of requests in the window, tokens.
        served_requests: requests finished over ``defaults.SERVED_RANGE`` (15 min),
            which the ``served_*`` lengths describe.
        served_prompt_tokens / served_output_tokens: mean lengths over that range,
            tokens: the workload the loop plans for (``traffic``).
        served_prompt_tokens_p10 ... _p99, served_output_tokens_p10 ... _p99: their
            quantiles over it (``signals.SERVED_QUANTILES``), tokens, interpolated in vLLM's
            1-2-5 buckets.
        served_prefix_hit_ratio: share 0..1 of the prompt tokens vLLM found in its prefix
            cache over that range (``vllm:prefix_cache_hits`` over ``_queries``): the
            prefill the cache saved, which the loop plans with (``traffic``).
        served_accepted_per_draft: draft tokens accepted per verification step that
            carried drafts, over that range (speculative decoding; NaN without it).
        served_draft_length: draft tokens per such step over that range, the K the
            engine's schedule gave its batches; with the one above, the per-token
            acceptance the loop plans with (``traffic``).
        served_drafted_share: steps that carried drafts over every decode step of a
            request (vLLM observes one inter-token latency per request and decode
            step), over that range: under 1 where prompt lookup found no match.
        served_requests_per_second: requests finished per second over that range, the
            mean of its 15-s counts (``rooftop_planner.bursts.BURST_INTERVAL_S``), req/s.
        served_arrival_dispersion: those counts' variance over their mean, how bursty the
            traffic is (1: Poisson), which the planner holds capacity for (``traffic``).
        ready_replicas: pods ready to serve (from the Deployment, always known).
        pending_replicas: pods created but not ready yet.
        outdated_replicas: pods still on the previous pod template, which a rollout
            (a new batch cap) is replacing: the Deployment's ``status.replicas`` minus
            ``status.updatedReplicas``. Pods starting for a scale-up are not among them.
    """

    # Each reading is an engine signal, declared here (``rooftop_control.signals``).
    tpot_ms: Reading = signal(
        Reading(),
        query="tpot_s",
        promql=Quantile(REQUEST_TPOT_HISTOGRAM, "tpot"),
        scale=1e3,
        unit="ms",
        status_key="tpotMs",
        status_noise_count="window_requests",
        simulated="the SLO quantile of the window's finished requests' TPOT",
    )
    ttft_ms: Reading = signal(
        Reading(),
        query="ttft_s",
        promql=Quantile(TTFT_HISTOGRAM, "ttft"),
        scale=1e3,
        unit="ms",
        status_key="ttftMs",
        status_noise_count="window_requests",
        simulated="the SLO quantile of the window's first tokens' TTFT",
    )
    requests_per_second: Reading = signal(
        Reading(),
        query="requests_per_second",
        promql=Arrivals(SUCCESS_COUNTER, (RUNNING_GAUGE, WAITING_GAUGE)),
        scale=1.0,
        unit="req/s",
        status_key="requestsPerSecond",
        status_noise_count="window_requests",
        simulated="the arrival rate over the window",
        # completions + deriv(in the engines): a draining queue dips it below zero
        at_least=0.0,
        # deriv() needs two samples in the window; completions alone do not
        fallback=Fallback("completions_per_second", Rate(SUCCESS_COUNTER)),
    )
    running: Reading = signal(
        Reading(),
        query="running",
        promql=Gauge(RUNNING_GAUGE),
        scale=1.0,
        unit="requests",
        status_key="running",
        status_noise_count="itself",
        simulated="running requests summed over ready replicas",
        status_noise_floor=1.0,
    )
    waiting: Reading = signal(
        Reading(),
        query="waiting",
        promql=Gauge(WAITING_GAUGE),
        scale=1.0,
        unit="requests",
        status_key="waiting",
        status_noise_count="itself",
        simulated="queued requests summed over ready replicas",
        status_noise_floor=1.0,
    )
    kv_usage_ratio: Reading = signal(
        Reading(),
        query="kv_usage_ratio",
        promql=Gauge("vllm:kv_cache_usage_perc", "max"),  # the fullest replica
        scale=1.0,
        unit="ratio",
        status_key="kvCacheUsageRatio",
        status_noise_count="running",
        simulated="the fullest replica's KV-cache usage",
        status_noise_floor=0.02,
    )
    step_ms: Reading = signal(
        Reading(),
        query="step_s",
        promql=Ratio(f"{ITL_HISTOGRAM}_sum", f"{ITL_HISTOGRAM}_count"),
        scale=1e3,
        unit="ms",
        simulated="decoded tokens' mean wait for their step over the window",
    )
    step_batch: Reading = signal(
        Reading(),
        query="step_batch",
        promql=Ratio(f"{ITL_HISTOGRAM}_count", f"{ITERATION_TOKENS_HISTOGRAM}_count"),
        scale=1.0,
        unit="tokens/step",
        simulated="decoded tokens per engine iteration over the window",
    )
    tpot_attainment: Reading = signal(
        Reading(),
        query="tpot_attainment",
        promql=Attainment(REQUEST_TPOT_HISTOGRAM),
        scale=1.0,
        unit="ratio",
        simulated="share of the window's finished requests within the TPOT bound",
    )
    prompt_tokens: Reading = signal(
        Reading(),
        query="prompt_tokens",
        promql=Ratio(f"{PROMPT_TOKENS_HISTOGRAM}_sum", f"{PROMPT_TOKENS_HISTOGRAM}_count"),
        scale=1.0,
        unit="tokens",
        simulated="mean prompt length of the window's finished requests",
    )
    output_tokens: Reading = signal(
        Reading(),
        query="output_tokens",
        promql=Ratio(f"{OUTPUT_TOKENS_HISTOGRAM}_sum", f"{OUTPUT_TOKENS_HISTOGRAM}_count"),
        scale=1.0,
        unit="tokens",
        simulated="mean output length of the window's finished requests",
    )
    served_requests: Reading = signal(
        Reading(),
        query="served_requests",
        promql=Served(PROMPT_TOKENS_HISTOGRAM, "count"),
        scale=1.0,
        unit="requests",
        simulated="requests finished over the served range",
    )
    served_prompt_tokens: Reading = _served("prompt", "mean")
    served_prompt_tokens_p10: Reading = _served("prompt", 0.1)
    served_prompt_tokens_p50: Reading = _served("prompt", 0.5)
    served_prompt_tokens_p90: Reading = _served("prompt", 0.9)
    served_prompt_tokens_p99: Reading = _served("prompt", 0.99)
    served_output_tokens: Reading = _served("output", "mean")
    served_output_tokens_p10: Reading = _served("output", 0.1)
    served_output_tokens_p50: Reading = _served("output", 0.5)
    served_output_tokens_p90: Reading = _served("output", 0.9)
    served_output_tokens_p99: Reading = _served("output", 0.99)
    served_prefix_hit_ratio: Reading = signal(
        Reading(),
        query="served_prefix_hit_ratio",
        promql=Ratio(PREFIX_HITS_COUNTER, PREFIX_QUERIES_COUNTER, served=True),
        scale=1.0,
        unit="ratio",
        status_key="prefixCacheHitRatio",
        simulated="prompt tokens found in the prefix cache over those looked up, over the "
        "served range",
        status_noise_floor=0.02,
    )
    served_accepted_per_draft: Reading = signal(
        Reading(),
        query="served_accepted_per_draft",
        promql=Ratio(SPEC_ACCEPTED_COUNTER, SPEC_DRAFTS_COUNTER, served=True),
        scale=1.0,
        unit="tokens",
        status_key="acceptedDraftTokens",
        simulated="draft tokens accepted per step that verified drafts, over the served range",
        status_noise_floor=0.05,
    )
    served_draft_length: Reading = signal(
        Reading(),
        query="served_draft_length",
        promql=Ratio(SPEC_DRAFT_TOKENS_COUNTER, SPEC_DRAFTS_COUNTER, served=True),
        scale=1.0,
        unit="tokens",
        simulated="draft tokens per step that verified drafts, over the served range",
    )
    served_drafted_share: Reading = signal(
        Reading(),
        query="served_drafted_share",
        promql=Ratio(SPEC_DRAFTS_COUNTER, f"{ITL_HISTOGRAM}_count", served=True),
        scale=1.0,
        unit="ratio",
        simulated="decode steps that verified drafts over every request's decode steps, "
        "over the served range",
    )
    served_requests_per_second: Reading = signal(
        Reading(),
        query="served_requests_per_second",
        promql=IntervalCounts(SUCCESS_COUNTER, "mean"),
        scale=1.0 / BURST_INTERVAL_S,
        unit="req/s",
        simulated="requests finished in each 15-s interval of the served range, their mean",
    )
    served_arrival_dispersion: Reading = signal(
        Reading(),
        query="served_arrival_dispersion",
        promql=IntervalCounts(SUCCESS_COUNTER, "dispersion"),
        scale=1.0,
        unit="ratio",
        simulated="requests finished in each 15-s interval of the served range, their "
        "variance over their mean",
    )
    ready_replicas: int = 0
    pending_replicas: int = 0
    outdated_replicas: int = 0
    # A mixed fleet's pools: (GPU id, its pods' own ``step_ms``, its ``step_batch``) over
    # the window, what each GPU type's own step-time factor is learnt from; empty for one
    # GPU type (``sizing.FleetPlanner.observed``).
    pool_steps: tuple[tuple[str, Reading, Reading], ...] = ()

    def served_prompt(self) -> tuple[Reading, ...]:
        """The served prompt lengths: mean, then ``SERVED_QUANTILES``."""
        return self._served_lengths("prompt")

    def served_output(self) -> tuple[Reading, ...]:
        """The served output lengths: mean, then ``SERVED_QUANTILES``."""
        return self._served_lengths("output")

    def _served_lengths(self, length: str) -> tuple[Reading, ...]:
        names = [served_name(length, q) for q in ("mean", *SERVED_QUANTILES)]
        return tuple(getattr(self, name) for name in names)

    def gating(self) -> list[tuple[str, Reading]]:
        """The readings that must be OK before scaling down, by name.

        Latency is excused when the rate is a trustworthy zero: with no requests,
        histogram_quantile is NaN by construction, and an idle target must still be
        able to shrink.
        """
        names = ["requests_per_second", "running", "waiting", "kv_usage_ratio"]
        if not (self.requests_per_second.ok and self.requests_per_second.value <= 0):
            names.append("tpot_ms")
        return [(n, getattr(self, n)) for n in names]

    def unhealthy(self) -> list[str]:
        """Gating readings that are not OK, as ``name: state`` (empty when healthy)."""
        return [f"{n}: {r.state.value}" for n, r in self.gating() if not r.ok]

    def state(self) -> MetricState:
        """The worst state of the gating readings."""
        return max((r.state for _, r in self.gating()), key=_BADNESS.__getitem__)


# The engine signals, in field order, and every query name a snapshot may be asked for.
SIGNALS: Final = declared(Observation)
QUERY_NAMES: Final = query_names(SIGNALS)
