"""A client that keeps its connection alive, as HTTP client libraries do, streaming
completions from a vLLM engine: what a ClusterIP pins to one pod.

A stream counts as served only when it ends with ``data: [DONE]`` after every token
it asked for, as its usage chunk counts them (``ignore_eos``, so the random tiny model
never stops early; one chunk may carry several tokens).
"""

from __future__ import annotations

import http.client
import json
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Stream:
    """One streamed completion as the client saw it."""

    connection_header: str | None = None
    chunks: int = 0
    tokens: int = 0  # completion tokens, from the final usage chunk
    finish_reason: str | None = None
    done: bool = False  # the stream ended with `data: [DONE]`
    error: str | None = None
    first_chunk: threading.Event = field(default_factory=threading.Event)

    def served(self, max_tokens: int) -> bool:
        return self.done and self.finish_reason == "length" and self.tokens == max_tokens


def _record(chunk: Mapping[str, Any], out: Stream) -> None:
    """One `data:` chunk: a choice (text, maybe a finish reason) or the usage."""
    for choice in chunk.get("choices") or []:
        out.chunks += 1
        out.finish_reason = choice.get("finish_reason") or out.finish_reason
        out.first_chunk.set()
    usage = chunk.get("usage")
    if usage:
        out.tokens = int(usage["completion_tokens"])
    if "error" in chunk:  # vLLM reports a failure inside the stream
        out.error = json.dumps(chunk["error"])[:500]


def read_stream(
    conn: http.client.HTTPConnection, model: str, max_tokens: int, out: Stream,
    extra: Mapping[str, Any] | None = None,
) -> None:  # fmt: skip
    """Send one streamed completion on ``conn`` (reused while the server keeps it)
    and record what came back in ``out``; never raises."""
    body = {"model": model, "prompt": "The quick", "max_tokens": max_tokens, "stream": True,
            "stream_options": {"include_usage": True}, "ignore_eos": True, "temperature": 0,
            **(extra or {})}  # fmt: skip
    try:
        conn.request("POST", "/v1/completions", json.dumps(body),
                     {"Content-Type": "application/json"})  # fmt: skip
        resp = conn.getresponse()
        out.connection_header = resp.getheader("connection")
        for raw in resp:
            line = raw.decode().strip()
            if line == "data: [DONE]":
                out.done = True
            elif line.startswith("data:"):
                _record(json.loads(line[5:]), out)
    except (OSError, http.client.HTTPException, ValueError) as err:
        out.error = repr(err)
    finally:
        out.first_chunk.set()


class KeptAliveClient(threading.Thread):
    """One connection: a long stream, then the next request on the same connection.

    Args:
        host, port: where the engine (or its Service) listens.
        model: the served model name.
        lengths: (first, second) stream lengths in tokens.
        extra: more request fields, e.g. ``logprobs`` to slow each step down.
    """

    def __init__(self, host: str, port: int, model: str, lengths: tuple[int, int],
                 extra: Mapping[str, Any] | None = None) -> None:  # fmt: skip
        super().__init__(daemon=True)
        self.conn = http.client.HTTPConnection(host, port, timeout=300)
        self.model, self.lengths, self.extra = model, lengths, extra
        self.first, self.second = Stream(), Stream()
        self.kept_alive = False  # the second request went on the first's connection

    def run(self) -> None:
        read_stream(self.conn, self.model, self.lengths[0], self.first, self.extra)
        self.kept_alive = self.conn.sock is not None
        read_stream(self.conn, self.model, self.lengths[1], self.second)
        self.conn.close()

    def served(self) -> bool:
        return self.first.served(self.lengths[0]) and self.second.served(self.lengths[1])
