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

Series are selected by labels that the scrape config / PodMonitor attaches to each
engine pod (by default ``namespace`` and ``servingtarget``; both names configurable).
Freshness is checked once per snapshot with ``max(timestamp(vllm:num_requests_running{sel}))``
against the query's evaluation time, because a gauge is present whenever a pod is scraped,
and applied once, here, to every reading of the snapshot.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import aiohttp

from rooftop_control.control import MetricState, Reading

# vLLM's per-request TPOT histogram: what a TPOT SLO bounds (a request's mean gap between
# output tokens), unlike the per-token inter-token latency, which also carries every
# prefill stall; the mean of the latter is the mean step time the calibration compares.
REQUEST_TPOT_HISTOGRAM = "vllm:request_time_per_output_token_seconds"
ITL_HISTOGRAM = "vllm:inter_token_latency_seconds"
TTFT_HISTOGRAM = "vllm:time_to_first_token_seconds"
# Bounds of vLLM's TPOT histogram up to 5 s (a unit test keeps them among the simulated
# engine's buckets, which tests/e2e/test_vllm_metrics.py checks against the real vLLM).
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0)
FRESHNESS_GAUGE = "vllm:num_requests_running"
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_DURATION = re.compile(r"^([0-9]+(ms|s|m|h|d|w|y))+$")


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
class Selector:
    """Label matchers selecting one ServingTarget's engine series (exact matches)."""

    labels: Mapping[str, str]

    @classmethod
    def for_target(
        cls,
        namespace: str,
        name: str,
        namespace_label: str = "namespace",
        target_label: str = "servingtarget",
        extra: Mapping[str, str] | None = None,
    ) -> Selector:
        """The usual selector: {namespace_label=namespace, target_label=name, **extra}."""
        return cls({namespace_label: namespace, target_label: name, **(extra or {})})

    def promql(self) -> str:
        """``{a="x",b="y"}`` with values escaped for PromQL string literals."""
        parts = []
        for key, value in sorted(self.labels.items()):
            if not _LABEL_NAME.match(key):
                raise ValueError(f"invalid Prometheus label name {key!r}")
            escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
            parts.append(f'{key}="{escaped}"')
        return "{" + ",".join(parts) + "}"


@dataclass(frozen=True)
class TargetMetrics:
    """A snapshot of one ServingTarget: readings by query name (``target_queries``), in
    Prometheus' units (seconds, req/s, tokens, ratios), freshness already applied."""

    readings: Mapping[str, Reading]
    newest_sample_age_s: float | None = None
    errors: Sequence[str] = ()

    def get(self, name: str) -> Reading:
        """The reading of one query; missing when the snapshot did not ask for it."""
        return self.readings.get(name, Reading())


def attainment_bucket(slo_ms: float) -> float | None:
    """The largest bucket bound (s) within the SLO: the share below it under-counts
    attainment (conservative), never over-counts. None when the SLO is below them all."""
    within = [b for b in TPOT_BUCKETS if b * 1e3 <= slo_ms + 1e-9]
    return max(within) if within else None


def quantile_expr(histogram: str, q: float, sel: Selector, window: str) -> str:
    """histogram_quantile over all of the target's pods, merged by bucket."""
    if not 0 < q < 1:
        raise ValueError(f"quantile must be in (0, 1), got {q}")
    return (
        f"histogram_quantile({q}, sum by (le) (rate({histogram}_bucket{sel.promql()}[{window}])))"
    )


def check_window(window: str) -> str:
    """``window`` if it is a PromQL duration (range of rate(), e.g. "2m"), else ValueError."""
    if not _DURATION.match(window):
        raise ValueError(f"window must be a PromQL duration like '2m', got {window!r}")
    return window


def target_queries(
    sel: Selector, window: str, tpot_q: float, ttft_q: float, tpot_slo_ms: float
) -> dict[str, str]:
    """The PromQL of one snapshot by name, every one read by the loop's observation."""
    s, w = sel.promql(), check_window(window)

    def ratio(num: str, den: str) -> str:
        return f"sum(rate({num}{s}[{w}])) / sum(rate({den}{s}[{w}]))"

    out = {
        "tpot_s": quantile_expr(REQUEST_TPOT_HISTOGRAM, tpot_q, sel, w),
        "ttft_s": quantile_expr(TTFT_HISTOGRAM, ttft_q, sel, w),
        "step_s": ratio(f"{ITL_HISTOGRAM}_sum", f"{ITL_HISTOGRAM}_count"),
        "prompt_tokens": ratio(
            "vllm:request_prompt_tokens_sum", "vllm:request_prompt_tokens_count"
        ),
        "output_tokens": ratio(
            "vllm:request_generation_tokens_sum", "vllm:request_generation_tokens_count"
        ),
        # arrivals = completions + growth of what is in the engines (a gauge's deriv).
        # The subquery step is left to Prometheus (its evaluation interval): a fixed
        # coarse step leaves deriv() two or three points per window, and its noise
        # became phantom load (3.1 req/s read at 1.5 offered in the loop e2e run).
        "requests_per_second": (
            f"sum(rate(vllm:request_success_total{s}[{w}])) + deriv((sum("
            f"vllm:num_requests_running{s}) + sum(vllm:num_requests_waiting{s}))[{w}:])"
        ),
        # the arrival estimate's fallback: deriv() needs two samples in the window
        "completions_per_second": f"sum(rate(vllm:request_success_total{s}[{w}]))",
        "running": f"sum(vllm:num_requests_running{s})",
        "waiting": f"sum(vllm:num_requests_waiting{s})",
        "kv_usage_ratio": f"max(vllm:kv_cache_usage_perc{s})",  # the fullest replica
    }
    bucket = attainment_bucket(tpot_slo_ms)
    if bucket is not None:
        le = {**sel.labels, "le": f"{bucket:g}"}
        out["tpot_attainment"] = (
            f"sum(rate({REQUEST_TPOT_HISTOGRAM}_bucket{Selector(le).promql()}[{w}])) / "
            f"sum(rate({REQUEST_TPOT_HISTOGRAM}_count{s}[{w}]))"
        )
    return out


def _parse_answer(body: Any) -> Answer:
    """Turn a /api/v1/query JSON body into one reading (single series expected)."""
    if not isinstance(body, dict) or body.get("status") != "success":
        err = body.get("error", "unexpected answer") if isinstance(body, dict) else "not JSON"
        return Answer.failed(f"prometheus: {err}")
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
    try:
        ts, value = float(sample[0]), float(sample[1])
    except (TypeError, ValueError, IndexError):
        return Answer.failed(f"malformed sample {sample!r}")
    if math.isnan(value):  # no data in the window
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

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> PrometheusAuth:
        """ROOFTOP_PROMETHEUS_{BEARER_TOKEN_FILE,CA_FILE,HEADERS} (HEADERS: a JSON object
        of strings); ValueError naming the variable when HEADERS is not one."""
        raw = env.get("ROOFTOP_PROMETHEUS_HEADERS") or "{}"
        try:
            headers = json.loads(raw)
        except ValueError:
            headers = None
        strings = isinstance(headers, dict) and all(
            isinstance(k, str) and isinstance(v, str) for k, v in headers.items()
        )
        if not strings:
            raise ValueError(
                f"ROOFTOP_PROMETHEUS_HEADERS={raw!r}: give a JSON object of strings, "
                'e.g. {"X-Scope-OrgID": "team-a"}'
            )
        return cls(env.get("ROOFTOP_PROMETHEUS_BEARER_TOKEN_FILE") or None,
                   env.get("ROOFTOP_PROMETHEUS_CA_FILE") or None, headers)  # fmt: skip

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
        stale_after_s: float = 120.0,
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
        try:
            headers = self.auth.request_headers()
        except OSError as err:  # missing data, not zero: the loop holds
            return Answer.failed(f"prometheus bearer token: {err}")
        if self._session is None:
            try:
                context = self.auth.ssl_context()
            except OSError as err:  # ssl.SSLError is one too: a bad bundle
                return Answer.failed(f"prometheus CA file: {err}")
            connector = aiohttp.TCPConnector(ssl=context or True)
            self._session = aiohttp.ClientSession(timeout=self._timeout, connector=connector)
        url = f"{self.base_url}/api/v1/query"
        try:
            async with self._session.get(url, params={"query": promql}, headers=headers) as resp:
                try:
                    body = await resp.json(content_type=None)
                except ValueError:
                    return Answer.failed(f"HTTP {resp.status}: not JSON")
                answer = _parse_answer(body)
                if resp.status != 200 and not answer.error:
                    return Answer.failed(f"HTTP {resp.status}")
                return answer
        except (TimeoutError, aiohttp.ClientError, OSError) as err:
            # str(), not repr(): the detail ends up in a status condition people read
            why = str(err) or type(err).__name__
            return Answer.failed(f"prometheus unreachable: {why}")

    async def newest_sample_age(self, sel: Selector) -> Answer:
        """Seconds since the newest scrape of the target's gauge (OK) or why unknown."""
        answer = await self.query(f"max(timestamp({FRESHNESS_GAUGE}{sel.promql()}))")
        if not answer.reading.ok or answer.eval_time is None:
            return answer
        return Answer(Reading(max(0.0, answer.eval_time - answer.reading.value), MetricState.OK))

    async def snapshot(self, sel: Selector, queries: Mapping[str, str]) -> TargetMetrics:
        """Every query of one target (``target_queries``), concurrently, with freshness
        applied once: all readings are stale when the target's newest sample is too old."""
        age, *answers = await asyncio.gather(
            self.newest_sample_age(sel), *(self.query(e) for e in queries.values())
        )
        readings = {
            name: self._fresh(answer.reading, age.reading)
            for name, answer in zip(queries, answers, strict=True)
        }
        errors = {a.error for a in (age, *answers) if a.error}
        return TargetMetrics(
            readings, age.reading.value if age.reading.ok else None, tuple(sorted(errors))
        )

    def _fresh(self, reading: Reading, age: Reading) -> Reading:
        """``reading``, or STALE when the target's newest sample is older than allowed."""
        if reading.state is MetricState.MISSING or not age.ok:
            return reading
        return Reading(math.nan, MetricState.STALE) if age.value > self.stale_after_s else reading
