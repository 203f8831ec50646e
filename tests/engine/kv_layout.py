"""What vLLM caches per token for a config.json, read from vLLM's own ModelConfig.

Run with the vLLM venv's python (tests/engine/install-vllm.sh). Reads a JSON list of
cases ``{"id": ..., "config": {...}, "tp": N}`` on stdin and prints one JSON list of
results on stdout (vLLM's logging goes to stderr)::

    {"id": ..., "layers": L, "head_size": d, "kv_heads": h, "mla": bool,
     "kv_bytes_per_token": B, "sliding_window": W | None, "window_layers": w,
     "tie_word_embeddings": bool}

``kv_bytes_per_token`` is one GPU's 16-bit cache per token over all layers as vLLM's
attention layers size it (``vllm/v1/kv_cache_interface.py``: a full or sliding layer's
page holds 2 · kv_heads · head_size values per token, an MLA layer's one latent of
head_size). ``window_layers`` counts the layers vLLM gives the window: those
``layer_types`` marks ``sliding_attention`` (Gemma 2/3 build theirs from it), else every
layer where the config keeps a window (the model-level window of Mistral and Qwen2).
Only config.json is read: no weights, no device.
"""

from __future__ import annotations

import contextlib
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

KV_BYTES = 2  # the 16-bit cache ("auto" for a bf16 model)


def layout(config: dict[str, Any], tp: int) -> dict[str, Any]:
    from vllm.config import ParallelConfig
    from vllm.engine.arg_utils import EngineArgs

    with tempfile.TemporaryDirectory(prefix="rooftop-kv-") as model_dir:
        (Path(model_dir) / "config.json").write_text(json.dumps(config))
        args = EngineArgs(model=model_dir, tensor_parallel_size=tp, skip_tokenizer_init=True)
        model = args.create_model_config()
    parallel = ParallelConfig(tensor_parallel_size=tp)
    layers = model.get_num_layers(parallel)
    head, kv_heads = model.get_head_size(), model.get_num_kv_heads(parallel)
    per_layer = head if model.use_mla else 2 * kv_heads * head
    text = model.hf_text_config
    window = model.get_sliding_window()
    types = getattr(text, "layer_types", None)
    if window is None:
        windowed = 0
    elif types:
        windowed = sum(1 for t in types if t == "sliding_attention")
    else:
        windowed = layers
    return {
        "layers": layers,
        "head_size": head,
        "kv_heads": kv_heads,
        "mla": bool(model.use_mla),
        "kv_bytes_per_token": layers * per_layer * KV_BYTES,
        "sliding_window": window,
        "window_layers": windowed,
        "tie_word_embeddings": bool(getattr(text, "tie_word_embeddings", False)),
    }


def main() -> int:
    cases = json.load(sys.stdin)
    results = []
    for case in cases:
        with contextlib.redirect_stdout(sys.stderr):
            results.append({"id": case["id"], **layout(case["config"], case["tp"])})
    json.dump(results, sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
