"""A kept-alive client loses no request when its vLLM engine pod stops.

A Service's ClusterIP keeps a kept-alive connection on its pod after the pod leaves
the endpoints, and once SIGTERM starts vLLM's drain it aborts every new request. This
module runs the real vLLM (CPU build, tiny model) as a host process and plays the
kubelet's part in the order a pod stops: the ``preStop`` hook, then SIGTERM. One
client holds one kept-alive connection, as an HTTP client library does, and streams a
long completion, then sends its next request on the same connection:

- **Rooftop's pods** load the drain middleware (``engine_drain``, with vLLM's own
  ``--middleware``) and their preStop runs it as a script. A request sent on a
  kept-alive connection once the drain has begun is served and told to close its
  connection, so the client would open the one after on another pod; the preStop
  returns only once no connection is busy (the stream in flight included), and
  SIGTERM's drain finishes what is left. The test sends that request only after the
  middleware reports the drain, so the order never depends on the engine's speed.
- **A preStop that only sleeps** (Rooftop's pods before): SIGTERM arrives while the
  first stream runs, and the next request on the kept-alive connection reaches an
  engine that is draining. It is lost.
"""

from __future__ import annotations

import http.client
import json
import signal
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rooftop_operator import builders, engine_drain
from tests.cluster.handle import wait_until
from tests.cluster.keepalive import KeptAliveClient, Stream, read_stream
from tests.cluster.vllm_engines import VllmProcess, local_engine

pytestmark = pytest.mark.vllm

SERVED = "tiny"
LONG = 2000  # tokens: a stream in flight across the preStop's start
NEXT = 200
SLOW = {"logprobs": 20}  # vLLM's most by default: each step also ranks 20 tokens
SHUTDOWN_TIMEOUT_S = 60
MIN_WAIT_S = 1.0  # the preStop's least wait (endpoint removal); 10 s in a pod
# The server's idle keep-alive timeout, s (vLLM's default is 5). The idle connection
# waits for the preStop script to start and the drain to begin, which took over 5 s on
# a loaded CI machine: uvicorn closed it first (HTTP's own race, engine_drain's doc), a
# broken pipe the drain cannot prevent. Well under the preStop's 60 s too: the drain
# counts a connection idle until this timeout ends it (ASGI says nothing when an idle
# client closes, as the warm-up's urllib does), and at 120 s the preStop gave up first.
KEEPALIVE_S = 30


def engine(vllm_py: Path, model: Path, work: Path, drain: bool) -> VllmProcess:
    args = ["--shutdown-timeout", str(SHUTDOWN_TIMEOUT_S)]
    env = {engine_drain.KEEPALIVE_ENV: str(KEEPALIVE_S)}
    if drain:  # as the pod gets it: the ConfigMap's file on PYTHONPATH
        module_dir = work / "drain"
        module_dir.mkdir()
        (module_dir / f"{builders.DRAIN_MODULE}.py").write_text(builders.drain_source())
        args += ["--middleware", builders.DRAIN_MIDDLEWARE]
        env["PYTHONPATH"] = str(module_dir)
    return local_engine(vllm_py, model, work, SERVED, args, env, max_model_len=2048)


@pytest.fixture
def started(
    request: pytest.FixtureRequest, vllm_py: Path, tiny_model_dir: Path, tmp_path: Path
) -> Iterator[tuple[VllmProcess, Path]]:
    process = engine(vllm_py, tiny_model_dir, tmp_path, drain=bool(request.param))
    process.start()
    try:
        process.wait_ready()
        _warm_up(process)
        yield process, tmp_path
    finally:
        process.stop()


def _warm_up(process: VllmProcess) -> None:
    """One short completion before the test's: the engine's first request can stall for
    a minute (compilation) and then stream its tokens at once, so the long stream would
    end before the preStop began instead of being in flight across it."""
    body = {"model": SERVED, "prompt": "The quick", "max_tokens": 8}
    url, headers = f"{process.url}/v1/completions", {"Content-Type": "application/json"}
    request = urllib.request.Request(url, json.dumps(body).encode(), headers)
    with urllib.request.urlopen(request, timeout=300) as answer:
        assert answer.status == 200


def sigterm_and_wait(process: VllmProcess) -> int:
    """The kubelet's SIGTERM after the preStop; vLLM drains, then exits."""
    assert process.proc is not None
    process.proc.send_signal(signal.SIGTERM)
    return process.proc.wait(timeout=SHUTDOWN_TIMEOUT_S + 30)


@pytest.mark.parametrize("started", [True], indirect=True)
def test_the_drain_moves_a_kept_alive_client_before_sigterm(
    started: tuple[VllmProcess, Path], vllm_py: Path
) -> None:
    """In sequence, not by timing: a stream in flight (slowed by logprobs), and an idle
    kept-alive connection whose next request is sent only once the preStop's drain has
    begun. That request is served and told to close; the preStop waits for both."""
    process, work = started
    streaming = KeptAliveClient("127.0.0.1", process.port, SERVED, (LONG, NEXT), SLOW)
    streaming.start()
    assert streaming.first.first_chunk.wait(60) and streaming.first.error is None
    idle = http.client.HTTPConnection("127.0.0.1", process.port, timeout=300)
    before, after = Stream(), Stream()
    read_stream(idle, SERVED, 8, before)
    assert before.served(8) and before.connection_header != "close", before
    script = work / "drain" / f"{builders.DRAIN_MODULE}.py"
    argv = [str(vllm_py), str(script), "--port", str(process.port), "--min-s", str(MIN_WAIT_S),
            "--max-s", str(SHUTDOWN_TIMEOUT_S)]  # fmt: skip
    prestop = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    wait_until(lambda: _drain_state(process)["draining"], 30, "the preStop's drain")
    read_stream(idle, SERVED, NEXT, after)  # the next request on the kept-alive connection
    out, _ = prestop.communicate(timeout=SHUTDOWN_TIMEOUT_S + 30)
    assert prestop.returncode == 0 and "no connection busy" in out, out
    assert after.connection_header == "close"  # the client moves on after it
    assert after.served(NEXT), (after, process.tail())
    assert streaming.first.served(LONG), streaming.first  # the preStop waited for it
    assert sigterm_and_wait(process) == 0
    streaming.join(timeout=60)
    assert streaming.first.connection_header != "close"  # started before the drain


def _drain_state(process: VllmProcess) -> dict[str, Any]:
    """The drain middleware's own answer (loopback only): draining, busy connections."""
    with urllib.request.urlopen(f"{process.url}/rooftop/drain", timeout=5) as answer:
        state: dict[str, Any] = json.loads(answer.read())
    return state


@pytest.mark.parametrize("started", [False], indirect=True)
def test_a_sleep_only_prestop_loses_the_next_request_on_a_kept_alive_connection(
    started: tuple[VllmProcess, Path],
) -> None:
    """What Rooftop's pods did before the drain middleware: the loss it prevents."""
    process, _ = started
    # slowed like the drain case's stream: a warm engine streamed 2,000 plain tokens
    # within the preStop's one-second sleep in a clean-clone run
    client = KeptAliveClient("127.0.0.1", process.port, SERVED, (LONG, NEXT), SLOW)
    client.start()
    assert client.first.first_chunk.wait(60) and client.first.error is None
    # SIGTERM at once, not after the preStop's sleep: how long the sleep lasted changes
    # nothing here but whether the stream still runs at SIGTERM, and a warm engine
    # streamed all LONG tokens, slowed, within one second in a clean-clone run
    assert not client.first.done, "the stream ended before SIGTERM: make LONG longer"
    assert process.proc is not None
    process.proc.send_signal(signal.SIGTERM)
    client.join(timeout=SHUTDOWN_TIMEOUT_S + 30)
    assert client.first.served(LONG), client.first  # the drain finished the stream...
    assert client.kept_alive
    assert not client.second.served(NEXT), client.second  # ...but not the next request
