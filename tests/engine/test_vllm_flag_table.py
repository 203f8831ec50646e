"""The tables written from the real vLLM are what the installed vLLM says: the `vllm
serve` flag table (extraArgs checks) and the Hugging Face config defaults its
transformers fills in (config.json import)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm

HERE = Path(__file__).resolve().parent
PLANNER = HERE.parents[1] / "planner"
TABLES = [
    ("dump_vllm_flags.py", PLANNER / "rooftop_api" / "vllm_flags.json", "vllm-flags"),
    ("dump_hf_defaults.py", PLANNER / "rooftop_planner/catalog/hf_defaults.json", "hf-defaults"),
]


@pytest.mark.parametrize(("script", "table", "target"), TABLES, ids=lambda v: str(v))
def test_the_packaged_table_is_current(
    vllm_python: str, script: str, table: Path, target: str
) -> None:
    done = subprocess.run(
        [vllm_python, str(HERE / script), "-"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout == table.read_text(), (
        f"{table.name} is stale for the installed vLLM: run `make {target}`"
    )
