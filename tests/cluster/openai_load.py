"""Open-loop streamed completions from the OpenAI Python client, as users send them.

Run with the vLLM venv's python (vLLM depends on ``openai``); the zero-loss scenario
(tests/e2e/test_zero_loss.py) runs it beside ``rooftop load``'s own client, so each
event is also measured through the client most applications use: its httpx pool keeps
connections alive, and it retries a request that failed to connect (``max_retries``,
2 by default), as deployed.

    python openai_load.py BASE_URL MODEL RATE MAX_TOKENS OUT.jsonl [SEED]

Poisson arrivals at RATE per second until its standard input closes; then it waits for
the requests in flight and exits. OUT gets one JSON line when a request is sent
(``{"id", "at"}``) and one when it ends (``{"id", "ended", "chunks", "tokens",
"finish", "error"}``), times on the system's monotonic clock, so the caller can count
any window. A stream is served when it ended without error, with ``finish_reason``
"length" and MAX_TOKENS completion tokens in its usage chunk (``ignore_eos``: the
random tiny model never stops early; a chunk may carry several tokens when the client
reads slower than the engine writes).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import sys
import threading
import time
from typing import IO, Any

from openai import AsyncOpenAI


def write(out: IO[str], record: dict[str, Any]) -> None:
    out.write(json.dumps(record) + "\n")
    out.flush()


async def one(client: AsyncOpenAI, model: str, max_tokens: int, rid: int, out: IO[str]) -> None:
    write(out, {"id": rid, "at": time.monotonic()})
    chunks, tokens, finish, error = 0, 0, None, None
    try:
        stream = await client.completions.create(
            model=model, prompt="The quick", max_tokens=max_tokens, stream=True,
            temperature=0, extra_body={"ignore_eos": True},
            stream_options={"include_usage": True},
        )  # fmt: skip
        async for chunk in stream:
            if chunk.choices:
                chunks += 1
                finish = chunk.choices[0].finish_reason or finish
            if chunk.usage is not None:
                tokens = chunk.usage.completion_tokens
    except Exception as err:  # noqa: BLE001 (every failure is a result here)
        error = f"{type(err).__name__}: {err}"[:300]
    write(out, {"id": rid, "ended": time.monotonic(), "chunks": chunks, "tokens": tokens,
                "finish": finish, "error": error})  # fmt: skip


async def main(base_url: str, model: str, rate: float, max_tokens: int, path: str,
               seed: int) -> None:  # fmt: skip
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    def wait_for_eof() -> None:
        sys.stdin.read()
        loop.call_soon_threadsafe(stop.set)

    threading.Thread(target=wait_for_eof, daemon=True).start()
    client = AsyncOpenAI(base_url=f"{base_url}/v1", api_key="unused", timeout=300.0)
    rng = random.Random(seed)
    tasks: set[asyncio.Task[None]] = set()
    with open(path, "a") as out:
        rid = 0
        while not stop.is_set():
            task = asyncio.create_task(one(client, model, max_tokens, rid, out))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            rid += 1
            with contextlib.suppress(TimeoutError):  # the next arrival, unless stopped
                await asyncio.wait_for(stop.wait(), rng.expovariate(rate))
        if tasks:
            await asyncio.wait(tasks, timeout=120)
    await client.close()


if __name__ == "__main__":
    args = sys.argv[1:]
    seed = int(args[5]) if len(args) > 5 else 11
    asyncio.run(main(args[0], args[1], float(args[2]), int(args[3]), args[4], seed))
