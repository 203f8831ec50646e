"""metrics_client against a fake Prometheus HTTP API on 127.0.0.1 (canned answers)."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from rooftop_control.control import MetricState, Reading
from rooftop_operator.metrics_client import (
    TPOT_BUCKETS,
    MetricsClient,
    Selector,
    attainment_bucket,
    quantile_expr,
    target_queries,
)

NOW = 1_700_000_000.0
SEL = Selector.for_target("prod", "llama")


def vector(*values: str, ts: float = NOW) -> dict[str, Any]:
    result = [{"metric": {}, "value": [ts, v]} for v in values]
    return {"status": "success", "data": {"resultType": "vector", "result": result}}


class FakeProm:
    """Answers /api/v1/query by the first matching substring rule; records queries."""

    def __init__(self) -> None:
        self.rules: list[tuple[str, Callable[[], Any]]] = []
        self.queries: list[str] = []

    def on(self, fragment: str, answer: Any, status: int = 200) -> None:
        self.rules.append((fragment, lambda: web.json_response(answer, status=status)))

    async def handle(self, request: web.Request) -> web.StreamResponse:
        q = request.query["query"]
        self.queries.append(q)
        for fragment, answer in self.rules:
            if fragment in q:
                resp: web.StreamResponse = answer()
                return resp
        return web.json_response(vector())  # nothing matches: empty vector


@pytest.fixture
async def prom() -> AsyncIterator[tuple[FakeProm, str]]:
    fake = FakeProm()
    app = web.Application()
    app.router.add_get("/api/v1/query", fake.handle)
    srv = TestServer(app, host="127.0.0.1")
    await srv.start_server()
    yield fake, str(srv.make_url("")).rstrip("/")
    await srv.close()


def test_selector_escapes_and_validates() -> None:
    assert SEL.promql() == '{namespace="prod",servingtarget="llama"}'
    sel = Selector.for_target("ns", 'we"ird\\', target_label="app", extra={"engine": "0"})
    assert sel.promql() == '{app="we\\"ird\\\\",engine="0",namespace="ns"}'
    with pytest.raises(ValueError):
        Selector({"bad-label": "x"}).promql()
    with pytest.raises(ValueError, match="PromQL duration"):
        target_queries(SEL, "two minutes", 0.9, 0.9, 100.0)


@pytest.mark.parametrize(
    ("slo_ms", "bucket"),
    [(100.0, 0.1), (80.0, 0.075), (60.0, 0.05), (5.0, None)],  # never a bucket above it
)
def test_attainment_bucket(slo_ms: float, bucket: float | None) -> None:
    assert attainment_bucket(slo_ms) == bucket


def test_every_query_selects_the_target_and_the_tpot_slo_reads_per_request_tpot() -> None:
    queries = target_queries(Selector.for_target("ns", "chat"), "1m", 0.9, 0.99, 100.0)
    assert all('servingtarget="chat"' in e for e in queries.values())
    assert 'le="0.1"' in queries["tpot_attainment"]
    assert "histogram_quantile(0.9," in queries["tpot_s"]
    assert "vllm:request_time_per_output_token_seconds_bucket" in queries["tpot_s"]
    assert "histogram_quantile(0.99, sum by (le) (rate(vllm:time_to_first" in queries["ttft_s"]
    assert "vllm:inter_token_latency_seconds_sum" in queries["step_s"]
    assert "tpot_attainment" not in target_queries(SEL, "1m", 0.9, 0.9, 5.0)  # no bucket


def queries(window: str = "1m") -> dict[str, str]:
    return target_queries(SEL, window, 0.9, 0.9, 100.0)


async def test_snapshot_ok_values_and_exact_promql(prom: tuple[FakeProm, str]) -> None:
    fake, url = prom
    fake.on("timestamp(", vector(str(NOW - 10)))
    fake.on("histogram_quantile(0.9, sum by (le) (rate(vllm:request_time_per", vector("0.042"))
    fake.on("histogram_quantile(0.9, sum by (le) (rate(vllm:time_to_first", vector("+Inf"))
    fake.on("deriv(", vector("11.5"))
    fake.on("vllm:request_success_total", vector("12.5"))
    fake.on("vllm:num_requests_running", vector("7"))
    fake.on("vllm:num_requests_waiting", vector("0"))
    fake.on("vllm:kv_cache_usage_perc", vector("0.31"))
    async with MetricsClient(url) as mc:
        snap = await mc.snapshot(SEL, queries())
    assert snap.get("tpot_s") == Reading(0.042, MetricState.OK)
    assert snap.get("ttft_s") == Reading(math.inf, MetricState.OK)  # over the last bucket
    assert snap.get("step_s").state is MetricState.MISSING  # no rule: empty vector, not 0
    assert snap.get("requests_per_second").value == 11.5
    assert snap.get("completions_per_second").value == 12.5
    assert snap.get("running").value == 7 and snap.get("kv_usage_ratio").value == 0.31
    assert snap.get("waiting") == Reading(0.0, MetricState.OK)  # a real zero stays a zero
    assert snap.newest_sample_age_s == pytest.approx(10) and not snap.errors
    s = SEL.promql()
    assert len(fake.queries) == len(queries()) + 1  # one freshness query, none unread
    assert f"sum(rate(vllm:request_success_total{s}[1m]))" in fake.queries
    assert f"max(timestamp(vllm:num_requests_running{s}))" in fake.queries


async def test_nan_quantile_is_nan_not_zero(prom: tuple[FakeProm, str]) -> None:
    fake, url = prom
    fake.on("histogram_quantile", vector("NaN"))
    async with MetricsClient(url) as mc:
        answer = await mc.query(quantile_expr("vllm:time_to_first_token_seconds", 0.99, SEL, "1m"))
    assert answer.reading.state is MetricState.NAN and math.isnan(answer.reading.value)


async def test_stale_when_newest_sample_is_old(prom: tuple[FakeProm, str]) -> None:
    fake, url = prom
    fake.on("timestamp(", vector(str(NOW - 600)))
    fake.on("vllm:num_requests_running", vector("3"))
    fake.on("histogram_quantile", vector("NaN"))
    async with MetricsClient(url, stale_after_s=120) as mc:
        snap = await mc.snapshot(SEL, queries())
    assert snap.get("running").state is MetricState.STALE  # the old value is not used
    assert snap.get("tpot_s").state is MetricState.STALE
    assert snap.get("waiting").state is MetricState.MISSING  # no series: missing, not stale
    assert snap.newest_sample_age_s == pytest.approx(600)


async def test_missing_when_no_series(prom: tuple[FakeProm, str]) -> None:
    _, url = prom
    async with MetricsClient(url) as mc:
        snap = await mc.snapshot(SEL, queries())
    assert all(r.state is MetricState.MISSING for r in snap.readings.values())
    assert set(snap.readings) == set(queries())
    assert snap.newest_sample_age_s is None and not snap.errors


async def test_prometheus_errors(prom: tuple[FakeProm, str]) -> None:
    fake, url = prom
    bad = {"status": "error", "errorType": "bad_data", "error": "parse error at char 5"}
    fake.on("bogus", bad, status=400)
    fake.on("vllm:num_requests_waiting", vector("1", "2"))
    async with MetricsClient(url) as mc:
        answer = await mc.query("bogus(")
        assert answer.reading.state is MetricState.MISSING and "parse error" in answer.error
        answer = await mc.query("sum(vllm:num_requests_waiting)")
        assert answer.reading.state is MetricState.MISSING and "2 series" in answer.error


async def test_unreachable_prometheus_is_missing_with_the_reason() -> None:
    async with MetricsClient("http://127.0.0.1:9", timeout_s=1.0) as mc:
        snap = await mc.snapshot(SEL, queries())
    assert snap.get("running").state is MetricState.MISSING
    assert len(snap.errors) == 1 and "unreachable" in snap.errors[0]
    assert "127.0.0.1:9" in snap.errors[0] and len(snap.errors[0]) < 200


def test_attainment_buckets_are_bounds_vllm_exports() -> None:
    """The attainment query selects one ``le`` series: a bound vLLM does not export
    would match nothing. The simulated engine's buckets are vLLM's (checked against the
    real engine by tests/e2e/test_vllm_metrics.py)."""
    from rooftop_sim.engine.vllm_metrics import ITL_BUCKETS

    assert set(TPOT_BUCKETS) <= set(ITL_BUCKETS)
