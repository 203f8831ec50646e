"""Real models' config.json read as transformers and vLLM read them.

The configs (hf_configs/, as their Hub repositories publish them) are the ones a new user
tried. Each test names the reading that was wrong: Gemma's omitted
``tie_word_embeddings`` (tied) counted as an extra LM head, ``use_sliding_window:
false`` ignored, Gemma's local and global layers all windowed, DeepSeek's multi-head
latent attention and shared experts refused, and a window capping a whole batch's
context instead of each sequence's. Parameter counts are the model cards'.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rooftop_planner import batching, perf
from rooftop_planner.catalog import BYTES_PER_DTYPE, CatalogError, ModelSpec, load_catalog
from rooftop_planner.efficiency import load_efficiency
from rooftop_planner.hf_config import class_defaults, model_from_hf_config

CONFIGS = Path(__file__).parent / "hf_configs"


def config(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((CONFIGS / f"{name}.json").read_text())
    return loaded


def model(name: str) -> ModelSpec:
    return model_from_hf_config(CONFIGS / f"{name}.json")


def shape(m: ModelSpec, gpu: str, tp: int = 1) -> perf.EngineShape:
    found = load_catalog().gpu(gpu)
    return perf.EngineShape(m, found, tp, "bf16", "auto", load_efficiency().lookup(found))


@pytest.mark.parametrize(
    ("name", "billions", "active"),
    [
        ("gemma-2-9b", 9.24, 9.24),
        ("gemma-3-27b-it", 27.0, 27.0),
        ("deepseek-r1-distill-qwen-7b", 7.62, 7.62),
        ("mistral-7b-v0.1", 7.24, 7.24),
        ("qwen2-57b-a14b", 57.4, 14.2),
        ("deepseek-v3", 671.0, 37.0),
    ],
)
def test_parameter_counts_are_the_model_cards(name: str, billions: float, active: float) -> None:
    m = model(name)
    assert m.param_count / 1e9 == pytest.approx(billions, rel=0.01)
    assert m.active_param_count / 1e9 == pytest.approx(active, rel=0.02)


@pytest.mark.parametrize(("name", "billions"), [("gpt-oss-120b", 116.8), ("glm-4.5-air", 106.0)])
def test_total_parameters_are_the_model_cards(name: str, billions: float) -> None:
    """Their cards count active parameters without the embeddings, so only the total
    is held here."""
    assert model(name).param_count / 1e9 == pytest.approx(billions, rel=0.01)


def test_gpt_oss_windows_every_other_layer_and_glm_its_first_is_dense() -> None:
    gpt = model("gpt-oss-120b")
    assert (gpt.sliding_window, gpt.window_layers, gpt.num_experts) == (128, 18, 128)
    without_list = {k: v for k, v in config("gpt-oss-120b").items() if k != "layer_types"}
    assert model_from_hf_config(without_list).window_layers == 18  # GptOssConfig's rule
    glm = model("glm-4.5-air")
    assert (glm.dense_layers, glm.dense_intermediate_size, glm.shared_expert_size) == (
        1,
        10944,
        1408,
    )


def test_gemma_ties_its_embeddings_when_the_config_says_nothing() -> None:
    """Gemma2Config defaults tie_word_embeddings to true: no separate LM head, so
    Gemma-2-9B in 16 bits (18.5 GB) leaves an L4 room for its KV cache."""
    assert "tie_word_embeddings" not in config("gemma-2-9b")
    assert class_defaults("gemma2")["tie_word_embeddings"] is True
    on_l4 = shape(model("gemma-2-9b"), "l4")
    assert perf.kv_capacity_tokens(on_l4) > 1024
    prediction = batching.predict_continuous(on_l4, 8, 1024, 256)
    assert prediction.fits, prediction.reason


def test_a_switched_off_sliding_window_is_no_window() -> None:
    """Qwen2's configs keep ``sliding_window`` beside ``use_sliding_window: false``."""
    m = model("deepseek-r1-distill-qwen-7b")
    assert m.sliding_window is None
    assert perf.cached_tokens(m, 32_768) == 32_768
    assert model("qwen2-57b-a14b").sliding_window is None


def test_the_class_default_switches_qwen_windows_off() -> None:
    without = {k: v for k, v in config("deepseek-r1-distill-qwen-7b").items()}
    del without["use_sliding_window"]
    assert model_from_hf_config(without).sliding_window is None


@pytest.mark.parametrize(
    ("name", "window", "windowed"),
    [("gemma-2-9b", 4096, 21), ("gemma-3-27b-it", 1024, 52), ("mistral-7b-v0.1", 4096, 32)],
)
def test_only_local_layers_are_windowed(name: str, window: int, windowed: int) -> None:
    """Gemma 2 slides every other layer, Gemma 3 five in six, Mistral v0.1 all: a
    32k-token sequence keeps its whole context in the global layers."""
    m = model(name)
    assert (m.sliding_window, m.window_layers) == (window, windowed)
    full = m.num_layers - windowed
    expected = (full * 32_768 + windowed * window) / m.num_layers
    assert perf.cached_tokens(m, 32_768) == pytest.approx(expected)


def test_layer_types_decide_which_layers_slide() -> None:
    cfg = {
        **config("gemma-2-9b"),
        "layer_types": ["full_attention"] * 40 + ["sliding_attention"] * 2,
    }
    assert model_from_hf_config(cfg).window_layers == 2
    with pytest.raises(CatalogError, match=r"layer_types: linear_attention layers are not"):
        model_from_hf_config({**cfg, "layer_types": ["linear_attention"] * 42})
    with pytest.raises(CatalogError, match=r"layer_types: must list one attention type per"):
        model_from_hf_config({**cfg, "layer_types": ["full_attention"]})


def test_a_window_caps_each_sequence_not_the_batch() -> None:
    """A window longer than every sequence changes nothing: 32 sequences of 2,304
    tokens under a 4,096-token window read 32 × 2,304 tokens of KV per step."""
    windowed = model("mistral-7b-v0.1")
    unwindowed = dataclasses.replace(windowed, id="no-window", sliding_window=None)
    a = batching.predict_continuous(shape(windowed, "h100-sxm"), 32, 2048, 512)
    b = batching.predict_continuous(shape(unwindowed, "h100-sxm"), 32, 2048, 512)
    assert a.tpot_s == pytest.approx(b.tpot_s, rel=1e-9)


def test_deepseek_caches_one_latent_per_token_on_every_gpu() -> None:
    """MLA: 61 layers × (512 + 64) values × 2 bytes, whole on each of 8 GPUs."""
    m = model("deepseek-v3")
    assert m.is_mla and m.head_dim == 192
    per_token = 61 * (512 + 64) * BYTES_PER_DTYPE["auto"]
    assert perf.kv_bytes_per_token(m, "auto") == per_token
    assert perf.kv_bytes_per_token_per_gpu(m, "auto", 8) == per_token


def test_deepseek_experts_shared_and_dense_layers() -> None:
    m = model("deepseek-v3")
    assert (m.num_experts, m.experts_per_token, m.intermediate_size) == (256, 8, 2048)
    assert (m.shared_expert_size, m.dense_layers, m.dense_intermediate_size) == (2048, 3, 18432)
    assert m.moe_layers == 58
    qwen = model("qwen2-57b-a14b")
    assert (qwen.shared_expert_size, qwen.dense_layers) == (20480, 0)


def test_deepseek_plans_on_h200s() -> None:
    on_h200 = perf.EngineShape(
        model("deepseek-v3"), load_catalog().gpu("h200"), 8, "fp8", "auto",
        load_efficiency().lookup(load_catalog().gpu("h200")),
    )  # fmt: skip
    prediction = batching.predict_continuous(on_h200, 16, 1024, 256)
    assert prediction.fits, prediction.reason
    assert np.isfinite(prediction.tpot_s) and prediction.tpot_s > 0


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"qk_rope_head_dim": None}, r"qk_rope_head_dim: missing; multi-head latent"),
        ({"first_k_dense_replace": 61}, r"dense_layers: only a mixture-of-experts"),
    ],
)
def test_bad_deepseek_fields_are_named(changes: dict[str, Any], match: str) -> None:
    cfg = {**config("deepseek-v3"), **changes}
    with pytest.raises(CatalogError, match=match):
        model_from_hf_config(cfg)
