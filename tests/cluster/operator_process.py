"""The operator as a local subprocess, for end-to-end tests.

Why a subprocess and not the chart's Deployment: kwok pods run no containers. The process
authenticates with a ServiceAccount kubeconfig (``ClusterHandle.serviceaccount_kubeconfig``)
so every API call still goes through the chart's real RBAC.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from tests.cluster.controlplane import free_port
from tests.cluster.handle import wait_until

ROOT = Path(__file__).resolve().parents[2]


def _source_path() -> str:
    """PYTHONPATH running this checkout's operator and planner, as pytest's own
    ``pythonpath`` does: the venv's editable install may point at another checkout
    (a git worktree beside the main one), whose code the test would otherwise run."""
    ours = [str(ROOT / "operator"), str(ROOT / "planner")]
    return os.pathsep.join(ours + [p for p in [os.environ.get("PYTHONPATH", "")] if p])


@dataclass
class Operator:
    """`python -m rooftop_operator` as a subprocess with a ServiceAccount kubeconfig."""

    kubeconfig: Path
    namespace: str
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0
    verbose: bool = True  # --verbose: handler details in the log (benchmarks turn it off)

    def start(self, *args: str, **env: str) -> None:
        """Start and wait for kopf's liveness endpoint; ``args`` go to the command line,
        ``env`` into the environment (e.g. ROOFTOP_LOOP_* for the feedback loop)."""
        port = free_port()
        self.starts += 1
        # The marker is written (and flushed) before the process starts: left in this
        # file object's buffer, it would land among the new process's lines, and
        # log_since_start would miss the ones before it.
        with self.log_path.open("ab") as log:
            log.write(f"\n===== start {self.starts} =====\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "rooftop_operator", "--namespace", self.namespace,
                 "--liveness", f"http://127.0.0.1:{port}/healthz",
                 *(["--verbose"] if self.verbose else []), *args],
                cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                env=os.environ | {"KUBECONFIG": str(self.kubeconfig),
                                  "PYTHONPATH": _source_path(),
                                  "ROOFTOP_SELF_IMAGE": "rooftop:e2e", **env},
            )  # fmt: skip
        wait_until(lambda: self._healthy(port), 30, f"operator liveness\n{self.tail()}")

    def _healthy(self, port: int) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"operator exited {self.proc.returncode}\n{self.tail()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def tail(self, lines: int = 40) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def log_since_start(self) -> str:
        text = self.log_path.read_text(errors="replace")
        return text.rsplit(f"===== start {self.starts} =====", 1)[-1]
