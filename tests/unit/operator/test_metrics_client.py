"""metrics_client against a fake Prometheus HTTP API on 127.0.0.1 (canned answers)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from rooftop_operator.metrics_client import MetricsClient, Selector, State

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
    with pytest.raises(ValueError):
        MetricsClient("http://x", window="two minutes")


async def test_snapshot_ok_values_and_exact_promql(prom: tuple[FakeProm, str]) -> None:
    fake, url = prom
    fake.on("timestamp(", vector(str(NOW - 10)))
    fake.on("histogram_quantile(0.9, sum by (le) (rate(vllm:inter_token_latency", vector("0.042"))
    fake.on("histogram_quantile(0.9, sum by (le) (rate(vllm:time_to_first", vector("+Inf"))
    fake.on("vllm:request_success_total", vector("12.5"))
    fake.on("vllm:num_requests_running", vector("7"))
    fake.on("vllm:num_requests_waiting", vector("0"))
    fake.on("vllm:kv_cache_usage_perc", vector("0.31"))
    async with MetricsClient(url, window="1m") as mc:
        snap = await mc.snapshot(SEL, quantiles=(0.5, 0.9))
    assert snap.tpot_s[0.9].ok and snap.tpot_s[0.9].value == 0.042
    assert snap.ttft_s[0.9].state is State.OK and snap.ttft_s[0.9].value == float("inf")
    assert snap.tpot_s[0.5].state is State.MISSING  # no rule: empty vector, not 0
    assert snap.request_rate.value == 12.5 and snap.running.value == 7
    assert snap.waiting.ok and snap.waiting.value == 0.0  # a real zero stays a zero
    assert snap.kv_usage.value == 0.31 and snap.newest_sample_age_s == pytest.approx(10)
    s = SEL.promql()
    itl = f"rate(vllm:inter_token_latency_seconds_bucket{s}[1m])"
    assert f"histogram_quantile(0.9, sum by (le) ({itl}))" in fake.queries
    assert f"sum(rate(vllm:request_success_total{s}[1m]))" in fake.queries
    assert f"max(timestamp(vllm:num_requests_running{s}))" in fake.queries


async def test_nan_quantile_is_nan_not_zero(prom: tuple[FakeProm, str]) -> None:
    fake, url = prom
    fake.on("histogram_quantile", vector("NaN"))
    async with MetricsClient(url) as mc:
        r = await mc.query(mc.quantile_expr("vllm:time_to_first_token_seconds", 0.99, SEL))
    assert r.state is State.NAN and r.value is None


async def test_stale_when_newest_sample_is_old(prom: tuple[FakeProm, str]) -> None:
    fake, url = prom
    fake.on("timestamp(", vector(str(NOW - 600)))
    fake.on("vllm:num_requests_running", vector("3"))
    async with MetricsClient(url, stale_after_s=120) as mc:
        snap = await mc.snapshot(SEL)
    assert snap.running.state is State.STALE and snap.running.value == 3.0
    assert "600 s old" in snap.running.detail
    assert snap.waiting.state is State.STALE and snap.waiting.value is None


async def test_missing_when_no_series(prom: tuple[FakeProm, str]) -> None:
    _, url = prom
    async with MetricsClient(url) as mc:
        snap = await mc.snapshot(SEL)
    readings = [*snap.tpot_s.values(), *snap.ttft_s.values(), snap.request_rate, snap.running,
                snap.waiting, snap.kv_usage]  # fmt: skip
    assert all(r.state is State.MISSING and r.value is None for r in readings)
    assert snap.newest_sample_age_s is None and not snap.errors


async def test_prometheus_errors(prom: tuple[FakeProm, str]) -> None:
    fake, url = prom
    bad = {"status": "error", "errorType": "bad_data", "error": "parse error at char 5"}
    fake.on("bogus", bad, status=400)
    fake.on("vllm:num_requests_waiting", vector("1", "2"))
    async with MetricsClient(url) as mc:
        r = await mc.query("bogus(")
        assert r.state is State.ERROR and "parse error" in r.detail
        r = await mc.query("sum(vllm:num_requests_waiting)")
        assert r.state is State.ERROR and "2 series" in r.detail


async def test_unreachable_prometheus_is_error() -> None:
    async with MetricsClient("http://127.0.0.1:9", timeout_s=1.0) as mc:
        snap = await mc.snapshot(SEL, quantiles=(0.5,))
    assert snap.running.state is State.ERROR and "unreachable" in snap.running.detail
    assert "127.0.0.1:9" in snap.running.detail and len(snap.running.detail) < 200
    assert snap.tpot_s[0.5].state is State.ERROR and snap.errors
    assert str(snap.running).startswith("error(")
