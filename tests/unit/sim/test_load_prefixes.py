"""rooftop load shares prompt prefixes on purpose: a system prompt every request starts
with, or the blocks a Mooncake trace names, so an engine's prefix cache hits exactly on
them (measured against engine-sim's cache, which hashes token ids as vLLM does)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp.test_utils import TestServer
from prometheus_client.parser import text_string_to_metric_families

from rooftop_sim import loadgen
from rooftop_sim.engine.server import EngineSimConfig, build_app
from rooftop_sim.loadgen import LoadSpec, run_load
from rooftop_sim.traces import load_trace


@pytest.fixture
async def server() -> AsyncIterator[TestServer]:
    srv = TestServer(build_app(EngineSimConfig(model_name="sim", time_scale=50.0)))
    await srv.start_server()
    yield srv
    await srv.close()


def test_shared_ids_start_every_prompt_and_nothing_after_them_is_shared() -> None:
    a, b = loadgen.prompt_ids(100, shared=48), loadgen.prompt_ids(100, shared=48)
    assert len(a) == len(b) == 100 and a[:48] == b[:48] and a[48:50] != b[48:50]
    assert loadgen.prompt_ids(10, shared=48) == a[:10]  # a prompt shorter than the prefix


def test_a_traces_blocks_become_the_same_ids_wherever_they_appear() -> None:
    first = loadgen.block_prompt_ids([0, 5], 4, 10)
    later = loadgen.block_prompt_ids([0, 5, 9], 4, 14)
    other = loadgen.block_prompt_ids([0, 6], 4, 10)
    assert later[:8] == first[:8] and other[:4] == first[:4] and other[4:8] != first[4:8]
    assert len(first) == 10 and first[8:] != later[8:10]  # beyond the named blocks: unique


async def _counters(srv: TestServer) -> dict[str, float]:
    async with aiohttp.ClientSession() as session, session.get(str(srv.make_url("/metrics"))) as r:
        text = await r.text()
    names = ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total")
    return {
        s.name: s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name in names
    }


async def test_a_shared_system_prompt_hits_on_every_request_but_the_first(
    server: TestServer,
) -> None:
    """48 shared tokens of 64 are three 16-token blocks: every later prompt finds them."""
    url = str(server.make_url("")).rstrip("/")
    spec = LoadSpec(url, "sim", rate=40.0, duration_s=0.5, prompt_tokens=64, output_tokens=2,
                    shared_prefix_tokens=48, max_requests=12)  # fmt: skip
    report = await run_load(spec)
    assert report.completed == report.sent == 12
    counts = await _counters(server)
    assert counts["vllm:prefix_cache_queries_total"] == 12 * 64
    assert counts["vllm:prefix_cache_hits_total"] == 11 * 48


async def test_a_mooncake_trace_replays_its_shared_blocks(
    server: TestServer, tmp_path: Path
) -> None:
    """Turn two repeats turn one's two blocks (32 tokens of 16-token engine blocks each
    trace block of 512 covers); the unrelated third request shares only block 0."""
    rows = [
        {"timestamp": 0, "input_length": 600, "output_length": 2, "hash_ids": [0, 1]},
        {"timestamp": 100, "input_length": 1100, "output_length": 2, "hash_ids": [0, 1, 2]},
        {"timestamp": 200, "input_length": 600, "output_length": 2, "hash_ids": [0, 3]},
    ]
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    url = str(server.make_url("")).rstrip("/")
    spec = LoadSpec(url, "sim", trace=load_trace(path), duration_s=5.0)
    report = await run_load(spec)
    assert report.completed == 3
    counts = await _counters(server)
    # turn 2 finds its first 600 tokens' full blocks (37 x 16 = 592); request 3 block 0
    assert counts["vllm:prefix_cache_hits_total"] == 592 + 512


def test_every_id_is_in_the_tiny_models_vocabulary() -> None:
    """An id beyond a model's vocabulary is an error, and vLLM then streams no token: the
    real-vLLM e2e's tiny model has 4,096 ids (tests/engine/tiny_model.py)."""
    prompts = [loadgen.prompt_ids(2048, shared=100) for _ in range(50)]
    prompts += [loadgen.block_prompt_ids([0, 7, 123_456_789], 512, 2048)]
    assert all(1000 <= i < 4096 for p in prompts for i in p)
