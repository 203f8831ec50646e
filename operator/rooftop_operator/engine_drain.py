"""Close an engine pod's kept-alive connections before vLLM drains its requests.

This file runs inside the vLLM container, not in the operator. The operator ships it
in the target's ConfigMap as ``rooftop_drain.py``. vLLM loads ``DrainMiddleware`` through
its own ``--middleware`` flag, and the pod's ``preStop`` hook runs the file as a
script. It uses the standard library only, and no vLLM internals: an ASGI middleware
works with any vLLM version.

**Why.** A Service's ClusterIP pins each TCP connection to one pod, and the
connection stays pinned after the pod leaves the endpoints: removing the endpoint
stops new connections, not reused ones. Once SIGTERM starts vLLM's drain
(``--shutdown-timeout``), vLLM finishes the requests it holds but aborts every new one
(HTTP 200, an empty stream, ``finish_reason`` abort). A client that reuses its
kept-alive connection to a terminating pod therefore loses that request.

**How a pod stops** (the pod's ``preStop``, then SIGTERM):

1. ``POST /rooftop/drain`` (loopback only). From then on every response carries
   ``Connection: close``, so each client's next request opens a new connection, which
   the Service sends to another pod.
2. Wait at least ``--min-s`` (endpoint removal reaching every proxy), then until no
   connection could still bring a request (``busy`` is 0), at most ``--max-s``. Busy:
   - a request not yet admitted to the engine (no response body sent yet);
   - a connection whose response in flight started before the drain: it carries no
     ``Connection: close``, so its client will send the next request on it;
   - an idle kept-alive connection, until the server's keep-alive timeout
     (``VLLM_HTTP_TIMEOUT_KEEP_ALIVE``, 5 s by default) closes it.
3. SIGTERM: vLLM finishes the admitted requests, all on closing connections, and exits.

A client still loses a request when it sends it just as the server's keep-alive timeout
closes the idle connection under it. That race is HTTP's own, and it exists without any
drain; clients avoid it with an idle timeout shorter than the server's.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
# One TCP connection: the ASGI scope's (client, server) addresses.
Conn = tuple[Any, Any]

DRAIN_PATH: Final = "/rooftop/drain"
KEEPALIVE_ENV: Final = "VLLM_HTTP_TIMEOUT_KEEP_ALIVE"
DEFAULT_KEEPALIVE_S: Final = 5.0
POLL_S: Final = 0.2


@dataclass
class _Request:
    """One request in progress on a connection."""

    closes: bool = False  # its response carries Connection: close
    admitted: bool = False  # a body chunk was sent: the engine has taken the request


class Connections:
    """Which connections could still bring this engine a request (module doc, step 2).

    Args:
        keepalive_s: how long the server keeps an idle connection open, s.
        clock: monotonic seconds.
    """

    def __init__(self, keepalive_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.keepalive_s = keepalive_s
        self.clock = clock
        self.draining = False
        self._requests: dict[Conn, _Request] = {}
        self._idle_since: dict[Conn, float] = {}

    def request_started(self, conn: Conn) -> None:
        self._idle_since.pop(conn, None)
        self._requests[conn] = _Request()

    def response_started(self, conn: Conn) -> bool:
        """Whether this response must close its connection (the pod is draining)."""
        request = self._requests.setdefault(conn, _Request())
        request.closes = self.draining
        return request.closes

    def body_sent(self, conn: Conn) -> None:
        self._requests.setdefault(conn, _Request()).admitted = True

    def request_done(self, conn: Conn) -> None:
        """The response ended (or the app gave up): a connection that stays open is
        idle from now until the client reuses it or the keep-alive timeout closes it."""
        request = self._requests.pop(conn, None)
        if request is None or not request.closes:
            self._idle_since[conn] = self.clock()

    def busy(self) -> int:
        """How many connections could still bring a request, or hold one the engine
        has not taken yet (module doc, step 2)."""
        now = self.clock()
        expired = [c for c, t in self._idle_since.items() if now - t >= self.keepalive_s]
        for conn in expired:
            del self._idle_since[conn]
        waiting = sum(1 for r in self._requests.values() if not (r.closes and r.admitted))
        return waiting + len(self._idle_since)


def keepalive_s() -> float:
    """The server's idle keep-alive timeout, s: vLLM passes this variable to uvicorn."""
    try:
        return float(os.environ.get(KEEPALIVE_ENV, DEFAULT_KEEPALIVE_S))
    except ValueError:
        return DEFAULT_KEEPALIVE_S


def _with_close(headers: Sequence[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    kept = [(k, v) for k, v in headers if k.lower() != b"connection"]
    return [*kept, (b"connection", b"close")]


def _loopback(scope: Scope) -> bool:
    client = scope.get("client")
    if not client:
        return False
    try:
        return ipaddress.ip_address(str(client[0])).is_loopback
    except ValueError:
        return False


async def _json(send: Send, status: int, body: dict[str, Any]) -> None:
    payload = json.dumps(body).encode()
    headers = [(b"content-type", b"application/json"), (b"connection", b"close")]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


class DrainMiddleware:
    """vLLM ``--middleware rooftop_drain.DrainMiddleware`` (module doc).

    Serves ``DRAIN_PATH`` to loopback clients (the pod's own ``preStop``): POST starts
    the drain, GET reads it; both answer ``{"draining": bool, "busy": int}``.
    """

    def __init__(self, app: ASGIApp, connections: Connections | None = None) -> None:
        self.app = app
        self.connections = connections or Connections(keepalive_s())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
        elif scope.get("path") == DRAIN_PATH:
            await self._control(scope, send)
        else:
            await self._tracked(scope, receive, send)

    async def _control(self, scope: Scope, send: Send) -> None:
        if not _loopback(scope):
            await _json(send, 403, {"error": "only the pod itself may drain it"})
            return
        if scope.get("method") == "POST":
            self.connections.draining = True
        state = {"draining": self.connections.draining, "busy": self.connections.busy()}
        await _json(send, 200, state)

    async def _tracked(self, scope: Scope, receive: Receive, send: Send) -> None:
        client, server = scope.get("client"), scope.get("server")
        conn: Conn = (tuple(client) if client else None, tuple(server) if server else None)
        connections = self.connections
        connections.request_started(conn)

        async def tracked_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                if connections.response_started(conn):
                    message = {**message, "headers": _with_close(message.get("headers", []))}
            elif message["type"] == "http.response.body":
                connections.body_sent(conn)
            await send(message)

        try:
            await self.app(scope, receive, tracked_send)
        finally:
            connections.request_done(conn)


# ---------------------------------------------------------------- the preStop script


def _call(url: str, method: str) -> dict[str, Any] | None:
    """The drain endpoint's answer, or None when the engine does not answer (not
    started, or gone): then nothing is left to drain."""
    request = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None)
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            answer: dict[str, Any] = json.loads(response.read())
            return answer
    except (OSError, ValueError):
        return None


def prestop(
    port: int,
    min_s: float,
    max_s: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> str:
    """Steps 1 and 2 of the module doc; returns why it stopped waiting."""
    url = f"http://127.0.0.1:{port}{DRAIN_PATH}"
    start = clock()
    if _call(url, "POST") is None:
        return "engine not serving: nothing to drain"
    while clock() - start < max_s:
        if clock() - start >= min_s:
            state = _call(url, "GET")
            if state is None:
                return "engine stopped answering"
            if int(state.get("busy", 0)) == 0:
                return f"no connection busy after {clock() - start:.1f}s"
        sleep(POLL_S)
    return f"still busy after {max_s:.0f}s: SIGTERM drains what is left"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=8000, help="the engine's HTTP port")
    least, most = "wait at least this long, s (endpoint removal)", "wait at most this long, s"
    parser.add_argument("--min-s", type=float, required=True, help=least)
    parser.add_argument("--max-s", type=float, required=True, help=most)
    args = parser.parse_args(argv)
    print(f"rooftop drain: {prestop(args.port, args.min_s, args.max_s)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
