"""Read one ServingTarget's serving metrics from Prometheus (HTTP API, PromQL).

Every value comes back as the control law's own ``Reading``, whose ``state`` says what
it is worth:

- ``OK``: a number; ``+Inf`` is OK too (histogram_quantile above the last finite
  bucket: "worse than the largest bucket", which a controller must act on);
- ``MISSING``: no series matched (engine not scraped yet, wrong selector), or
  Prometheus could not answer (unreachable, timed out, rejected the query, more than one
  series): the answer's ``error`` says which;
- ``STALE``: series exist but the newest sample is older than ``stale_after_s`` (scrapes
  stopped);
- ``NAN``: the query returned NaN (e.g. no requests in the window, so the quantile of an
  empty histogram is NaN).

Missing data is never turned into zeros: a controller that scales on "0 waiting" because
Prometheus was down would scale in at the worst moment.

Every engine series carries the labels the PodMonitor (or scrape config) attaches to its
pod, ``namespace`` and ``servingtarget``. One set of queries reads every target at once,
aggregated by those labels (``fleet_queries``), so what a tick asks Prometheus does not
grow with the number of targets. Freshness is checked once per snapshot with
``max by (namespace, servingtarget) (timestamp(vllm:num_requests_running))`` against the
query's evaluation time, because a gauge is present whenever a pod is scraped, and applied
once, here, to each target's readings.
"""

from __future__ import annotations

import asyncio
import math
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import aiohttp

from rooftop_control import defaults, signals
from rooftop_control.durations import parse_duration_s
from rooftop_control.readings import QUERY_NAMES, SIGNALS, MetricState, Reading
from rooftop_planner.bursts import BURST_INTERVAL_S

# Bounds of vLLM's TPOT histogram up to 5 s (a unit test keeps them among the simulated
# engine's buckets, which tests/e2e/test_vllm_metrics.py checks against the real vLLM).
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0)
FRESHNESS_GAUGE = signals.RUNNING_GAUGE


@dataclass(frozen=True)
class Answer:
    """One instant query's answer: the reading and, when Prometheus failed, why."""

    reading: Reading
    error: str = ""
    eval_time: float | None = None  # Prometheus' evaluation time, s since the epoch

    @classmethod
    def failed(cls, why: str) -> Answer:
        """An answer that tells nothing: missing data, with the reason."""
        return cls(Reading(), why)


@dataclass(frozen=True)
class TargetMetrics:
    """A snapshot of one ServingTarget: readings by query name (``fleet_queries``), in
    Prometheus' units (seconds, req/s, tokens, ratios), freshness already applied; a
    mixed fleet's ``pools``: the ``POOL_SIGNALS``' readings by query name and pool."""

    readings: Mapping[str, Reading]
    newest_sample_age_s: float | None = None
    errors: Sequence[str] = ()
    pools: Mapping[str, Mapping[str, Reading]] = field(default_factory=dict)

    def pool(self, name: str, pool: str) -> Reading:
        """One pool's reading of a ``POOL_SIGNALS`` query; missing when there is none."""
        return self.pools.get(name, {}).get(pool, Reading())

    def get(self, name: str) -> Reading:
        """The reading of one query; missing when the snapshot did not ask for it. A
        name no signal declares (``rooftop_control.signals``) is a KeyError: a typo
        would otherwise read as missing metrics and hold every scale-down."""
        if name not in QUERY_NAMES:
            raise KeyError(f"{name!r} is not a declared query: {sorted(QUERY_NAMES)}")
        return self.readings.get(name, Reading())


def attainment_bucket(slo_ms: float) -> float | None:
    """The largest bucket bound (s) within the SLO: the share below it under-counts
    attainment (conservative), never over-counts. None when the SLO is below them all."""
    within = [b for b in TPOT_BUCKETS if b * 1e3 <= slo_ms + 1e-9]
    return max(within) if within else None


def le_pattern(bound_s: float) -> str:
    """A PromQL regex for a bucket's ``le`` label as any Prometheus stores it.

    Why not one string: vLLM's prometheus_client writes whole bounds as ``1.0`` and
    ``5.0``; Prometheus 2 keeps the text as scraped, Prometheus 3 normalises it to ``1``.
    An exact ``le="1"`` matched nothing on Prometheus 2, so a TPOT SLO of 1 s or more had
    no attainment reading there.
    """
    text = f"{bound_s:g}"
    whole = "." not in text and "e" not in text
    return f"{text}|{text}.0" if whole else text


def check_window(window: str) -> str:
    """``window`` if it is a positive PromQL duration (range of rate(), e.g. "2m", in
    ``rooftop_control.durations``' grammar), else ValueError."""
    if parse_duration_s(window) <= 0:
        raise ValueError(f"window must be longer than zero, got {window!r}")
    return window


def fleet_queries(window: str, tpot_q: float, ttft_q: float, tpot_slo_ms: float) -> dict[str, str]:
    """The same queries for every target at once, one series per (namespace,
    servingtarget): what one tick asks Prometheus does not grow with the targets."""
    return _queries(check_window(window), tpot_q, ttft_q, tpot_slo_ms)


# The labels every engine series carries (PodMonitor relabelings), naming its target.
GROUP_LABELS = ("namespace", "servingtarget")
# A mixed fleet's engine series also carry their pool (GPU id), and the loop reads these
# signals (``Observation`` fields) per pool as well: each GPU type's own step time and
# batch, which its step-time factor is calibrated from (``sizing.FleetPlanner``).
POOL_GROUP = (*GROUP_LABELS, "pool")
POOL_SIGNALS = ("step_ms", "step_batch")


def pool_queries(window: str) -> dict[str, str]:
    """The ``POOL_SIGNALS``' queries for every target's pools at once, one series per
    (namespace, servingtarget, pool); a target of one GPU type has none."""
    promql = _Promql(check_window(window), {}, None, '{servingtarget!="",pool!=""}', POOL_GROUP)
    rows = [s for s in SIGNALS if s.field in POOL_SIGNALS]
    return {s.query: expr for s in rows if (expr := promql.render(s.promql)) is not None}


def _queries(w: str, tpot_q: float, ttft_q: float, tpot_slo_ms: float) -> dict[str, str]:
    """PromQL by query name over every target's engine series, aggregated by target: one
    expression per declared signal (``readings.SIGNALS``) and fallback. The attainment is
    left out when no histogram bucket sits at the TPOT bound."""
    promql = _Promql(w, {"tpot": tpot_q, "ttft": ttft_q}, attainment_bucket(tpot_slo_ms))
    asked = [(s.query, s.promql) for s in SIGNALS]
    asked += [(s.fallback.query, s.fallback.promql) for s in SIGNALS if s.fallback]
    out = {name: promql.render(query) for name, query in asked}
    return {name: expr for name, expr in out.items() if expr is not None}


@dataclass(frozen=True)
class _Promql:
    """Renders a signal's ``Query`` as PromQL over every target's engine series, grouped
    by target, over ``window``."""

    window: str
    quantiles: Mapping[str, float]  # the SLO's percentile, by what it bounds
    bucket_s: float | None  # the TPOT histogram's bucket at the bound, if any
    series: str = '{servingtarget!=""}'
    group: tuple[str, ...] = GROUP_LABELS  # what each series answers for

    def agg(self, fn: str, expr: str) -> str:
        return f"{fn} by ({', '.join(self.group)}) ({expr})"

    def rate(self, counter: str, over: str | None = None) -> str:
        return self.agg("sum", f"rate({counter}{self.series}[{over or self.window}])")

    def served(self, histogram: str, of: str | float) -> str:
        """A histogram over ``defaults.SERVED_RANGE``: its mean, count or a quantile."""
        over = defaults.SERVED_RANGE
        if of == "count":
            return self.agg("sum", f"increase({histogram}_count{self.series}[{over}])")
        if of == "mean":
            return (
                f"{self.rate(f'{histogram}_sum', over)} / {self.rate(f'{histogram}_count', over)}"
            )
        return self.quantile(histogram, float(of), over)

    def render(self, query: signals.Query) -> str | None:
        """The expression; None for an attainment with no bucket at the bound."""
        match query:
            case signals.Quantile(histogram, percentile_of):
                return self.quantile(histogram, self.quantiles[percentile_of])
            case signals.Served(histogram, of):
                return self.served(histogram, of)
            case signals.Ratio(numerator, denominator, served):
                over = defaults.SERVED_RANGE if served else None
                return f"{self.rate(numerator, over)} / {self.rate(denominator, over)}"
            case signals.Gauge(series, aggregate):
                return self.agg(aggregate, f"{series}{self.series}")
            case signals.Rate(counter):
                return self.rate(counter)
            case signals.Arrivals(completions, held):
                # The subquery step is left to Prometheus (its evaluation interval): a
                # fixed coarse step leaves deriv() two or three points per window, and its
                # noise became phantom load (3.1 req/s read at 1.5 offered in the loop e2e).
                inside = " + ".join(self.agg("sum", f"{g}{self.series}") for g in held)
                return f"{self.rate(completions)} + deriv(({inside})[{self.window}:])"
            case signals.Attainment(histogram):
                return self.attainment(histogram)
            case signals.IntervalCounts(counter, of):
                return self.interval_counts(counter, of)
        raise TypeError(f"no PromQL for {query!r}")

    def interval_counts(self, counter: str, of: str) -> str:
        """The counter's increase in each scrape interval (``idelta``: the last two
        samples' difference; a reset's negative one counts as none) over
        ``defaults.SERVED_RANGE``: their mean, or the variance of the difference between
        consecutive counts, halved, over their mean (a count's variance without the
        drift of the day, which the window's rate follows)."""
        step = f"{BURST_INTERVAL_S:g}s"
        last_two = f"{2 * BURST_INTERVAL_S:g}s"  # a range that holds two scrapes

        def counts(offset: str = "") -> str:
            selector = f"{counter}{self.series}[{last_two}]{offset}"
            return self.agg("sum", f"clamp_min(idelta({selector}), 0)")

        mean = f"avg_over_time(({counts()})[{defaults.SERVED_RANGE}:{step}])"
        if of == "mean":
            return mean
        steps = f"({counts()} - {counts(f' offset {step}')})[{defaults.SERVED_RANGE}:{step}]"
        return f"stdvar_over_time({steps}) / 2 / {mean}"

    def quantile(self, histogram: str, q: float, over: str | None = None) -> str:
        if not 0 < q < 1:
            raise ValueError(f"quantile must be in (0, 1), got {q}")
        labels = ", ".join(("le", *self.group))
        return (
            f"histogram_quantile({q}, sum by ({labels}) "
            f"(rate({histogram}_bucket{self.series}[{over or self.window}])))"
        )

    def attainment(self, histogram: str) -> str | None:
        if self.bucket_s is None:
            return None
        le = f'{{le=~"{le_pattern(self.bucket_s)}",servingtarget!=""}}'
        below = self.agg("sum", f"rate({histogram}_bucket{le}[{self.window}])")
        return f"{below} / {self.rate(f'{histogram}_count')}"


TargetKey = tuple[str, str]  # (namespace, servingtarget)


def _error_of(body: Any) -> str:
    """Prometheus' own error in a body, "" when it says success."""
    if not isinstance(body, dict) or body.get("status") != "success":
        err = body.get("error", "unexpected answer") if isinstance(body, dict) else "not JSON"
        return f"prometheus: {err}"
    return ""


def _parse_by_target(body: Any) -> tuple[dict[TargetKey, Answer], str]:
    """A grouped vector as one answer per target, or the error."""
    grouped, error = _parse_grouped(body, GROUP_LABELS)
    return {(k[0], k[1]): a for k, a in grouped.items()}, error


def _parse_grouped(body: Any, group: Sequence[str]) -> tuple[dict[tuple[str, ...], Answer], str]:
    """A grouped vector as one answer per value of the ``group`` labels, or the error."""
    if error := _error_of(body):
        return {}, error
    data = body.get("data") or {}
    result = data.get("result")
    if data.get("resultType") != "vector" or not isinstance(result, list):
        return {}, f"unsupported result type {data.get('resultType')!r}"
    out: dict[tuple[str, ...], Answer] = {}
    for series in result:
        labels = series.get("metric") or {}
        out[tuple(str(labels.get(name, "")) for name in group)] = _sample(series.get("value"))
    return out, ""


def _age(answer: Answer) -> Reading:
    """A newest-sample timestamp answer as an age in seconds (OK) or as it was."""
    if not answer.reading.ok or answer.eval_time is None:
        return answer.reading
    return Reading(max(0.0, answer.eval_time - answer.reading.value), MetricState.OK)


def fresh(reading: Reading, age: Reading, stale_after_s: float) -> Reading:
    """``reading``, or STALE when its target's newest sample is older than allowed."""
    if reading.state is MetricState.MISSING or not age.ok:
        return reading
    return Reading(math.nan, MetricState.STALE) if age.value > stale_after_s else reading


@dataclass(frozen=True)
class FleetMetrics:
    """One tick's readings of every target: per query name, per (namespace, target)."""

    ages: Mapping[TargetKey, Reading]
    readings: Mapping[str, Mapping[TargetKey, Answer]]
    stale_after_s: float
    errors: Sequence[str] = ()
    # ``pool_queries``' answers: per query name, per (namespace, target, pool)
    pools: Mapping[str, Mapping[tuple[str, ...], Answer]] = field(default_factory=dict)

    def target(self, namespace: str, name: str) -> TargetMetrics:
        """One target's snapshot, freshness applied; missing where it has no series."""
        key = (namespace, name)
        age = self.ages.get(key, Reading())
        readings = {
            query: fresh(
                answers[key].reading if key in answers else Reading(), age, self.stale_after_s
            )
            for query, answers in self.readings.items()
        }
        pools = {
            query: {
                k[2]: fresh(a.reading, age, self.stale_after_s)
                for k, a in answers.items()
                if k[:2] == key
            }
            for query, answers in self.pools.items()
        }
        return TargetMetrics(readings, age.value if age.ok else None, self.errors, pools)


def _parse_answer(body: Any) -> Answer:
    """Turn a /api/v1/query JSON body into one reading (single series expected)."""
    if error := _error_of(body):
        return Answer.failed(error)
    data = body.get("data") or {}
    kind, result = data.get("resultType"), data.get("result")
    if kind == "scalar" and isinstance(result, list) and len(result) == 2:
        sample = result
    elif kind == "vector" and isinstance(result, list):
        if not result:
            return Answer(Reading())  # no series matched: missing, not an error
        if len(result) > 1:
            return Answer.failed(f"{len(result)} series; expected one")
        sample = result[0].get("value")
    else:
        return Answer.failed(f"unsupported result type {kind!r}")
    return _sample(sample)


def _sample(sample: Any) -> Answer:
    """One ``[timestamp, "value"]`` pair as an answer: NaN (no data in the window) is
    its own state, never a number."""
    try:
        ts, value = float(sample[0]), float(sample[1])
    except (TypeError, ValueError, IndexError):
        return Answer.failed(f"malformed sample {sample!r}")
    if math.isnan(value):
        return Answer(Reading(math.nan, MetricState.NAN), eval_time=ts)
    return Answer(Reading(value, MetricState.OK), eval_time=ts)


@dataclass(frozen=True)
class PrometheusAuth:
    """How to reach a Prometheus that is not open inside the cluster.

    Attributes:
        bearer_token_file: file holding a bearer token, read on every query (projected
            ServiceAccount tokens rotate), e.g. for OpenShift's thanos-querier.
        ca_file: PEM bundle to verify the server's certificate with (https).
        headers: extra request headers, e.g. ``X-Scope-OrgID`` for Mimir or Cortex.
    """

    bearer_token_file: str | None = None
    ca_file: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)

    def request_headers(self) -> dict[str, str]:
        """Headers for one query; OSError when the token file cannot be read."""
        out = dict(self.headers)
        if self.bearer_token_file:
            with open(self.bearer_token_file, encoding="utf-8") as f:
                out["Authorization"] = f"Bearer {f.read().strip()}"
        return out

    def ssl_context(self) -> ssl.SSLContext | None:
        """A context trusting ``ca_file`` (None: the system's trust store)."""
        return ssl.create_default_context(cafile=self.ca_file) if self.ca_file else None


class MetricsClient:
    """PromQL client for ServingTarget metrics. Use as ``async with MetricsClient(url)``.

    stale_after_s: newest-sample age (s) beyond which readings are STALE.
    timeout_s: per HTTP request.
    auth: bearer token, CA bundle and headers (default: none).
    """

    def __init__(
        self,
        base_url: str,
        stale_after_s: float = defaults.STALE_AFTER_S,
        timeout_s: float = 5.0,
        auth: PrometheusAuth | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.stale_after_s = stale_after_s
        self.auth = auth or PrometheusAuth()
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> MetricsClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the HTTP session (idempotent)."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def query(self, promql: str) -> Answer:
        """One instant query, no freshness check (the expression must yield one series)."""
        body, error = await self._fetch(promql)
        return Answer.failed(error) if error else _parse_answer(body)

    async def query_by_target(self, promql: str) -> tuple[dict[TargetKey, Answer], str]:
        """One instant query whose series carry the target labels: an answer per
        (namespace, servingtarget), and the error when the query failed."""
        body, error = await self._fetch(promql)
        return ({}, error) if error else _parse_by_target(body)

    async def _fetch(self, promql: str) -> tuple[Any, str]:
        """(decoded JSON body, "") or (None, why it failed)."""
        try:
            headers = self.auth.request_headers()
        except OSError as err:  # missing data, not zero: the loop holds
            return None, f"prometheus bearer token: {err}"
        if self._session is None:
            try:
                context = self.auth.ssl_context()
            except OSError as err:  # ssl.SSLError is one too: a bad bundle
                return None, f"prometheus CA file: {err}"
            connector = aiohttp.TCPConnector(ssl=context or True)
            self._session = aiohttp.ClientSession(timeout=self._timeout, connector=connector)
        url = f"{self.base_url}/api/v1/query"
        try:
            async with self._session.get(url, params={"query": promql}, headers=headers) as resp:
                try:
                    body = await resp.json(content_type=None)
                except ValueError:
                    return None, f"HTTP {resp.status}: not JSON"
                if resp.status != 200 and _error_of(body) == "":
                    return None, f"HTTP {resp.status}"
                return body, ""
        except (TimeoutError, aiohttp.ClientError, OSError) as err:
            # str(), not repr(): the detail ends up in a status condition people read
            why = str(err) or type(err).__name__
            return None, f"prometheus unreachable: {why}"

    async def fleet_snapshot(
        self, queries: Mapping[str, str], by_pool: Mapping[str, str] | None = None
    ) -> FleetMetrics:
        """Every target's readings from one set of grouped queries (``fleet_queries``;
        ``by_pool``: ``pool_queries``), with each target's freshness from one grouped
        timestamp query."""
        age_query = f"max by ({', '.join(GROUP_LABELS)}) (timestamp({FRESHNESS_GAUGE}))"
        pooled = by_pool or {}
        by_target, per_pool = await asyncio.gather(
            asyncio.gather(
                self.query_by_target(age_query),
                *(self.query_by_target(e) for e in queries.values()),
            ),
            asyncio.gather(*(self._query_by_pool(e) for e in pooled.values())),
        )
        (ages, age_error), *grouped = by_target
        errors = {error for _, error in ((ages, age_error), *grouped, *per_pool) if error}
        by_query = {name: answers for name, (answers, _) in zip(queries, grouped, strict=True)}
        pools = {name: answers for name, (answers, _) in zip(pooled, per_pool, strict=True)}
        return FleetMetrics(
            {k: _age(a) for k, a in ages.items()},
            by_query,
            self.stale_after_s,
            tuple(sorted(errors)),
            pools,
        )

    async def _query_by_pool(self, promql: str) -> tuple[dict[tuple[str, ...], Answer], str]:
        body, error = await self._fetch(promql)
        return ({}, error) if error else _parse_grouped(body, POOL_GROUP)
