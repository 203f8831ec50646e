"""``rooftop`` as a pipeline member: a reader that leaves early, and Ctrl-C.

``rooftop plan X --explain | head -1`` must end quietly with 141 (128 + SIGPIPE), as
other Unix tools do under a shell, and Ctrl-C with 130 (128 + SIGINT), without a
message or a traceback. The commands run as a user runs them: a subprocess.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "chat-llama-3.1-8b.yaml"
TRACE = "TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
    f"{i * 2},{100 + i},{20 + i % 7}\n" for i in range(60)
)


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "rooftop_cli.main", *args]


def env() -> dict[str, str]:
    """This checkout's packages first (the venv may install another checkout's)."""
    ours = os.pathsep.join([str(ROOT / "planner"), str(ROOT / "operator")])
    return os.environ | {"PYTHONPATH": ours}


def reader_leaves_early(command: list[str]) -> tuple[int, str]:
    """Run ``command`` with stdout into a pipe whose reader is gone before the command
    writes (a ``| head`` that already has what it wanted); its exit code and stderr.
    Closing before reading makes the broken pipe certain: a reader that first took a
    few bytes could leave after everything fitted in the pipe's buffer."""
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=env(), cwd=ROOT)  # fmt: skip
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    err = proc.stderr.read().decode()
    return proc.wait(timeout=120), err


@pytest.mark.parametrize("extra", [["--explain"], ["--json"], []], ids=["explain", "json", "text"])
def test_plan_into_a_closed_pipe_exits_141_quietly(extra: list[str]) -> None:
    code, err = reader_leaves_early(cli("plan", str(EXAMPLE), *extra))
    assert (code, err) == (141, "")


def test_predict_csv_into_a_closed_pipe_exits_141_quietly(tmp_path: Path) -> None:
    rows = "".join(f"llama-3.1-8b,h100,1,bf16,auto,{isl},128,8,\n" for isl in range(64, 4096, 16))
    path = tmp_path / "in.csv"
    path.write_text("model,gpu,tp,weight_dtype,kv_dtype,isl,osl,concurrency,batch\n" + rows)
    code, err = reader_leaves_early(cli("predict", "--csv", str(path)))
    assert code == 141
    assert "Traceback" not in err and "Broken pipe" not in err


def test_simulate_json_into_a_closed_pipe_exits_141_quietly(tmp_path: Path) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_text(TRACE)
    command = cli("simulate", str(EXAMPLE), "--trace", str(trace), "--policy", "static-peak",
                  "--json")  # fmt: skip
    code, err = reader_leaves_early(command)
    assert (code, err) == (141, "")


def test_ctrl_c_exits_130_without_a_traceback(tmp_path: Path) -> None:
    """Interrupted while it waits for its input: a FIFO nobody writes yet."""
    fifo = tmp_path / "target.yaml"
    os.mkfifo(fifo)
    proc = subprocess.Popen(cli("plan", str(fifo)), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env(), cwd=ROOT)  # fmt: skip
    writer = _open_when_read(fifo, proc)
    try:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        os.close(writer)
    assert (proc.returncode, out, err) == (130, b"", b"")


def _open_when_read(fifo: Path, proc: subprocess.Popen[bytes]) -> int:
    """The FIFO's write end, once ``proc`` has opened it to read: inside the command,
    past start-up, blocked on its input."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        try:
            return os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as err:
            if err.errno != errno.ENXIO:  # ENXIO: no reader yet
                raise
        time.sleep(0.05)
    raise AssertionError("the command never opened its input")
