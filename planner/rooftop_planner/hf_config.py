"""A Hugging Face ``config.json`` read as vLLM reads it: into a catalog ``ModelSpec``.

A config on the Hub leaves out every field its architecture's config class defaults, and
transformers (so vLLM) fills them in: Gemma's configs omit ``tie_word_embeddings``
(true), Gemma 3's text configs often omit ``vocab_size`` and ``sliding_window``. Those
defaults are data, per ``model_type`` (``catalog/hf_defaults.json``, written from
transformers by tests/engine/dump_hf_defaults.py); what the classes derive from them is
code here, each rule naming the class or vLLM model it follows:

- the sliding window: dropped where ``use_sliding_window`` is false (Qwen's classes);
  on the layers ``layer_types`` marks ``sliding_attention``, or where a config has no
  such list on every other layer (Gemma 2, gpt-oss), five in six (Gemma 3) or three in
  four (Command R7B), else on every layer (Mistral v0.1; vLLM's Qwen2 slides all or
  none);
- multi-head latent attention (DeepSeek-V2/V3/R1): the latent's widths;
- experts: the per-expert width ``moe_intermediate_size``, shared experts (DeepSeek's
  ``n_shared_experts``, Qwen2-MoE's ``shared_expert_intermediate_size``) and the dense
  layers beside the expert layers (DeepSeek's ``first_k_dense_replace`` and
  ``moe_layer_freq``; Qwen's ``mlp_only_layers`` and ``decoder_sparse_step``).

A ``model_type`` not in the table gets no defaults: a missing ``tie_word_embeddings``
then counts the LM head apart from the embeddings, the larger of the two readings.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from rooftop_api.spec import ServingTargetSpec
from rooftop_planner.catalog import (
    _MODEL_REQUIRED,
    Catalog,
    CatalogError,
    ModelSpec,
    _count,
    _model_from_entry,
)

_HF_FIELDS = {
    "num_hidden_layers": "num_layers",
    "hidden_size": "hidden_size",
    "num_attention_heads": "num_heads",
    "num_key_value_heads": "num_kv_heads",
    "head_dim": "head_dim",
    "intermediate_size": "intermediate_size",
    "vocab_size": "vocab_size",
    "max_position_embeddings": "max_context",
    "num_local_experts": "num_experts",
    "num_experts": "num_experts",
    "n_routed_experts": "num_experts",
    "num_experts_per_tok": "experts_per_token",
    "sliding_window": "sliding_window",
    "kv_lora_rank": "kv_lora_rank",
    "q_lora_rank": "q_lora_rank",
    "qk_nope_head_dim": "qk_nope_head_dim",
    "qk_rope_head_dim": "qk_rope_head_dim",
    "v_head_dim": "v_head_dim",
    "num_nextn_predict_layers": "mtp_layers",  # DeepSeek-V3, GLM-4.5, MiMo
    "mtp_num_hidden_layers": "mtp_layers",  # Qwen3-Next's spelling
}
# The shape itself is never defaulted: a config without it is a truncated copy.
_NEVER_DEFAULTED = ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size")
# Multimodal wrappers whose text_config may leave out its own model_type.
_TEXT_MODEL_TYPES = {"gemma3": "gemma3_text"}
# Sliding layers per global one where a config has no layer_types, and the class whose
# __post_init__ derives the pattern (its kwarg ``sliding_window_pattern`` overrides).
_SLIDING_PATTERNS = {
    "gemma2": 2,  # Gemma2Config: sliding where (i + 1) % 2 != 0
    "gemma3_text": 6,  # Gemma3TextConfig: sliding where (i + 1) % 6 != 0
    "cohere2": 4,  # Cohere2Config: sliding where (i + 1) % 4 != 0
    "gpt_oss": 2,  # GptOssConfig: sliding where (i + 1) % 2 != 0
}
_LAYER_TYPES = ("full_attention", "sliding_attention")


def model_from_hf_config(config: Mapping[str, Any] | str | Path, name: str = "") -> ModelSpec:
    """Build a ModelSpec from a Hugging Face config.json (a mapping or a file path).

    A mapping is the ServingTarget's ``spec.modelConfig``, so errors name its keys as
    ``modelConfig.<config.json key>``.
    """
    if isinstance(config, Mapping):
        where = "modelConfig"
    else:
        where = f"{config}:"
        config = _read_hf_file(Path(config))
    cfg, where = _language_model(config, where)
    model_type = _model_type(cfg, config)
    cfg = {**class_defaults(model_type), **cfg}
    entry, source = _hf_entry(cfg)

    def at(key: str) -> str:
        return _join(where, source.get(key, key))

    _require_shape(entry, where)
    _use_experts(cfg, entry, source, at)
    _use_attention_layers(cfg, model_type, entry, source, at)
    _use_mla(entry)
    tied = cfg.get("tie_word_embeddings")
    if tied is not None and not isinstance(tied, bool):
        raise CatalogError(
            f"{_join(where, 'tie_word_embeddings')}: must be true or false, got {tied!r}"
        )
    model_id = name or str(cfg.get("_name_or_path") or config.get("model_type") or "custom")
    return _model_from_entry(model_id.lower(), entry, at, tied_embeddings=bool(tied))


def resolve_model(spec: ServingTargetSpec, catalog: Catalog) -> ModelSpec:
    """The model ``spec`` serves: its modelConfig's shape, else the catalog's entry
    (CatalogError when neither reads)."""
    # An empty modelConfig is given-but-incomplete: say which config.json fields are missing
    # rather than fall back to the catalog and report an unknown model.
    if spec.model_config_json is not None:
        return model_from_hf_config(spec.model_config_json, name=spec.model)
    return catalog.model(spec.model)


@lru_cache(maxsize=1)
def _defaults_table() -> Mapping[str, Mapping[str, Any]]:
    text = resources.files("rooftop_planner").joinpath("catalog", "hf_defaults.json").read_text()
    table: Mapping[str, Mapping[str, Any]] = json.loads(text)["model_types"]
    return table


def class_defaults(model_type: str) -> dict[str, Any]:
    """What transformers' config class for ``model_type`` fills in for a missing key
    (none for a type the table lacks), the shape's own sizes left out."""
    found = _defaults_table().get(model_type, {})
    return {k: v for k, v in found.items() if k not in _NEVER_DEFAULTED}


def _model_type(cfg: Mapping[str, Any], outer: Mapping[str, Any]) -> str:
    """The language model's ``model_type`` (a wrapper's text model's where it has one)."""
    own = cfg.get("model_type")
    if isinstance(own, str):
        return own
    wrapper = outer.get("model_type")
    return _TEXT_MODEL_TYPES.get(wrapper, wrapper) if isinstance(wrapper, str) else ""


def _require_shape(entry: Mapping[str, Any], where: str) -> None:
    missing = [
        hf for hf, ours in _HF_FIELDS.items() if ours in _MODEL_REQUIRED and ours not in entry
    ]
    if missing:
        raise CatalogError(
            f"{where.rstrip(':')}: missing config.json field(s) {', '.join(missing)}; "
            "copy them from the model's config.json"
        )


def _use_experts(
    cfg: Mapping[str, Any], entry: dict[str, Any], source: dict[str, str], at: Callable[[str], str]
) -> None:
    """An MoE's per-expert MLP width is ``moe_intermediate_size`` where the config has
    it; shared experts and dense layers keep the widths they have (module docstring)."""
    if "num_experts" not in entry or _count(at("num_experts"), entry["num_experts"]) <= 1:
        return
    dense_width = entry["intermediate_size"]
    if cfg.get("moe_intermediate_size") is not None:
        entry["intermediate_size"] = cfg["moe_intermediate_size"]
        source["intermediate_size"] = "moe_intermediate_size"
    shared = _shared_expert_size(cfg, entry["intermediate_size"])
    if shared:
        entry["shared_expert_size"] = shared
    dense = _dense_layers(cfg, _count(at("num_layers"), entry["num_layers"]))
    if dense:
        entry["dense_layers"] = dense
        entry["dense_intermediate_size"] = dense_width
        source["dense_intermediate_size"] = "intermediate_size"


def _shared_expert_size(cfg: Mapping[str, Any], expert_width: int) -> int:
    """The MLP width every token runs beside its routed experts: DeepSeek's n_shared
    experts of the expert width, or Qwen2-MoE's one shared expert of its own width."""
    if cfg.get("shared_expert_intermediate_size"):
        return int(cfg["shared_expert_intermediate_size"])
    return int(cfg.get("n_shared_experts") or 0) * int(expert_width)


def _dense_layers(cfg: Mapping[str, Any], layers: int) -> int:
    """Layers with a dense MLP: DeepSeek's layer i is an expert layer when i ≥
    first_k_dense_replace and i % moe_layer_freq = 0; Qwen's when i is not in
    mlp_only_layers and (i + 1) % decoder_sparse_step = 0."""
    if "first_k_dense_replace" in cfg:
        first = int(cfg.get("first_k_dense_replace") or 0)
        every = int(cfg.get("moe_layer_freq") or 1)
        experts = sum(1 for i in range(layers) if i >= first and i % every == 0)
    else:
        only = set(cfg.get("mlp_only_layers") or ())
        step = int(cfg.get("decoder_sparse_step") or 1)
        experts = sum(1 for i in range(layers) if i not in only and (i + 1) % step == 0)
    return layers - experts


def _use_attention_layers(
    cfg: Mapping[str, Any],
    model_type: str,
    entry: dict[str, Any],
    source: dict[str, str],
    at: Callable[[str], str],
) -> None:
    """The window and the layers it applies to, as vLLM builds them (module docstring)."""
    if cfg.get("use_sliding_window") is False:
        entry.pop("sliding_window", None)
    if "sliding_window" not in entry:
        return
    layers = _count(at("num_layers"), entry["num_layers"])
    sliding = _sliding_layer_count(cfg, model_type, layers, at)
    if sliding is not None:
        entry["sliding_layers"] = sliding
        source["sliding_layers"] = "layer_types"


def _sliding_layer_count(
    cfg: Mapping[str, Any], model_type: str, layers: int, at: Callable[[str], str]
) -> int | None:
    """Layers with the window: from ``layer_types``, else the class's pattern, else
    None (all)."""
    types = cfg.get("layer_types")
    if types is not None:
        return _count_sliding(types, layers, at("layer_types"), at("num_layers"))
    pattern = cfg.get("sliding_window_pattern") or _SLIDING_PATTERNS.get(model_type)
    if pattern is None:
        return None
    pattern = _count(at("sliding_window_pattern"), pattern)
    return layers - layers // pattern


def _count_sliding(types: Any, layers: int, where: str, layers_at: str) -> int:
    if not isinstance(types, list) or len(types) != layers:
        raise CatalogError(
            f"{where}: must list one attention type per layer ({layers_at} = {layers})"
        )
    unknown = sorted({str(t) for t in types} - set(_LAYER_TYPES))
    if unknown:
        raise CatalogError(
            f"{where}: {', '.join(unknown)} layers are not modelled; Rooftop plans "
            f"{' and '.join(_LAYER_TYPES)} layers only"
        )
    return sum(1 for t in types if t == "sliding_attention")


def _use_mla(entry: dict[str, Any]) -> None:
    """MLA's query-key head is nope + rope wide; configs leave ``head_dim`` out (their
    class sets it to the rotary part, which no projection is)."""
    if entry.get("kv_lora_rank") and "head_dim" not in entry:
        entry["head_dim"] = entry.get("qk_nope_head_dim", 0) + entry.get("qk_rope_head_dim", 0)


def _read_hf_file(path: Path) -> Mapping[str, Any]:
    try:
        config = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CatalogError(f"config.json {path}: cannot read it as JSON ({err})") from err
    if not isinstance(config, Mapping):
        raise CatalogError(f"config.json {path}: expected a JSON object")
    return config


def _language_model(config: Mapping[str, Any], where: str) -> tuple[Mapping[str, Any], str]:
    """Multimodal wrappers keep the language model under ``text_config`` (null: none)."""
    text_config = config.get("text_config")
    if text_config is None:
        return config, where
    if not isinstance(text_config, Mapping):
        raise CatalogError(
            f"{_join(where, 'text_config')}: must be a mapping of the language model's config.json "
            f"fields, got {text_config!r}"
        )
    return text_config, _join(where, "text_config")


def _join(where: str, key: str) -> str:
    """``modelConfig.key``, or ``path/config.json: key`` for a file."""
    return f"{where} {key}" if where.endswith(":") else f"{where}.{key}"


def _hf_entry(cfg: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """Catalog fields from config.json keys, and which key each came from (for messages)."""
    entry: dict[str, Any] = {}
    source: dict[str, str] = {}
    for hf_key, our_key in _HF_FIELDS.items():
        if cfg.get(hf_key) is not None:
            entry[our_key] = cfg[hf_key]
            source[our_key] = hf_key
    return entry, source
