"""engine-sim's prefix cache over HTTP: repeated prompts hit as in vLLM, and /metrics
counts vLLM's prefix_cache_queries and prefix_cache_hits in tokens."""

from __future__ import annotations

import argparse
from typing import Any

from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families

from rooftop_sim.engine.server import (
    EngineSimConfig,
    add_arguments,
    build_app,
    chat_prompt_ids,
    config_from_args,
    text_token_ids,
)


async def make_client(caching: bool = True) -> TestClient:
    cfg = EngineSimConfig(time_scale=50.0, enable_prefix_caching=caching)
    client = TestClient(TestServer(build_app(cfg)))
    await client.start_server()
    return client


async def counters(client: TestClient) -> dict[str, float]:
    text = await (await client.get("/metrics")).text()
    names = ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total")
    return {
        s.name: s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name in names
    }


async def post(client: TestClient, path: str, body: dict[str, Any]) -> None:
    resp = await client.post(path, json={**body, "max_tokens": 2})
    assert resp.status == 200, await resp.text()


async def test_a_repeated_token_prompt_hits_all_but_its_last_block() -> None:
    """100 token ids are 6 full blocks: the second time 96 tokens are found."""
    client = await make_client()
    try:
        for _ in range(2):
            await post(client, "/v1/completions", {"prompt": [7] * 100})
        assert await counters(client) == {
            "vllm:prefix_cache_queries_total": 200.0,
            "vllm:prefix_cache_hits_total": 96.0,
        }
    finally:
        await client.close()


async def test_a_chat_that_continues_a_conversation_finds_its_beginning() -> None:
    """The second turn repeats the first turn's messages: their full blocks are found,
    and nothing of a different conversation is."""
    first = [{"role": "user", "content": " ".join(f"w{i}" for i in range(60))}]
    second = [*first, {"role": "assistant", "content": "sure"}, {"role": "user", "content": "go"}]
    other = [{"role": "user", "content": " ".join(f"x{i}" for i in range(60))}]
    client = await make_client()
    try:
        for messages in (first, second, other):
            await post(client, "/v1/chat/completions", {"messages": messages})
        got = await counters(client)
        whole_blocks = len(chat_prompt_ids({"messages": first})) // 16 * 16
        assert got["vllm:prefix_cache_hits_total"] == whole_blocks > 0
    finally:
        await client.close()


def test_a_text_that_extends_another_begins_with_its_token_ids() -> None:
    short = "the quick brown fox jumps over the lazy dog " * 3
    longer = short + "and runs away"
    assert text_token_ids(longer)[: len(text_token_ids(short))] == text_token_ids(short)


async def test_no_enable_prefix_caching_finds_nothing_and_says_so() -> None:
    """vLLM's flag: no look-ups are counted, and cache_config_info reports it off."""
    args = argparse.ArgumentParser()
    add_arguments(args)
    assert config_from_args(args.parse_args([])).enable_prefix_caching
    cfg = config_from_args(args.parse_args(["--no-enable-prefix-caching"]))
    assert not cfg.enable_prefix_caching
    client = await make_client(caching=False)
    try:
        for _ in range(2):
            await post(client, "/v1/completions", {"prompt": [7] * 100})
        assert await counters(client) == {
            "vllm:prefix_cache_queries_total": 0.0,
            "vllm:prefix_cache_hits_total": 0.0,
        }
        text = await (await client.get("/metrics")).text()
        assert 'enable_prefix_caching="False"' in text
    finally:
        await client.close()
