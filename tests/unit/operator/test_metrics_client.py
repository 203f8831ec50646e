"""metrics_client against a fake Prometheus HTTP API on 127.0.0.1 (canned answers)."""

from __future__ import annotations

import math
import subprocess
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web
from aiohttp.test_utils import TestServer

from rooftop_control.readings import MetricState, Reading
from rooftop_operator.metrics_client import (
    TPOT_BUCKETS,
    MetricsClient,
    attainment_bucket,
    fleet_queries,
)

NOW = 1_700_000_000.0


def vector(*values: str, ts: float = NOW) -> dict[str, Any]:
    result = [{"metric": {}, "value": [ts, v]} for v in values]
    return {"status": "success", "data": {"resultType": "vector", "result": result}}


def grouped(*series: tuple[str, str, str], ts: float = NOW) -> dict[str, Any]:
    """A vector with one series per (namespace, servingtarget, value)."""
    result = [
        {"metric": {"namespace": ns, "servingtarget": name}, "value": [ts, value]}
        for ns, name, value in series
    ]
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


@pytest.mark.parametrize(
    ("slo_ms", "bucket"),
    [(100.0, 0.1), (80.0, 0.075), (60.0, 0.05), (5.0, None)],  # never a bucket above it
)
def test_attainment_bucket(slo_ms: float, bucket: float | None) -> None:
    assert attainment_bucket(slo_ms) == bucket


def test_every_query_groups_by_target_and_the_tpot_slo_reads_per_request_tpot() -> None:
    queries = fleet_queries("1m", 0.9, 0.99, 100.0)
    assert all("by (namespace, servingtarget)" in e or "sum by (le, namespace, servingtarget)"
               in e for e in queries.values())  # fmt: skip
    assert all('servingtarget!=""' in e for e in queries.values())
    assert 'le=~"0.1"' in queries["tpot_attainment"]
    # vLLM writes le="1.0"; Prometheus 2 keeps it, Prometheus 3 stores "1"
    assert 'le=~"1|1.0"' in fleet_queries("1m", 0.9, 0.99, 1500.0)["tpot_attainment"]
    assert "histogram_quantile(0.9," in queries["tpot_s"]
    assert "vllm:request_time_per_output_token_seconds_bucket" in queries["tpot_s"]
    assert "histogram_quantile(0.99," in queries["ttft_s"]
    assert "vllm:time_to_first_token_seconds_bucket" in queries["ttft_s"]
    assert "vllm:inter_token_latency_seconds_sum" in queries["step_s"]
    # decode tokens per engine step, over the same window as the step time
    assert queries["step_batch"] == (
        "sum by (namespace, servingtarget) (rate(vllm:inter_token_latency_seconds_count"
        '{servingtarget!=""}[1m])) / sum by (namespace, servingtarget) '
        '(rate(vllm:iteration_tokens_total_count{servingtarget!=""}[1m]))'
    )
    assert "tpot_attainment" not in fleet_queries("1m", 0.9, 0.9, 5.0)  # no bucket
    with pytest.raises(ValueError, match="PromQL duration"):
        fleet_queries("two minutes", 0.9, 0.9, 100.0)


def test_the_served_lengths_are_read_over_fifteen_minutes_whatever_the_window() -> None:
    """Lengths describe the users, not the last minute: one minute's p90 of a chat trace
    swings threefold with a burst of long prompts."""
    served = {k: v for k, v in fleet_queries("1m", 0.9, 0.9, 100.0).items() if "served" in k}
    assert served["served_requests"] == (
        "sum by (namespace, servingtarget) "
        '(increase(vllm:request_prompt_tokens_count{servingtarget!=""}[15m]))'
    )
    assert served["served_output_tokens_p99"] == (
        "histogram_quantile(0.99, sum by (le, namespace, servingtarget) "
        '(rate(vllm:request_generation_tokens_bucket{servingtarget!=""}[15m])))'
    )
    assert "vllm:request_prompt_tokens_sum" in served["served_prompt_tokens"]
    assert served["served_prefix_hit_ratio"] == (
        "sum by (namespace, servingtarget) "
        '(rate(vllm:prefix_cache_hits_total{servingtarget!=""}[15m])) / '
        "sum by (namespace, servingtarget) "
        '(rate(vllm:prefix_cache_queries_total{servingtarget!=""}[15m]))'
    )
    assert served["served_accepted_per_draft"] == (
        "sum by (namespace, servingtarget) "
        '(rate(vllm:spec_decode_num_accepted_tokens_total{servingtarget!=""}[15m])) / '
        "sum by (namespace, servingtarget) "
        '(rate(vllm:spec_decode_num_drafts_total{servingtarget!=""}[15m]))'
    )
    # drafted request-steps over every request's decode steps: one latency observed each
    assert served["served_drafted_share"] == (
        "sum by (namespace, servingtarget) "
        '(rate(vllm:spec_decode_num_drafts_total{servingtarget!=""}[15m])) / '
        "sum by (namespace, servingtarget) "
        '(rate(vllm:inter_token_latency_seconds_count{servingtarget!=""}[15m]))'
    )
    assert len(served) == 17
    assert all(("[15m]" in e or "[15m:" in e) and "[1m]" not in e for e in served.values())


def test_burstiness_is_read_from_the_counts_of_each_scrape_interval() -> None:
    """The increase between two scrapes (15 s apart) is one interval's count. The
    variance of consecutive counts' differences, halved, over their mean across the
    served range is the dispersion the planner holds capacity for: 1 for Poisson
    arrivals, and a day's drift in the rate, which the window follows, is left out."""
    q = fleet_queries("1m", 0.9, 0.9, 100.0)
    now = (
        "sum by (namespace, servingtarget) "
        '(clamp_min(idelta(vllm:request_success_total{servingtarget!=""}[30s]), 0))'
    )
    before = now.replace("[30s])", "[30s] offset 15s)")
    mean = f"avg_over_time(({now})[15m:15s])"
    assert q["served_requests_per_second"] == mean
    assert q["served_arrival_dispersion"] == (
        f"stdvar_over_time(({now} - {before})[15m:15s]) / 2 / {mean}"
    )


def queries(window: str = "1m") -> dict[str, str]:
    return fleet_queries(window, 0.9, 0.9, 100.0)


def chat(value: str) -> dict[str, Any]:
    """A grouped answer with one series, the target ns/chat's."""
    return grouped(("ns", "chat", value))


async def test_snapshot_ok_values_and_exact_promql(prom: tuple[FakeProm, str]) -> None:
    fake, url = prom
    fake.on("timestamp(", chat(str(NOW - 10)))
    fake.on("histogram_quantile(0.9, sum by (le, namespace, servingtarget) (rate(vllm:request_",
            chat("0.042"))  # fmt: skip
    fake.on("histogram_quantile(0.9, sum by (le, namespace, servingtarget) (rate(vllm:time_to",
            chat("+Inf"))  # fmt: skip
    fake.on("deriv(", chat("11.5"))
    fake.on("vllm:request_success_total", chat("12.5"))
    fake.on("vllm:num_requests_running", chat("7"))
    fake.on("vllm:num_requests_waiting", chat("0"))
    fake.on("vllm:kv_cache_usage_perc", chat("0.31"))
    async with MetricsClient(url) as mc:
        snap = (await mc.fleet_snapshot(queries())).target("ns", "chat")
    assert snap.get("tpot_s") == Reading(0.042, MetricState.OK)
    assert snap.get("ttft_s") == Reading(math.inf, MetricState.OK)  # over the last bucket
    assert snap.get("step_s").state is MetricState.MISSING  # no rule: empty vector, not 0
    assert snap.get("requests_per_second").value == 11.5
    assert snap.get("completions_per_second").value == 12.5
    assert snap.get("running").value == 7 and snap.get("kv_usage_ratio").value == 0.31
    assert snap.get("waiting") == Reading(0.0, MetricState.OK)  # a real zero stays a zero
    assert snap.newest_sample_age_s == pytest.approx(10) and not snap.errors
    assert len(fake.queries) == len(queries()) + 1  # one freshness query, none unread
    by = "by (namespace, servingtarget)"
    assert f'sum {by} (rate(vllm:request_success_total{{servingtarget!=""}}[1m]))' in fake.queries
    assert f"max {by} (timestamp(vllm:num_requests_running))" in fake.queries


async def test_nan_quantile_is_nan_not_zero(prom: tuple[FakeProm, str]) -> None:
    fake, url = prom
    fake.on("histogram_quantile", chat("NaN"))
    async with MetricsClient(url) as mc:
        snap = (await mc.fleet_snapshot(queries())).target("ns", "chat")
    assert snap.get("ttft_s").state is MetricState.NAN and math.isnan(snap.get("ttft_s").value)


async def test_stale_when_newest_sample_is_old(prom: tuple[FakeProm, str]) -> None:
    fake, url = prom
    fake.on("timestamp(", chat(str(NOW - 600)))
    fake.on("vllm:num_requests_running", chat("3"))
    fake.on("histogram_quantile", chat("NaN"))
    async with MetricsClient(url, stale_after_s=120) as mc:
        snap = (await mc.fleet_snapshot(queries())).target("ns", "chat")
    assert snap.get("running").state is MetricState.STALE  # the old value is not used
    assert snap.get("tpot_s").state is MetricState.STALE
    assert snap.get("waiting").state is MetricState.MISSING  # no series: missing, not stale
    assert snap.newest_sample_age_s == pytest.approx(600)


async def test_missing_when_no_series(prom: tuple[FakeProm, str]) -> None:
    _, url = prom
    async with MetricsClient(url) as mc:
        snap = (await mc.fleet_snapshot(queries())).target("ns", "chat")
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
        snap = (await mc.fleet_snapshot(queries())).target("ns", "chat")
    assert snap.get("running").state is MetricState.MISSING
    assert len(snap.errors) == 1 and "unreachable" in snap.errors[0]
    assert "127.0.0.1:9" in snap.errors[0] and len(snap.errors[0]) < 200


def test_attainment_buckets_are_bounds_vllm_exports() -> None:
    """The attainment query selects one ``le`` series: a bound vLLM does not export
    would match nothing. The simulated engine's buckets are vLLM's (checked against the
    real engine by tests/e2e/test_vllm_metrics.py)."""
    from rooftop_sim.engine.vllm_metrics import ITL_BUCKETS

    assert set(TPOT_BUCKETS) <= set(ITL_BUCKETS)


async def test_one_set_of_queries_reads_every_target(prom: tuple[FakeProm, str]) -> None:
    """The loop's fleet snapshot: the same queries for 2 targets as for 1,000."""
    fake, url = prom
    fake.on("timestamp(", grouped(("a", "chat", str(NOW - 5)), ("b", "chat", str(NOW - 600))))
    fake.on("sum by (namespace, servingtarget) (vllm:num_requests_running",
            grouped(("a", "chat", "7"), ("b", "chat", "3")))  # fmt: skip
    fake.on("histogram_quantile(0.9, sum by (le, namespace, servingtarget) (rate(vllm:request",
            grouped(("a", "chat", "0.042")))  # fmt: skip
    queries = fleet_queries("1m", 0.9, 0.9, 100.0)
    async with MetricsClient(url, stale_after_s=120) as mc:
        fleet = await mc.fleet_snapshot(queries)
    assert len(fake.queries) == len(queries) + 1  # one freshness query for all targets
    a, b = fleet.target("a", "chat"), fleet.target("b", "chat")
    assert a.get("running") == Reading(7.0, MetricState.OK)
    assert a.get("tpot_s") == Reading(0.042, MetricState.OK)
    assert b.get("running").state is MetricState.STALE  # its own newest sample is old
    assert b.get("tpot_s").state is MetricState.MISSING  # no series of its own
    assert fleet.target("c", "gone").get("running").state is MetricState.MISSING
    assert a.newest_sample_age_s == pytest.approx(5) and not a.errors


@pytest.mark.parametrize(("scraped_le", "slo_ms"), [("1.0", 1500.0), ("1", 1500.0),
                                                    ("0.1", 100.0)])  # fmt: skip
def test_attainment_reads_the_bucket_as_prometheus_stores_it(
    tmp_path: Path, scraped_le: str, slo_ms: float
) -> None:
    """Run by promtool on series as vLLM writes them: half the requests within the
    bucket. Prometheus 2 keeps le="1.0" as scraped (an exact le="1" read nothing there),
    Prometheus 3 stores "1"."""
    from tests.unit.operator.test_chart_rules import PROMTOOL

    if PROMTOOL is None:
        pytest.skip("promtool not fetched: make tools")
    labels = 'namespace="ns",servingtarget="chat"'
    hist = "vllm:request_time_per_output_token_seconds"
    query = fleet_queries("1m", 0.9, 0.9, slo_ms)["tpot_attainment"]
    rules = {"groups": [{"name": "t", "rules": [{"record": "t:attainment:ratio", "expr": query}]}]}
    tests = {"rule_files": ["rules.yaml"], "evaluation_interval": "15s", "tests": [{
        "interval": "15s",
        "input_series": [
            {"series": f'{hist}_bucket{{le="{scraped_le}",{labels}}}', "values": "0+1x20"},
            {"series": f"{hist}_count{{{labels}}}", "values": "0+2x20"},
        ],
        "promql_expr_test": [{"expr": "t:attainment:ratio", "eval_time": "4m",
                              "exp_samples": [{"labels": f"t:attainment:ratio{{{labels}}}",
                                               "value": 0.5}]}],
    }]}  # fmt: skip
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules))
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(tests))
    done = subprocess.run([str(PROMTOOL), "test", "rules", "test.yaml"], cwd=tmp_path,
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
