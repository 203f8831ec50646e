"""``rooftop simulate`` as a user runs it: progress on a terminal only, the comparison of
``--policy all``, and no ``None`` in its text."""

from __future__ import annotations

import io
import os
import pty
import subprocess
import sys
from pathlib import Path

import yaml

from rooftop_planner.progress import ERASE_LINE, Progress
from rooftop_sim import simulate

ROOT = Path(__file__).resolve().parents[3]
TARGET = {
    "apiVersion": "rooftop.dev/v1alpha1",
    "kind": "ServingTarget",
    "metadata": {"name": "tiny"},
    "spec": {
        "model": "llama-3.1-70b",
        "slo": {"tpotMs": 150, "ttftMs": 2000},
        "workload": {
            "requestsPerSecond": 0.5,
            "promptTokens": {"mean": 400, "p90": 800},
            "outputTokens": {"mean": 40, "p90": 80},
        },
        "budget": {"usdPerHour": 20},
        "constraints": {"gpuTypes": ["l4"], "maxReplicas": 8},
    },
}


def files(tmp_path: Path, output_tokens: int | None = None) -> tuple[Path, Path]:
    """The target and a 4-minute trace (0.5 req/s); ``output_tokens``: every answer's."""
    target = tmp_path / "target.yaml"
    target.write_text(yaml.safe_dump(TARGET))
    trace = tmp_path / "trace.csv"
    rows = [f"{i * 2},{300 + 7 * i % 400},{output_tokens or 20 + i % 40}" for i in range(120)]
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(rows) + "\n")
    return target, trace


def simulate_cmd(target: Path, trace: Path, *flags: str) -> list[str]:
    return [sys.executable, "-m", "rooftop_cli.main", "simulate", str(target), "--trace",
            str(trace), *flags]  # fmt: skip


def env() -> dict[str, str]:
    ours = os.pathsep.join([str(ROOT / "planner"), str(ROOT / "operator")])
    return os.environ | {"PYTHONPATH": ours, "COLUMNS": "200"}


def test_a_terminal_sees_which_policy_runs_then_a_clean_line(tmp_path: Path) -> None:
    target, trace = files(tmp_path)
    master, slave = pty.openpty()  # stderr a terminal, as in an interactive shell
    with (tmp_path / "out.txt").open("wb") as out:
        proc = subprocess.Popen(simulate_cmd(target, trace, "--policy", "static-peak"),
                                stdout=out, stderr=slave, env=env(), cwd=ROOT)  # fmt: skip
        os.close(slave)
        shown = _read_all(master)
        assert proc.wait(timeout=120) == 0, shown
    assert "rooftop simulate: static-peak (1/1): sizing the policy" in shown
    assert shown.endswith(ERASE_LINE)  # the status line is gone before the report
    assert "policy static-peak" in (tmp_path / "out.txt").read_text()


def _read_all(fd: int) -> str:
    """Everything written to a pseudo-terminal until its last writer closes it."""
    chunks = []
    while True:
        try:
            data = os.read(fd, 4096)
        except OSError:  # EIO: the other side is closed
            break
        if not data:
            break
        chunks.append(data)
    os.close(fd)
    return b"".join(chunks).decode()


def test_stderr_stays_empty_when_not_a_terminal(tmp_path: Path) -> None:
    target, trace = files(tmp_path)
    command = simulate_cmd(target, trace, "--policy", "static-peak")
    proc = subprocess.run(command, capture_output=True, text=True, env=env(), cwd=ROOT,
                          timeout=120)  # fmt: skip
    assert (proc.returncode, proc.stderr) == (0, "")
    assert "policy static-peak" in proc.stdout


def test_the_ticker_reports_simulated_minutes() -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    stream = Terminal()
    tick = simulate._ticker(Progress(stream, min_interval_s=0.0), "rooftop simulate: x", 1200.0)
    tick(600.0)
    assert stream.getvalue() == f"{ERASE_LINE}rooftop simulate: x: 10.0 of 20.0 min simulated"


def test_policy_all_ends_with_a_comparison_and_prints_no_none(tmp_path: Path) -> None:
    """One-token answers have no TPOT: the percentiles say n/a and why, not None."""
    target, trace = files(tmp_path, output_tokens=1)
    plot = tmp_path / "all.png"
    command = simulate_cmd(target, trace, "--policy", "all", "--plot", str(plot))
    proc = subprocess.run(command, capture_output=True, text=True, env=env(), cwd=ROOT,
                          timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "None" not in proc.stdout
    assert "TPOT percentiles n/a: no request finished with two or more output tokens" in proc.stdout
    table = proc.stdout[proc.stdout.index("comparison (") :].splitlines()
    assert table[1].split() == ["policy", "TPOT", "met", "TTFT", "met", "$/h", "mean", "x",
                                "oracle", "replica-h", "GPU-h", "rejected"]  # fmt: skip
    assert [row.split()[0] for row in table[2:]] == list(simulate.POLICIES)
    oracle = next(row for row in table if row.startswith("oracle "))
    assert oracle.split()[4] == "1.00"  # cost against itself
    assert plot.read_bytes()[:4] == b"\x89PNG"
