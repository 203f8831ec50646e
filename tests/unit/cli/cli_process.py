"""Run ``rooftop`` as a user does: a separate process, its exit code, stdout and stderr.

(A helper module, not a conftest: the test modules import from it by this unique name.)
"""

from __future__ import annotations

import os
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
