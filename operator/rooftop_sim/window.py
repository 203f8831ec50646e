"""Prometheus, emulated: what a ``rate(...[1m])`` / ``histogram_quantile(...)`` query
would return at a scrape, computed from the simulation's per-request samples.

Percentiles are exact quantiles of the samples observed in the window (no bucket
interpolation): the simulator measures the policy, not the histogram layout. Counters
(inter-token latency sum and count) are accumulated per scrape interval, so a window is
a sum over its intervals, like ``rate()`` over scraped counter values.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from rooftop_control.defaults import SERVED_RANGE_S
from rooftop_control.readings import MetricState, Observation, Reading, served_name
from rooftop_control.signals import SERVED_QUANTILES
from rooftop_planner.bursts import BURST_INTERVAL_S, dispersion


@dataclass(frozen=True)
class Gauges:
    """Instant gauges summed (running, waiting) or averaged (KV) over ready pods, and the
    Deployment's pod counts (``outdated``: pods a batch-cap rollout has yet to replace)."""

    running: float
    waiting: float
    kv_usage_ratio: float
    ready: int
    pending: int
    outdated: int = 0


class MetricsWindow:
    """Samples of the last ``window_s`` seconds, as Prometheus would hold them.

    Args:
        window_s: range of the rate/quantile queries, s.
        tpot_quantile / ttft_quantile: the SLO percentiles as 0..1 quantiles.
        tpot_slo_ms: the TPOT bound, ms (for the attainment reading).
    """

    def __init__(
        self, window_s: float, tpot_quantile: float, ttft_quantile: float, tpot_slo_ms: float
    ) -> None:
        self.window_s = window_s
        self.tpot_slo_s = tpot_slo_ms / 1e3
        self.tpot_q = tpot_quantile
        self.ttft_q = ttft_quantile
        # (time s, value) in roughly increasing time; trimmed at each scrape
        self.finished: deque[tuple[float, float, int, int]] = deque()  # t, tpot s, isl, osl
        # (t, isl, osl, prompt tokens looked up in the prefix cache, found there) of
        # requests finished over the longer served range
        self.served: deque[tuple[float, int, int, int, int]] = deque()
        self.ttft: deque[tuple[float, float]] = deque()
        # t, itl sum s, decode tokens, iterations
        self.intervals: deque[tuple[float, float, int, int]] = deque()
        self.itl_sum = 0.0
        self.itl_tokens = 0
        self.iterations = 0
        # (t, drafts, draft tokens, accepted, requests decoded) of every step from the
        # first that verified drafts on (none for an engine that does not speculate)
        self.speculated: deque[tuple[float, int, int, int, int]] = deque()

    def add_finished(
        self,
        t_s: float,
        tpot_s: float,
        prompt: int,
        output: int,
        queried: int | None = None,
        cached: int = 0,
    ) -> None:
        """A request finished at ``t_s`` with this TPOT (s; NaN for one output token)
        and these prompt and output lengths (tokens); ``queried`` tokens were looked up
        in the prefix cache (vLLM's ``prefix_cache_queries``; None: the whole prompt, as
        an engine with the cache on does; 0 with it off) and ``cached`` found there."""
        self.finished.append((t_s, tpot_s, prompt, output))
        looked_up = prompt if queried is None else queried
        self.served.append((t_s, prompt, output, looked_up, cached))

    def add_step(
        self,
        duration_s: float,
        decode_tokens: int,
        t_s: float = 0.0,
        drafts: tuple[int, int, int] = (0, 0, 0),
    ) -> None:
        """One engine iteration (vLLM's ``iteration_tokens_total`` count, prefill-only
        ones included): each decoded token waited ``duration_s`` for it. ``drafts``:
        the requests whose drafts it verified, their draft tokens and those accepted
        (vLLM's spec-decode counters), at ``t_s``."""
        self.itl_sum += duration_s * decode_tokens
        self.itl_tokens += decode_tokens
        self.iterations += 1
        if drafts[0] or self.speculated:
            self.speculated.append((t_s, *drafts, decode_tokens))

    def observe(
        self, now_s: float, rate: float, gauges: Gauges, outage: bool = False
    ) -> Observation:
        """The observation a scrape at ``now_s`` yields (``outage``: metrics missing).

        Args:
            now_s: scrape time, s.
            rate: arrivals per second over the window, req/s.
            gauges: instant gauges at ``now_s``.
            outage: emulate a broken metrics pipeline (all readings missing).
        """
        self.intervals.append((now_s, self.itl_sum, self.itl_tokens, self.iterations))
        self.itl_sum, self.itl_tokens, self.iterations = 0.0, 0, 0
        start = now_s - self.window_s
        for q in (self.finished, self.ttft, self.intervals):
            while q and q[0][0] <= start:
                q.popleft()
        while self.served and self.served[0][0] <= now_s - SERVED_RANGE_S:
            self.served.popleft()
        while self.speculated and self.speculated[0][0] <= now_s - SERVED_RANGE_S:
            self.speculated.popleft()
        if outage:
            return Observation(
                ready_replicas=gauges.ready,
                pending_replicas=gauges.pending,
                outdated_replicas=gauges.outdated,
            )
        return self._observation(now_s, rate, gauges)

    def _observation(self, now_s: float, rate: float, gauges: Gauges) -> Observation:
        fin = [f for f in self.finished if f[0] <= now_s]
        tpots = [f[1] for f in fin if not math.isnan(f[1])]
        ttfts = [v for t, v in self.ttft if t <= now_s]
        itl_sum = sum(i[1] for i in self.intervals)
        itl_n = sum(i[2] for i in self.intervals)
        steps = sum(i[3] for i in self.intervals)
        observed = Observation(
            tpot_ms=_quantile_ms(tpots, self.tpot_q),
            ttft_ms=_quantile_ms(ttfts, self.ttft_q),
            requests_per_second=_ok(rate),
            running=_ok(gauges.running),
            waiting=_ok(gauges.waiting),
            kv_usage_ratio=_ok(gauges.kv_usage_ratio),
            step_ms=_ok(1e3 * itl_sum / itl_n) if itl_n else Reading(math.nan, MetricState.NAN),
            step_batch=_ok(itl_n / steps) if steps else Reading(math.nan, MetricState.NAN),
            tpot_attainment=_share([t <= self.tpot_slo_s for t in tpots]),
            prompt_tokens=_mean([f[2] for f in fin]),
            output_tokens=_mean([f[3] for f in fin]),
            ready_replicas=gauges.ready,
            pending_replicas=gauges.pending,
            outdated_replicas=gauges.outdated,
        )
        served: dict[str, Any] = self._served(now_s)  # Reading fields by name
        return replace(observed, **served)

    def _served(self, now_s: float) -> dict[str, Reading]:
        """The ``served_*`` readings: lengths and the prefix-cache hit ratio over the
        served range."""
        served = [f for f in self.served if f[0] <= now_s]
        prompts = [f[1] for f in served]
        outputs = [f[2] for f in served]
        queried = sum(f[3] for f in served)
        readings = {
            "served_requests": _ok(len(prompts)),
            **_interval_counts([f[0] for f in served], now_s),
            # hits over queries of the range; 0 / 0 is NaN, as in Prometheus
            "served_prefix_hit_ratio": (
                _ok(sum(f[4] for f in served) / queried)
                if queried
                else Reading(math.nan, MetricState.NAN)
            ),
        }
        readings |= self._drafting(now_s)
        for length, values in (("prompt", prompts), ("output", outputs)):
            readings[served_name(length, "mean")] = _mean(values)
            knots = zip(SERVED_QUANTILES, _quantiles(values, SERVED_QUANTILES), strict=True)
            readings |= {served_name(length, q): knot for q, knot in knots}
        return readings

    def _drafting(self, now_s: float) -> dict[str, Reading]:
        """Accepted and drafted tokens per step that verified drafts over the served
        range, and the share of requests' decode steps that did (NaN without any, as
        Prometheus' 0 / 0)."""
        steps = [s for s in self.speculated if s[0] <= now_s]
        drafts = sum(s[1] for s in steps)
        if not drafts:
            nan = Reading(math.nan, MetricState.NAN)
            names = ("served_accepted_per_draft", "served_draft_length", "served_drafted_share")
            return dict.fromkeys(names, nan)
        return {
            "served_accepted_per_draft": _ok(sum(s[3] for s in steps) / drafts),
            "served_draft_length": _ok(sum(s[2] for s in steps) / drafts),
            "served_drafted_share": _ok(drafts / max(sum(s[4] for s in steps), drafts)),
        }


def _interval_counts(finished_s: list[float], now_s: float) -> dict[str, Reading]:
    """The requests finished in each ``BURST_INTERVAL_S`` interval of the served range
    (those the run has reached): their mean per second, and the variance of consecutive
    counts' differences, halved, over their mean, as the operator's subqueries read them."""
    start = max(now_s - SERVED_RANGE_S, 0.0)
    intervals = int((now_s - start) // BURST_INTERVAL_S)
    nan = Reading(math.nan, MetricState.NAN)
    if intervals < 1:
        return {"served_requests_per_second": nan, "served_arrival_dispersion": nan}
    edges = now_s - BURST_INTERVAL_S * np.arange(intervals, -1, -1)
    counts = np.histogram(finished_s, bins=edges)[0]
    mean = float(counts.mean())
    spread = dispersion(counts)
    return {
        "served_requests_per_second": _ok(mean / BURST_INTERVAL_S),
        "served_arrival_dispersion": _ok(spread) if math.isfinite(spread) else nan,
    }


def _ok(value: float) -> Reading:
    return Reading(float(value), MetricState.OK)


def _quantile_ms(samples: list[float], q: float) -> Reading:
    """histogram_quantile over an empty window is NaN; so is this."""
    if not samples:
        return Reading(math.nan, MetricState.NAN)
    return _ok(1e3 * float(np.quantile(samples, q)))


def _quantiles(values: list[int], qs: tuple[float, ...]) -> list[Reading]:
    """Exact quantiles of ``values``, one sort for all (the served range holds thousands
    of requests); NaN readings when there are none."""
    if not values:
        return [Reading(math.nan, MetricState.NAN) for _ in qs]
    return [_ok(float(v)) for v in np.quantile(values, qs)]


def _share(flags: list[bool]) -> Reading:
    if not flags:
        return Reading(math.nan, MetricState.NAN)
    return _ok(sum(flags) / len(flags))


def _mean(values: list[int]) -> Reading:
    if not values:
        return Reading(math.nan, MetricState.NAN)
    return _ok(sum(values) / len(values))
