"""The drain middleware and preStop script vLLM pods run (rooftop_operator/engine_drain.py).

The real-vLLM test (tests/e2e/test_engine_drain.py) shows the loss it prevents; these
pin down its rules with a fake clock and hand-driven ASGI messages.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from rooftop_operator import engine_drain
from rooftop_operator.engine_drain import Connections, DrainMiddleware

A = (("10.0.0.7", 40000), ("10.0.0.9", 8000))  # one client connection
B = (("10.0.0.8", 40001), ("10.0.0.9", 8000))


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def conns(clock: Clock) -> Connections:
    return Connections(keepalive_s=5.0, clock=clock)


def serve(conns: Connections, conn: Any, *, finish: bool = True) -> None:
    """One request on ``conn``: response start, first chunk, and (``finish``) the end."""
    conns.request_started(conn)
    conns.response_started(conn)
    conns.body_sent(conn)
    if finish:
        conns.request_done(conn)


def test_an_idle_kept_alive_connection_is_busy_until_the_keepalive_timeout(
    conns: Connections, clock: Clock
) -> None:
    serve(conns, A)
    conns.draining = True
    assert conns.busy() == 1  # its client may still send the next request on it
    clock.now = 4.9
    assert conns.busy() == 1
    clock.now = 5.0  # the server has closed it
    assert conns.busy() == 0


def test_a_stream_that_began_before_the_drain_keeps_its_connection_busy(
    conns: Connections, clock: Clock
) -> None:
    """Its response carries no Connection: close, so the client reuses the connection
    when it ends; the request it then sends is told to close, and once the engine has
    taken that one the connection can bring nothing more."""
    serve(conns, A, finish=False)
    conns.draining = True
    clock.now = 60.0
    assert conns.busy() == 1
    conns.request_done(A)
    conns.request_started(A)  # the client's next request on the same connection
    assert conns.response_started(A) is True
    assert conns.busy() == 1  # not yet taken by the engine
    conns.body_sent(A)
    assert conns.busy() == 0
    conns.request_done(A)
    assert conns.busy() == 0  # closed after this response


def test_a_request_the_engine_has_not_taken_is_busy_even_on_a_closing_connection(
    conns: Connections,
) -> None:
    conns.draining = True
    conns.request_started(B)  # a late connection, e.g. from a slow proxy
    assert conns.busy() == 1
    conns.response_started(B)
    assert conns.busy() == 1
    conns.body_sent(B)
    assert conns.busy() == 0


def test_nothing_closes_before_the_drain(conns: Connections) -> None:
    conns.request_started(A)
    assert conns.response_started(A) is False


# ---------------------------------------------------------------- the ASGI middleware


class App:
    """A streaming endpoint: response start, two chunks."""

    def __init__(self) -> None:
        self.calls = 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.calls += 1
        headers = [(b"content-type", b"text/event-stream"), (b"Connection", b"keep-alive")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"data: x\n\n", "more_body": True})
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})


def call(app: DrainMiddleware, path: str, method: str = "POST",
         client: tuple[str, int] = A[0]) -> list[dict[str, Any]]:  # fmt: skip
    sent: list[dict[str, Any]] = []
    scope = {"type": "http", "path": path, "method": method, "client": client, "server": A[1]}

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Any) -> None:
        sent.append(dict(message))

    asyncio.run(app(scope, receive, send))
    return sent


def header(messages: list[dict[str, Any]], name: bytes) -> list[bytes]:
    start = messages[0]
    return [v for k, v in start["headers"] if k.lower() == name]


def test_after_the_drain_starts_every_response_closes_its_connection() -> None:
    app = DrainMiddleware(App(), Connections(5.0))
    assert header(call(app, "/v1/completions"), b"connection") == [b"keep-alive"]
    answer = call(app, engine_drain.DRAIN_PATH, client=("127.0.0.1", 50000))
    assert json.loads(answer[1]["body"]) == {"draining": True, "busy": 1}
    streamed = call(app, "/v1/completions")
    assert header(streamed, b"connection") == [b"close"]  # replaced, not doubled
    assert [m["body"] for m in streamed[1:]] == [b"data: x\n\n", b"data: [DONE]\n\n"]


def test_only_the_pod_itself_may_drain_it() -> None:
    inner = App()
    app = DrainMiddleware(inner, Connections(5.0))
    refused = call(app, engine_drain.DRAIN_PATH, client=("10.0.0.7", 40000))
    assert refused[0]["status"] == 403 and app.connections.draining is False
    looked = call(app, engine_drain.DRAIN_PATH, "GET", client=("::1", 50000))
    assert looked[0]["status"] == 200 and app.connections.draining is False
    assert inner.calls == 0  # the control path never reaches vLLM


def test_other_scopes_pass_through() -> None:
    seen: list[str] = []

    async def lifespan(scope: Any, receive: Any, send: Any) -> None:
        seen.append(scope["type"])

    asyncio.run(DrainMiddleware(lifespan)({"type": "lifespan"}, None, None))  # type: ignore[arg-type]
    assert seen == ["lifespan"]


def test_keepalive_follows_vllms_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(engine_drain.KEEPALIVE_ENV, "12")
    assert engine_drain.keepalive_s() == 12.0
    monkeypatch.setenv(engine_drain.KEEPALIVE_ENV, "soon")
    assert engine_drain.keepalive_s() == engine_drain.DEFAULT_KEEPALIVE_S


# ---------------------------------------------------------------- the preStop script


class DrainEndpoint(ThreadingHTTPServer):
    """The engine's drain endpoint, answering ``busy`` from a script of values."""

    def __init__(self, busy: list[int]) -> None:
        self.busy, self.posts, self.gets = busy, 0, 0
        super().__init__(("127.0.0.1", 0), Handler)


class Handler(BaseHTTPRequestHandler):
    server: DrainEndpoint

    def _answer(self) -> None:
        busy = self.server.busy.pop(0) if len(self.server.busy) > 1 else self.server.busy[0]
        body = json.dumps({"draining": True, "busy": busy}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        self.server.posts += 1
        self._answer()

    def do_GET(self) -> None:  # noqa: N802
        self.server.gets += 1
        self._answer()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def endpoint(request: pytest.FixtureRequest) -> Iterator[DrainEndpoint]:
    server = DrainEndpoint(list(request.param))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def run_prestop(port: int, min_s: float, max_s: float) -> tuple[str, float]:
    clock = Clock()

    def sleep(seconds: float) -> None:
        clock.now += seconds

    why = engine_drain.prestop(port, min_s, max_s, clock=clock, sleep=sleep)
    return why, clock.now


@pytest.mark.parametrize("endpoint", [[0]], indirect=True)
def test_prestop_waits_for_the_endpoints_even_when_nothing_is_busy(
    endpoint: DrainEndpoint,
) -> None:
    why, waited = run_prestop(endpoint.server_address[1], 10, 40)
    assert endpoint.posts == 1 and "no connection busy" in why
    assert waited == pytest.approx(10, abs=engine_drain.POLL_S)


@pytest.mark.parametrize("endpoint", [[3, 3, 2, 1, 0]], indirect=True)
def test_prestop_waits_past_the_minimum_until_no_connection_is_busy(
    endpoint: DrainEndpoint,
) -> None:
    why, waited = run_prestop(endpoint.server_address[1], 1, 40)
    assert "no connection busy" in why
    assert endpoint.gets == 4 and waited == pytest.approx(1 + 3 * engine_drain.POLL_S, abs=0.01)


@pytest.mark.parametrize("endpoint", [[5]], indirect=True)
def test_prestop_gives_up_at_the_maximum(endpoint: DrainEndpoint) -> None:
    why, waited = run_prestop(endpoint.server_address[1], 1, 3)
    assert "still busy after 3s" in why and waited == pytest.approx(3, abs=engine_drain.POLL_S)


def test_prestop_returns_at_once_when_the_engine_does_not_answer() -> None:
    from tests.cluster.controlplane import free_port

    why, waited = run_prestop(free_port(), 10, 40)
    assert "not serving" in why and waited == 0
