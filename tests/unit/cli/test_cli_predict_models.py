"""``rooftop predict`` for a model outside the catalog: ``--model-config config.json`` (a
Hugging Face config) or ``--catalog FILE.yaml``, and an unknown model's message naming
both."""

from __future__ import annotations

import json
from pathlib import Path

from cli_process import Rooftop

CONFIG = {
    "num_hidden_layers": 24,
    "hidden_size": 2048,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "intermediate_size": 5632,
    "vocab_size": 32000,
    "max_position_embeddings": 8192,
    "_name_or_path": "acme/tiny-2b",
}
SCENARIO = ("--gpu", "l40s", "--concurrency", "8", "-o", "json")


def test_a_hugging_face_config_json_describes_the_model(rooftop: Rooftop, tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps(CONFIG))
    done = rooftop("predict", "--model-config", str(config), *SCENARIO)
    assert done.returncode == 0, done.stderr
    tiny = json.loads(done.stdout)
    assert isinstance(tiny["tpot_ms"], float) and tiny["fits"] is True
    wider = tmp_path / "wider.json"
    wider.write_text(json.dumps({**CONFIG, "num_hidden_layers": 48}))
    twice = json.loads(rooftop("predict", "--model-config", str(wider), *SCENARIO).stdout)
    assert twice["tpot_ms"] > tiny["tpot_ms"]  # the config's own shape is what is timed
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps({"hidden_size": 10}))
    bad = rooftop("predict", "--model-config", str(broken), *SCENARIO)
    assert bad.returncode == 2 and "num_hidden_layers" in bad.stderr


def test_a_catalog_file_adds_a_model(rooftop: Rooftop, tmp_path: Path) -> None:
    catalog = tmp_path / "mine.yaml"
    catalog.write_text(
        "models:\n  acme-2b:\n    hf_repo: acme/tiny-2b\n    num_layers: 24\n"
        "    hidden_size: 2048\n    num_heads: 16\n    num_kv_heads: 4\n    head_dim: 128\n"
        "    intermediate_size: 5632\n    vocab_size: 32000\n    max_context: 8192\n"
    )
    done = rooftop("predict", "--catalog", str(catalog), "--model", "acme-2b", *SCENARIO)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["tpot_ms"] > 0


def test_an_unknown_model_names_the_flags_that_describe_one(rooftop: Rooftop) -> None:
    done = rooftop("predict", "--model", "gpt-9", *SCENARIO)
    assert done.returncode == 2
    assert "unknown model 'gpt-9'" in done.stderr
    assert "--model-config config.json" in done.stderr
    assert "--catalog FILE.yaml for rooftop plan, predict and render" in done.stderr
