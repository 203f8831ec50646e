"""engine-sim over HTTP: OpenAI API shapes, SSE streaming, vLLM-exact /metrics, admin."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest
from aiohttp import ClientResponse
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from rooftop_sim.engine.server import EngineSimConfig, build_app, count_text_tokens
from rooftop_sim.engine.vllm_metrics import ITL_BUCKETS, TTFT_BUCKETS

NAME = "served-llama"


async def make_client(max_num_seqs: int = 256, time_scale: float = 50.0) -> TestClient:
    cfg = EngineSimConfig(
        model="llama-3.1-8b", model_name=NAME, max_num_seqs=max_num_seqs, time_scale=time_scale
    )
    client = TestClient(TestServer(build_app(cfg)))
    await client.start_server()
    return client


@pytest.fixture
async def client() -> AsyncIterator[TestClient]:
    c = await make_client()
    yield c
    await c.close()


async def sse_events(resp: ClientResponse) -> list[str]:
    body = await resp.text()
    return [line[len("data: ") :] for line in body.splitlines() if line.startswith("data: ")]


async def metric_families(client: TestClient) -> dict[str, Metric]:
    resp = await client.get("/metrics")
    assert resp.status == 200
    return {f.name: f for f in text_string_to_metric_families(await resp.text())}


async def test_models_and_health(client: TestClient) -> None:
    assert (await client.get("/health")).status == 200
    data = await (await client.get("/v1/models")).json()
    assert data["data"][0]["id"] == NAME and data["data"][0]["max_model_len"] == 8192


async def test_streamed_completion_yields_max_tokens(client: TestClient) -> None:
    body = {"model": NAME, "prompt": list(range(37)), "max_tokens": 12, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    resp = await client.post("/v1/completions", json=body)
    assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/event-stream")
    events = await sse_events(resp)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    tokens = [c for c in chunks if c["choices"]]
    assert len(tokens) == 12 and tokens[-1]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["usage"] == {"prompt_tokens": 37, "completion_tokens": 12,
                                   "total_tokens": 49}  # fmt: skip


async def test_chat_non_streaming_and_text_prompt_count(client: TestClient) -> None:
    body = {"messages": [{"role": "user", "content": "one two three four five"}],
            "max_tokens": 3}  # fmt: skip
    data = await (await client.post("/v1/chat/completions", json=body)).json()
    assert data["object"] == "chat.completion"
    assert data["usage"]["completion_tokens"] == 3
    assert data["usage"]["prompt_tokens"] == count_text_tokens("a b c d e") + 4 == 11
    resp = await client.post("/v1/chat/completions", json={**body, "stream": True})
    events = await sse_events(resp)
    assert json.loads(events[0])["choices"][0]["delta"]["role"] == "assistant"
    assert len(events) == 1 + 3 + 1  # role chunk, tokens, [DONE]


async def test_client_errors(client: TestClient) -> None:
    resp = await client.post("/v1/completions", json={"model": "other", "prompt": "x"})
    assert resp.status == 404 and "does not exist" in (await resp.json())["error"]["message"]
    resp = await client.post("/v1/completions", json={"prompt": [1] * 8000, "max_tokens": 500})
    assert resp.status == 400 and "max_model_len" in (await resp.text())
    resp = await client.post("/v1/completions", json={"prompt": "x", "max_tokens": 0})
    assert resp.status == 400
    resp = await client.post("/v1/completions", data=b"{not json")
    assert resp.status == 400


async def test_metrics_exact_vllm_names_types_buckets(client: TestClient) -> None:
    await client.post("/v1/completions", json={"prompt": [1] * 20, "max_tokens": 5})
    fams = await metric_families(client)
    expected = {  # parser names: counters lose _total, histograms keep their base name
        "vllm:num_requests_running": "gauge", "vllm:num_requests_waiting": "gauge",
        "vllm:kv_cache_usage_perc": "gauge", "vllm:cache_config_info": "gauge",
        "vllm:prompt_tokens": "counter", "vllm:generation_tokens": "counter",
        "vllm:request_success": "counter", "vllm:num_preemptions": "counter",
        "vllm:prefix_cache_queries": "counter", "vllm:prefix_cache_hits": "counter",
        "vllm:time_to_first_token_seconds": "histogram",
        "vllm:inter_token_latency_seconds": "histogram",
        "vllm:request_time_per_output_token_seconds": "histogram",
        "vllm:e2e_request_latency_seconds": "histogram",
        "vllm:request_queue_time_seconds": "histogram",
        "vllm:request_prefill_time_seconds": "histogram",
        "vllm:request_decode_time_seconds": "histogram",
        "vllm:request_inference_time_seconds": "histogram",
        "vllm:request_prompt_tokens": "histogram",
        "vllm:request_generation_tokens": "histogram",
        "vllm:iteration_tokens_total": "histogram",
    }  # fmt: skip
    for name, kind in expected.items():
        assert fams[name].type == kind, name
    samples = {s.name: s for f in fams.values() for s in f.samples}
    assert samples["vllm:prompt_tokens_total"].value == 20
    assert samples["vllm:generation_tokens_total"].value == 5
    assert samples["vllm:prefix_cache_queries_total"].value == 20  # no prefix cache: all miss
    assert samples["vllm:prefix_cache_hits_total"].value == 0
    assert samples["vllm:num_requests_running"].labels == {"model_name": NAME, "engine": "0"}
    ttft_le = [s.labels["le"] for s in fams["vllm:time_to_first_token_seconds"].samples
               if s.name.endswith("_bucket")]  # fmt: skip
    assert [float(x) for x in ttft_le[:-1]] == list(TTFT_BUCKETS) and ttft_le[-1] == "+Inf"
    itl_le = {s.labels.get("le") for s in fams["vllm:inter_token_latency_seconds"].samples}
    assert {float(x) for x in itl_le if x not in ("+Inf", None)} == set(ITL_BUCKETS)
    ok = [
        s
        for s in fams["vllm:request_success"].samples
        if s.name == "vllm:request_success_total" and s.labels["finished_reason"] == "length"
    ]
    assert ok[0].value == 1 and ok[0].labels["engine"] == "0"
    info = fams["vllm:cache_config_info"].samples[0]
    assert info.value == 1 and info.labels["block_size"] == "16" and info.labels["engine"] == "0"


async def test_queueing_beyond_max_num_seqs() -> None:
    client = await make_client(max_num_seqs=2, time_scale=5.0)  # ~0.1 s wall per request
    try:
        body = {"prompt": [1] * 100, "max_tokens": 60}
        tasks = [asyncio.create_task(client.post("/v1/completions", json=body)) for _ in range(6)]
        seen = []
        for _ in range(50):  # poll: the shared test machine may be slow to send all six
            state = await (await client.get("/admin/state")).json()
            seen.append((state["running"], state["waiting"]))
            if seen[-1] == (2, 4):
                break
            await asyncio.sleep(0.005)
        assert (2, 4) in seen and all(r <= 2 for r, _ in seen)
        for resp in await asyncio.gather(*tasks):
            assert (await resp.json())["usage"]["completion_tokens"] == 60
        samples = {s.name: s.value for f in (await metric_families(client)).values()
                   for s in f.samples}  # fmt: skip
        assert samples["vllm:request_queue_time_seconds_count"] == 6
        # 4 of 6 waited for at least one 60-token request: ~0.5 s of simulated time each
        assert samples["vllm:request_queue_time_seconds_sum"] > 4 * 0.3
    finally:
        await client.close()


async def test_admin_reality_slows_the_engine(client: TestClient) -> None:
    async def mean_itl() -> float:
        before = await metric_families(client)
        await client.post("/v1/completions", json={"prompt": [1] * 10, "max_tokens": 20})
        after = await metric_families(client)

        def total(fams: dict[str, Metric], suffix: str) -> float:
            fam = fams["vllm:inter_token_latency_seconds"]
            return sum(s.value for s in fam.samples if s.name.endswith(suffix))

        return (total(after, "_sum") - total(before, "_sum")) / (
            total(after, "_count") - total(before, "_count")
        )

    base = await mean_itl()
    resp = await client.post("/admin/reality", json={"reality_factor": 3.0})
    assert (await resp.json()) == {"reality_factor": 3.0}
    assert await mean_itl() == pytest.approx(3 * base, rel=0.05)
    assert (await client.post("/admin/reality", json={"reality_factor": -1})).status == 400


async def test_client_disconnect_aborts_request(client: TestClient) -> None:
    body = {"prompt": [1] * 10, "max_tokens": 5000, "stream": True}
    resp = await client.post("/v1/completions", json=body)
    await resp.content.readline()
    resp.close()
    for _ in range(100):
        state = await (await client.get("/admin/state")).json()
        if state["finished"].get("abort"):
            break
        await asyncio.sleep(0.02)
    assert state["finished"] == {"abort": 1} and state["running"] == 0


def test_cli_registration() -> None:
    from rooftop_cli.main import build_parser

    argv = ["engine-sim", "--port", "9000", "--model-name", "m", "--time-scale", "10"]
    args = build_parser(argv).parse_args(argv)
    assert args.port == 9000 and args.model_name == "m" and args.time_scale == 10
    assert args.func.__name__ == "run"
