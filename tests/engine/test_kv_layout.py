"""The planner reads a config.json's KV cache as vLLM does: bytes per token on one GPU,
the sliding window and the layers it covers, and tied embeddings.

For the published configs the planner's tests hold (tests/unit/planner/hf_configs:
DeepSeek-V3's latent attention, Gemma 2/3's local and global layers, Qwen2's switched-off
window, Mistral's window on every layer), vLLM's own ModelConfig is asked through
tests/engine/kv_layout.py at tensor parallelism 1 and 4.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from rooftop_planner import perf
from rooftop_planner.catalog import estimate_param_count
from rooftop_planner.hf_config import model_from_hf_config

pytestmark = pytest.mark.vllm

HERE = Path(__file__).resolve().parent
CONFIGS = HERE.parents[0] / "unit" / "planner" / "hf_configs"
TPS = (1, 4)


@pytest.fixture(scope="module")
def vllm_layouts(vllm_python: str) -> dict[str, dict[str, Any]]:
    cases = [
        {"id": f"{path.stem}@{tp}", "tp": tp, "config": json.loads(path.read_text())}
        for path in sorted(CONFIGS.glob("*.json"))
        for tp in TPS
    ]
    done = subprocess.run(
        [vllm_python, str(HERE / "kv_layout.py")],
        input=json.dumps(cases), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return {r["id"]: r for r in json.loads(done.stdout)}


@pytest.mark.parametrize("tp", TPS)
@pytest.mark.parametrize("name", sorted(p.stem for p in CONFIGS.glob("*.json")))
def test_kv_cache_per_token_is_vllms(
    vllm_layouts: dict[str, dict[str, Any]], name: str, tp: int
) -> None:
    vllm = vllm_layouts[f"{name}@{tp}"]
    model = model_from_hf_config(CONFIGS / f"{name}.json")
    assert perf.kv_bytes_per_token_per_gpu(model, "auto", tp) == vllm["kv_bytes_per_token"]
    assert model.is_mla == vllm["mla"]
    assert (model.sliding_window, model.window_layers) == (
        vllm["sliding_window"],
        vllm["window_layers"],
    )


@pytest.mark.parametrize("name", sorted(p.stem for p in CONFIGS.glob("*.json")))
def test_embeddings_are_tied_where_vllm_ties_them(
    vllm_layouts: dict[str, dict[str, Any]], name: str
) -> None:
    """The parameter count is the estimate at vLLM's reading of tie_word_embeddings (a
    wrong reading is vocab · hidden off: 0.9 B for Gemma-2-9B)."""
    model = model_from_hf_config(CONFIGS / f"{name}.json")
    tied = vllm_layouts[f"{name}@1"]["tie_word_embeddings"]
    fields = {**dataclasses.asdict(model), "tie_word_embeddings": tied}
    assert model.param_count == estimate_param_count(fields)
