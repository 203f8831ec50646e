"""engine-sim on SIGTERM, as the operator runs it in a pod: with --shutdown-timeout it
finishes the streams it holds (vLLM's drain), without it they are cut, as vLLM's default
of 0 cuts them."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator

import pytest
from tests.cluster.controlplane import free_port

from rooftop_sim.loadgen import LoadReport, LoadSpec, run_load


def start(port: int, drain_s: int) -> subprocess.Popen[bytes]:
    # time-scale 0.05: an 8B decode step of ~6.5 ms takes ~0.13 s of wall time, so a
    # 30-token answer streams for about 4 s
    argv = [
        sys.executable,
        "-m",
        "rooftop_cli.main",
        "engine-sim",
        "--port",
        str(port),
        "--model-name",
        "sim",
        "--time-scale",
        "0.05",
        "--shutdown-timeout",
        str(drain_s),
    ]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).close()
            return proc
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("engine-sim did not start")  # fmt: skip


@pytest.fixture
def port() -> Iterator[int]:
    yield free_port()


async def stream_through_sigterm(proc: subprocess.Popen[bytes], port: int) -> LoadReport:
    spec = LoadSpec(f"http://127.0.0.1:{port}", "sim", rate=20.0, prompt_tokens=16,
                    output_tokens=30, duration_s=0.2, max_requests=3,
                    drain_timeout_s=20.0)  # fmt: skip
    load = asyncio.create_task(run_load(spec))
    await asyncio.sleep(1.0)  # every stream is under way
    proc.send_signal(signal.SIGTERM)
    return await load


@pytest.mark.parametrize(("drain_s", "served"), [(30, 3), (0, 0)])
async def test_sigterm_drains_in_flight_streams(port: int, drain_s: int, served: int) -> None:
    proc = start(port, drain_s)
    try:
        report = await stream_through_sigterm(proc, port)
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
    assert report.sent == 3
    assert report.completed == served, report.error_samples
