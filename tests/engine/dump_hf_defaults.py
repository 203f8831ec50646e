"""Write Hugging Face's per-architecture config defaults (planner/rooftop_planner/catalog/
hf_defaults.json).

Run with the real vLLM's python, whose transformers is the one vLLM reads configs with
(`make hf-defaults`):

    PY=$(tests/engine/install-vllm.sh) && $PY tests/engine/dump_hf_defaults.py [OUTPUT]

Why a table: a config.json on the Hub omits every field its architecture's config class
defaults, and transformers (so vLLM) fills them in. Gemma's configs leave out
``tie_word_embeddings`` (true for Gemma), Gemma 3's text configs often leave out
``vocab_size`` and ``sliding_window``. The planner has no transformers, so this script
records, per ``model_type`` the planner knows how to price, the class defaults of the
config.json keys ``rooftop_planner.catalog.model_from_hf_config`` reads. A None default
is left out (the key then stays missing, as it would in transformers). The per-layer
attention patterns the classes derive in ``__post_init__`` (Gemma 2 alternating, Gemma 3
five sliding layers in six, Qwen's ``max_window_layers``) are code in the importer, each
with the class it follows. ``-`` as OUTPUT writes to stdout (the staleness test compares
that with the packaged file).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

DEFAULT_OUTPUT = (
    Path(__file__).resolve().parents[2] / "planner/rooftop_planner/catalog/hf_defaults.json"
)
GENERATED_BY = (
    "tests/engine/dump_hf_defaults.py (make hf-defaults) from the config classes of the "
    "transformers the real vLLM installs (Apache-2.0); do not edit by hand"
)
MODEL_TYPES = (
    "cohere2",
    "deepseek_v2",
    "deepseek_v3",
    "gemma",
    "gemma2",
    "gemma3_text",
    "glm4_moe",
    "gpt_oss",
    "llama",
    "mistral",
    "mixtral",
    "phi3",
    "qwen2",
    "qwen2_moe",
    "qwen3",
    "qwen3_moe",
)
# Every config.json key the importer reads (rooftop_planner.catalog's _HF_FIELDS and
# the keys of its sliding-window, MLA and expert rules).
KEYS = (
    "decoder_sparse_step",
    "first_k_dense_replace",
    "head_dim",
    "hidden_size",
    "intermediate_size",
    "kv_lora_rank",
    "max_position_embeddings",
    "max_window_layers",
    "mlp_only_layers",
    "moe_intermediate_size",
    "moe_layer_freq",
    "n_routed_experts",
    "n_shared_experts",
    "num_attention_heads",
    "num_experts",
    "num_experts_per_tok",
    "num_hidden_layers",
    "num_key_value_heads",
    "num_local_experts",
    "q_lora_rank",
    "qk_nope_head_dim",
    "qk_rope_head_dim",
    "shared_expert_intermediate_size",
    "sliding_window",
    "tie_word_embeddings",
    "use_sliding_window",
    "v_head_dim",
    "vocab_size",
)


def defaults(model_type: str) -> dict[str, Any]:
    """The class defaults of ``KEYS`` for one model_type (None defaults left out)."""
    from transformers import CONFIG_MAPPING

    cls = CONFIG_MAPPING[model_type]
    found = {f.name: f.default for f in dataclasses.fields(cls)}
    return {k: found[k] for k in KEYS if found.get(k) is not None}


def render() -> str:
    import transformers

    table = {
        "generated_by": GENERATED_BY,
        "transformers": transformers.__version__,
        "model_types": {t: defaults(t) for t in MODEL_TYPES},
    }
    return json.dumps(table, indent=1, sort_keys=True) + "\n"


def main(argv: list[str]) -> int:
    output = argv[1] if len(argv) > 1 else str(DEFAULT_OUTPUT)
    text = render()
    if output == "-":
        sys.stdout.write(text)
    else:
        Path(output).write_text(text)
        print(output, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
