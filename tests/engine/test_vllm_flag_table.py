"""The packaged `vllm serve` flag table is what the installed vLLM's parser says."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm

HERE = Path(__file__).resolve().parent
TABLE = HERE.parents[1] / "planner" / "rooftop_api" / "vllm_flags.json"


def test_the_packaged_flag_table_is_current(vllm_python: str) -> None:
    done = subprocess.run(
        [vllm_python, str(HERE / "dump_vllm_flags.py"), "-"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout == TABLE.read_text(), (
        f"{TABLE.name} is stale for the installed vLLM: run `make vllm-flags`"
    )
