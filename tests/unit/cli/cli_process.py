"""Run ``rooftop`` as a user does: a separate process, its exit code, stdout and stderr.

(A helper module, not a conftest: the test modules import from it by this unique name.)
"""

from __future__ import annotations

import os
import pty
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
Rooftop = Callable[..., subprocess.CompletedProcess[str]]


def rooftop_env(**extra: str) -> dict[str, str]:
    """This checkout's packages first on the path; no colour settings inherited."""
    paths = [str(ROOT / "planner"), str(ROOT / "operator"), str(ROOT)]
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR")}
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    return {**env, "PYTHONPATH": os.pathsep.join(paths), **extra}


def run_rooftop(
    *args: str, stdin: str | None = None, cwd: Path = ROOT, **env: str
) -> subprocess.CompletedProcess[str]:
    """The finished ``python -m rooftop_cli.main ARGS`` in ``cwd`` (``env``: extra
    variables)."""
    return subprocess.run(
        [sys.executable, "-m", "rooftop_cli.main", *args], input=stdin, text=True,
        capture_output=True, env=rooftop_env(**env), cwd=cwd, timeout=300,
    )  # fmt: skip


def on_a_terminal(*args: str, **env: str) -> str:
    """stdout of ``rooftop ARGS`` written to a pseudo-terminal (``COLUMNS`` 200 unless
    ``env`` says otherwise)."""
    main, replica = pty.openpty()
    command = [sys.executable, "-m", "rooftop_cli.main", *args]
    extra = {"TERM": "xterm-256color", "COLUMNS": "200", "PYTHONIOENCODING": "utf-8", **env}
    proc = subprocess.Popen(command, stdout=replica, stderr=subprocess.DEVNULL,
                            env=rooftop_env(**extra), cwd=ROOT)  # fmt: skip
    os.close(replica)
    chunks = []
    while True:
        try:
            chunk = os.read(main, 65536)
        except OSError:  # the terminal closed: the command is done
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(main)
    assert proc.wait(timeout=300) == 0
    return b"".join(chunks).decode()
