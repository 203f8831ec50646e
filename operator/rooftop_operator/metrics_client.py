"""Read one ServingTarget's serving metrics from Prometheus (HTTP API, PromQL).

Every value comes back as a ``Reading`` whose ``state`` says what it is worth:

- ``OK``: a number (``value``); ``+Inf`` is OK too (histogram_quantile above the last
  finite bucket: "worse than the largest bucket", which a controller must act on);
- ``MISSING``: no series matched (engine not scraped yet, wrong selector);
- ``STALE``: series exist but the newest sample is older than ``stale_after_s`` (scrapes
  stopped); ``value`` holds the old number for display only;
- ``NAN``: the query returned NaN (e.g. no requests in the window, so the quantile of an
  empty histogram is NaN);
- ``ERROR``: Prometheus unreachable, timed out, rejected the query, or the answer was not
  a single series (``detail`` says which).

Missing data is never turned into zeros: a controller that scales on "0 waiting" because
Prometheus was down would scale in at the worst moment.

Series are selected by labels that the scrape config / PodMonitor attaches to each
engine pod (by default ``namespace`` and ``servingtarget``; both names configurable).
Freshness is checked once per snapshot with ``max(timestamp(vllm:num_requests_running{sel}))``
against the query's evaluation time, because a gauge is present whenever a pod is scraped.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from types import TracebackType
from typing import Any

import aiohttp

TPOT_HISTOGRAM = "vllm:inter_token_latency_seconds"  # per-token gaps: what a TPOT SLO bounds
TTFT_HISTOGRAM = "vllm:time_to_first_token_seconds"
FRESHNESS_GAUGE = "vllm:num_requests_running"
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_DURATION = re.compile(r"^([0-9]+(ms|s|m|h|d|w|y))+$")


class State(Enum):
    """What a Reading holds; see the module docstring."""

    OK = "ok"
    MISSING = "missing"
    STALE = "stale"
    NAN = "nan"
    ERROR = "error"


@dataclass(frozen=True)
class Reading:
    """One query result. ``value`` is set for OK (and, informationally, STALE) only."""

    state: State
    value: float | None = None
    detail: str = ""

    @property
    def ok(self) -> bool:
        """True when ``value`` is a usable number."""
        return self.state is State.OK

    def __str__(self) -> str:
        if self.state is State.OK:
            return f"{self.value:.6g}"
        return f"{self.state.value}({self.detail})" if self.detail else self.state.value


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
    """A snapshot of one ServingTarget. Quantile keys are q in (0, 1); seconds, req/s."""

    tpot_s: Mapping[float, Reading]
    ttft_s: Mapping[float, Reading]
    request_rate: Reading
    running: Reading
    waiting: Reading
    kv_usage: Reading
    newest_sample_age_s: float | None = None
    errors: Sequence[str] = field(default_factory=tuple)


@dataclass(frozen=True)
class _Raw:
    """An instant-query answer before freshness is applied: Reading + evaluation time."""

    reading: Reading
    eval_time: float | None = None


def _parse_answer(body: Any) -> _Raw:
    """Turn a /api/v1/query JSON body into one reading (single series expected)."""
    if not isinstance(body, dict) or body.get("status") != "success":
        err = body.get("error", "unexpected answer") if isinstance(body, dict) else "not JSON"
        return _Raw(Reading(State.ERROR, detail=f"prometheus: {err}"))
    data = body.get("data") or {}
    kind, result = data.get("resultType"), data.get("result")
    if kind == "scalar" and isinstance(result, list) and len(result) == 2:
        sample = result
    elif kind == "vector" and isinstance(result, list):
        if not result:
            return _Raw(Reading(State.MISSING, detail="no series matched"))
        if len(result) > 1:
            return _Raw(Reading(State.ERROR, detail=f"{len(result)} series; expected one"))
        sample = result[0].get("value")
    else:
        return _Raw(Reading(State.ERROR, detail=f"unsupported result type {kind!r}"))
    try:
        ts, value = float(sample[0]), float(sample[1])
    except (TypeError, ValueError, IndexError):
        return _Raw(Reading(State.ERROR, detail=f"malformed sample {sample!r}"))
    if math.isnan(value):
        return _Raw(Reading(State.NAN, detail="query returned NaN (no data in window?)"), ts)
    return _Raw(Reading(State.OK, value), ts)


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

    window: range of rate() (PromQL duration, e.g. "2m": at least 4 scrape intervals).
    stale_after_s: newest-sample age (s) beyond which readings are STALE.
    timeout_s: per HTTP request.
    auth: bearer token, CA bundle and headers (default: none).
    """

    def __init__(
        self,
        base_url: str,
        window: str = "2m",
        stale_after_s: float = 120.0,
        timeout_s: float = 5.0,
        auth: PrometheusAuth | None = None,
    ) -> None:
        if not _DURATION.match(window):
            raise ValueError(f"window must be a PromQL duration like '2m', got {window!r}")
        self.base_url = base_url.rstrip("/")
        self.window = window
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

    async def _raw(self, promql: str) -> _Raw:
        try:
            headers = self.auth.request_headers()
        except OSError as err:  # missing data, not zero: the loop holds
            return _Raw(Reading(State.ERROR, detail=f"prometheus bearer token: {err}"))
        if self._session is None:
            try:
                context = self.auth.ssl_context()
            except OSError as err:  # ssl.SSLError is one too: a bad bundle
                return _Raw(Reading(State.ERROR, detail=f"prometheus CA file: {err}"))
            connector = aiohttp.TCPConnector(ssl=context or True)
            self._session = aiohttp.ClientSession(timeout=self._timeout, connector=connector)
        url = f"{self.base_url}/api/v1/query"
        try:
            async with self._session.get(url, params={"query": promql}, headers=headers) as resp:
                try:
                    body = await resp.json(content_type=None)
                except ValueError:
                    return _Raw(Reading(State.ERROR, detail=f"HTTP {resp.status}: not JSON"))
                raw = _parse_answer(body)
                if resp.status != 200 and raw.reading.state is not State.ERROR:
                    return _Raw(Reading(State.ERROR, detail=f"HTTP {resp.status}"))
                return raw
        except (TimeoutError, aiohttp.ClientError, OSError) as err:
            # str(), not repr(): the detail ends up in a status condition people read
            why = str(err) or type(err).__name__
            return _Raw(Reading(State.ERROR, detail=f"prometheus unreachable: {why}"))

    async def query(self, promql: str) -> Reading:
        """One instant query, no freshness check (the expression must yield one series)."""
        return (await self._raw(promql)).reading

    # ---- ServingTarget queries ---------------------------------------------------
    def quantile_expr(self, histogram: str, q: float, sel: Selector) -> str:
        """histogram_quantile over all of the target's pods, merged by bucket."""
        if not 0 < q < 1:
            raise ValueError(f"quantile must be in (0, 1), got {q}")
        return (
            f"histogram_quantile({q}, sum by (le) "
            f"(rate({histogram}_bucket{sel.promql()}[{self.window}])))"
        )

    def exprs(self, sel: Selector) -> dict[str, str]:
        """The scalar (non-quantile) queries of a snapshot, by field name."""
        s, w = sel.promql(), self.window
        return {
            "request_rate": f"sum(rate(vllm:request_success_total{s}[{w}]))",
            "running": f"sum(vllm:num_requests_running{s})",
            "waiting": f"sum(vllm:num_requests_waiting{s})",
            "kv_usage": f"max(vllm:kv_cache_usage_perc{s})",  # the fullest replica
        }

    async def newest_sample_age(self, sel: Selector) -> Reading:
        """Seconds since the newest scrape of the target's gauge (OK) or why unknown."""
        raw = await self._raw(f"max(timestamp({FRESHNESS_GAUGE}{sel.promql()}))")
        if not raw.reading.ok or raw.eval_time is None or raw.reading.value is None:
            return raw.reading
        return Reading(State.OK, max(0.0, raw.eval_time - raw.reading.value))

    async def snapshot(
        self, sel: Selector, quantiles: Sequence[float] = (0.5, 0.9, 0.99)
    ) -> TargetMetrics:
        """All serving metrics of one target, queried concurrently."""
        names = [("tpot", q) for q in quantiles] + [("ttft", q) for q in quantiles]
        hist = {"tpot": TPOT_HISTOGRAM, "ttft": TTFT_HISTOGRAM}
        qexprs = [self.quantile_expr(hist[kind], q, sel) for kind, q in names]
        scalars = self.exprs(sel)
        results = await asyncio.gather(
            self.newest_sample_age(sel), *(self.query(e) for e in [*qexprs, *scalars.values()])
        )
        age, readings = results[0], [self._apply_age(r, results[0]) for r in results[1:]]
        by_q = dict(zip(names, readings[: len(names)], strict=True))
        rest = dict(zip(scalars, readings[len(names) :], strict=True))
        return TargetMetrics(
            tpot_s={q: by_q[("tpot", q)] for q in quantiles},
            ttft_s={q: by_q[("ttft", q)] for q in quantiles},
            request_rate=rest["request_rate"],
            running=rest["running"],
            waiting=rest["waiting"],
            kv_usage=rest["kv_usage"],
            newest_sample_age_s=age.value if age.ok else None,
            errors=tuple(sorted({r.detail for r in results if r.state is State.ERROR})),
        )

    def _apply_age(self, reading: Reading, age: Reading) -> Reading:
        """Downgrade to STALE when the target's newest sample is too old."""
        if reading.state is State.ERROR or age.state is State.ERROR:
            return reading
        if age.ok and age.value is not None and age.value > self.stale_after_s:
            detail = f"newest sample {age.value:.0f} s old (> {self.stale_after_s:.0f} s)"
            return Reading(State.STALE, reading.value, detail)
        return reading
