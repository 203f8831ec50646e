"""Exit codes: 0 ok, 1 infeasible, 2 bad input, 130 interrupted, 141 a closed pipe; each
command's ``--help`` and the CLI reference list them."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_process import ROOT, Rooftop, rooftop_env


def test_the_top_help_names_the_exit_codes(rooftop: Rooftop) -> None:
    done = rooftop("--help")
    assert done.returncode == 0
    assert "exit codes: 0 ok, 1 no feasible plan (plan, render), 2 bad input" in done.stdout


@pytest.mark.parametrize(
    ("command", "lines"),
    [
        ("plan", ("  0  every target has a plan", "  1  some target has no feasible plan",
                  "  2  bad input", "130  interrupted (Ctrl-C)", "the worst of theirs")),
        ("predict", ("  0  predicted", "  2  bad input", "130  interrupted")),
        ("render", ("  1  some target has no feasible plan", "the worst of theirs")),
        ("simulate", ("  2  bad input: target, trace or flags",)),
    ],
)  # fmt: skip
def test_each_command_help_lists_its_exit_codes(
    rooftop: Rooftop, command: str, lines: tuple[str, ...]
) -> None:
    done = rooftop(command, "--help")
    assert done.returncode == 0 and "exit codes:\n" in done.stdout
    for line in lines:
        assert line in done.stdout


def _reading_stdin(pid: int) -> bool:
    """Whether the process is blocked in read(0, ...) (Linux /proc), None-safe."""
    try:
        return Path(f"/proc/{pid}/syscall").read_text().startswith("0 0x0 ")
    except OSError:
        return False


def test_ctrl_c_exits_130_without_a_traceback() -> None:
    """Interrupted while it waits on standard input: 130, the shell's code for SIGINT."""
    command = [sys.executable, "-m", "rooftop_cli.main", "plan", "-"]
    pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
    proc = subprocess.Popen(command, env=rooftop_env(), cwd=ROOT, text=True, **pipes)
    deadline = time.monotonic() + 120
    while not _reading_stdin(proc.pid) and time.monotonic() < deadline:
        if not Path(f"/proc/{proc.pid}/syscall").exists():
            time.sleep(15)  # no /proc: give it time to reach the read
            break
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "Traceback" not in err
