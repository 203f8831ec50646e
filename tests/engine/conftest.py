"""Fixtures for the tests against the real vLLM CPU build (marker ``vllm``).

The build lives outside the repository (tests/engine/install-vllm.sh puts it in a venv
under ROOFTOP_CACHE, ~4 GB, and prints its python; cached after the first run). Each test
module starts that python once: importing vLLM takes ~15 s.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent

Result = dict[str, Any]
RunCases = Callable[[Sequence[dict[str, Any]]], dict[str, Result]]


@pytest.fixture(scope="session")
def vllm_python() -> str:
    """The vLLM venv's python (installed on first use; ROOFTOP_VLLM_PYTHON overrides)."""
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
