"""Bad catalog entries and bad modelConfig fields: one CatalogError that names the field.

Each case once crashed with a traceback (ValueError, TypeError, ZeroDivisionError,
OverflowError, KeyError, AttributeError) or was silently accepted.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from rooftop_api.spec import ServingTargetSpec
from rooftop_planner.catalog import CatalogError, load_catalog
from rooftop_planner.hf_config import model_from_hf_config, resolve_model

HF_CONFIG: dict[str, Any] = {
    "num_hidden_layers": 32,
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "intermediate_size": 14336,
    "vocab_size": 128256,
    "max_position_embeddings": 8192,
}


def user_catalog(tmp_path: Path, text: str) -> str:
    path = tmp_path / "catalog.yaml"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        # 1. numeric fields: type, zero, infinity (field path in the message)
        (
            "gpus:\n  l4:\n    dense_flops_per_s: {bf16: fast}\n",
            r"gpus\.l4\.dense_flops_per_s\.bf16",
        ),
        ("gpus:\n  l4:\n    gpus_per_node: eight\n", r"gpus\.l4\.gpus_per_node: must be a whole"),
        (
            "gpus:\n  l4:\n    dense_flops_per_s: {bf16: 1.0e+14, fp-8: 2.0e+14}\n",
            r"gpus\.l4\.dense_flops_per_s: unknown dtype\(s\) fp-8; use bf16",
        ),
        ("gpus:\n  l4:\n    gpus_per_node: 2.5\n", r"gpus\.l4\.gpus_per_node: must be a whole"),
        ("gpus:\n  l4:\n    link_group_gpus: 2\n", r"gpus\.l4\.beyond_group_bytes_per_s: missing"),
        ("gpus:\n  h100-nvl:\n    link_group_gpus: 0\n", r"gpus\.h100-nvl\.link_group_gpus"),
        ("gpus:\n  l4:\n    hbm_bytes: .inf\n", r"gpus\.l4\.hbm_bytes: .*infinity"),
        ("gpus:\n  l4:\n    hbm_bytes_per_s: .nan\n", r"gpus\.l4\.hbm_bytes_per_s: .*NaN"),
        ("models:\n  llama-3-8b:\n    num_kv_heads: 0\n", r"models\.llama-3-8b\.num_kv_heads"),
        ("models:\n  llama-3-8b:\n    num_kv_heads: '8'\n", r"num_kv_heads: .*remove the quotes"),
        ("models:\n  llama-3-8b:\n    head_dim: 0\n", r"models\.llama-3-8b\.head_dim"),
        # a GPU id names Kubernetes objects (a mixed fleet's pool Deployment)
        ("gpus:\n  My_GPU: {}\n", r"gpus\.my_gpu: a GPU id is lowercase .* 'my-gpu'"),
        # 2. prices: NaN, infinity, and bool (True would be $1)
        ("gpus:\n  l4:\n    usd_per_gpu_hour: .nan\n", r"gpus\.l4\.usd_per_gpu_hour: .*NaN"),
        ("gpus:\n  l4:\n    usd_per_gpu_hour: .inf\n", r"gpus\.l4\.usd_per_gpu_hour: .*infinity"),
        ("gpus:\n  l4:\n    usd_per_gpu_hour: true\n", r"gpus\.l4\.usd_per_gpu_hour: .*True"),
        # 3. impossible shapes
        ("models:\n  llama-3-8b:\n    max_context: -1\n", r"models\.llama-3-8b\.max_context"),
        ("models:\n  llama-3-8b:\n    num_layers: 1.5\n", r"models\.llama-3-8b\.num_layers"),
        ("models:\n  mixtral-8x7b:\n    num_experts: 0\n", r"models\.mixtral-8x7b\.num_experts"),
        (
            "models:\n  mixtral-8x7b:\n    experts_per_token: 9\n",
            r"models\.mixtral-8x7b\.experts_per_token: must be at most",
        ),
        (
            "gpus:\n  l4:\n    dense_flops_per_s: {bf16: 1.0e+14, fp8: -1}\n",
            r"gpus\.l4\.dense_flops_per_s\.fp8",
        ),
        (
            "models:\n  llama-3-8b:\n    num_kv_heads: 5\n",
            r"models\.llama-3-8b\.num_kv_heads: must divide models\.llama-3-8b\.num_heads",
        ),
    ],
)
def test_bad_catalog_numbers_name_the_field(tmp_path: Path, text: str, match: str) -> None:
    with pytest.raises(CatalogError, match=match):
        load_catalog(user_catalog(tmp_path, text))


@pytest.mark.parametrize(("written", "fixed"), [("8e10", "8.0e+10"), ("1.5E12", "1.5e+12")])
def test_yaml_exponent_without_dot_and_sign_gets_a_hint(
    tmp_path: Path, written: str, fixed: str
) -> None:
    text = f"gpus:\n  l4:\n    hbm_bytes: {written}\n"
    with pytest.raises(
        CatalogError, match=rf"gpus\.l4\.hbm_bytes: .*write it as {re.escape(fixed)}"
    ):
        load_catalog(user_catalog(tmp_path, text))


def test_whole_float_counts_and_zero_price_are_accepted(tmp_path: Path) -> None:
    text = "gpus:\n  l4:\n    gpus_per_node: 4.0\n    usd_per_gpu_hour: 0\n"
    gpu = load_catalog(user_catalog(tmp_path, text)).gpu("l4")
    assert (gpu.gpus_per_node, gpu.usd_per_gpu_hour) == (4, 0.0)
    assert isinstance(gpu.gpus_per_node, int)


def test_a_key_given_twice_is_refused_with_its_line(tmp_path: Path) -> None:
    """YAML would keep the last price silently; a catalog says it once."""
    text = "gpus:\n  l4:\n    usd_per_gpu_hour: 0.8\n    usd_per_gpu_hour: 0.5\n"
    with pytest.raises(CatalogError, match="line 4: duplicate key 'usd_per_gpu_hour'"):
        load_catalog(user_catalog(tmp_path, text))


def test_catalog_directory_is_not_reported_as_missing(tmp_path: Path) -> None:
    with pytest.raises(CatalogError, match="is a directory; give a YAML file"):
        load_catalog(str(tmp_path))


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        (
            {"tie_word_embeddings": True, "num_hidden_layers": None},
            r"modelConfig: missing config.json field\(s\) num_hidden_layers",
        ),
        ({"text_config": [1, 2]}, r"modelConfig\.text_config: must be a mapping"),
        ({"num_local_experts": "eight"}, r"modelConfig\.num_local_experts: must be a whole"),
        ({"num_key_value_heads": 0}, r"modelConfig\.num_key_value_heads: must be a whole"),
        ({"num_key_value_heads": -8}, r"modelConfig\.num_key_value_heads: must be a whole"),
        ({"sliding_window": "abc"}, r"modelConfig\.sliding_window: must be a whole"),
        ({"max_position_embeddings": -5}, r"modelConfig\.max_position_embeddings"),
        ({"num_key_value_heads": 5}, r"modelConfig\.num_key_value_heads: must divide"),
        ({"hidden_size": 4096.5}, r"modelConfig\.hidden_size: must be a whole"),
        ({"tie_word_embeddings": "yes"}, r"modelConfig\.tie_word_embeddings: must be true"),
        (
            {"num_local_experts": 8, "moe_intermediate_size": 0},
            r"modelConfig\.moe_intermediate_size: must be a whole",
        ),
        (
            {"text_config": {**HF_CONFIG, "num_attention_heads": "32"}},
            r"modelConfig\.text_config\.num_attention_heads: .*remove the quotes",
        ),
    ],
)
def test_bad_model_config_names_the_config_json_key(changes: dict[str, Any], match: str) -> None:
    config = {k: v for k, v in {**HF_CONFIG, **changes}.items() if v is not None}
    with pytest.raises(CatalogError, match=match):
        model_from_hf_config(config, name="acme/my-model")


def test_model_config_text_config_null_means_top_level() -> None:
    model = model_from_hf_config({**HF_CONFIG, "text_config": None}, name="acme/my-model")
    assert (model.num_layers, model.num_kv_heads, model.max_context) == (32, 8, 8192)


def test_model_config_file_errors_name_the_file(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"num_hidden_layers": 0}))
    with pytest.raises(CatalogError, match=r"config\.json: missing config\.json field\(s\)"):
        model_from_hf_config(path)
    path.write_text(json.dumps({**HF_CONFIG, "num_hidden_layers": 0}))
    with pytest.raises(CatalogError, match=r"config\.json: num_hidden_layers: must be a whole"):
        model_from_hf_config(path)


def test_tied_embeddings_estimate_still_works() -> None:
    tied = model_from_hf_config({**HF_CONFIG, "tie_word_embeddings": True})
    untied = model_from_hf_config(HF_CONFIG)
    saved = HF_CONFIG["vocab_size"] * HF_CONFIG["hidden_size"]
    assert untied.param_count - tied.param_count == pytest.approx(saved)


def target(model_config: dict[str, Any] | None) -> ServingTargetSpec:
    return ServingTargetSpec.model_validate(
        {
            "model": "acme/my-model",
            "modelConfig": model_config,
            "slo": {"tpotMs": 30},
            "workload": {
                "requestsPerSecond": 1,
                "promptTokens": {"mean": 100},
                "outputTokens": {"mean": 100},
            },
            "budget": {"usdPerHour": 10},
        }
    )


def test_empty_model_config_is_reported_as_incomplete_not_unknown_model() -> None:
    with pytest.raises(CatalogError, match=r"modelConfig: missing config\.json field\(s\)"):
        resolve_model(target({}), load_catalog())


def test_unknown_model_message_names_real_options() -> None:
    with pytest.raises(CatalogError, match="spec.modelConfig") as caught:
        resolve_model(target(None), load_catalog())
    message = str(caught.value)  # every option it names exists where it says
    assert "--catalog FILE.yaml for rooftop plan, predict and render" in message
    assert "rooftop predict --model-config config.json" in message
