"""The drafter catalog: published drafters per model, and the acceptance arithmetic.

Data, like the model catalog (``catalog/drafters.yaml``): which EAGLE-3 head or draft
model can draft for a catalog model, where it is published, under which licence, and
the acceptance figure its publisher or a third party measured. The planner prices
speculation from it (``speculative``); the simulated engine builds its drafter from the
same shapes and times it with its own kernel tables.

A step verifying K draft tokens with per-token acceptance a (each draft token accepted
given the ones before it were) yields E(a, K) = (1 − a^(K+1)) / (1 − a) tokens per
sequence (Leviathan et al., "Fast Inference from Transformers via Speculative
Decoding", 2023).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import lru_cache
from importlib import resources
from typing import Any

import yaml

from rooftop_api.spec import ServingTargetSpec
from rooftop_planner.catalog import (
    Catalog,
    CatalogError,
    ModelSpec,
    estimate_param_count,
    load_catalog,
)
from rooftop_planner.hf_config import resolve_model

METHODS = ("eagle3", "draft_model")
# vLLM's prompt lookup: it drafts the tokens that followed the last earlier occurrence of
# the sequence's latest n-gram (prompt or output), on the host, with no model to load,
# so every model can use it and the drafter catalog does not list it.
NGRAM = "ngram"
# Suffix decoding (Arctic Inference's suffix trees, arXiv:2411.04975): drafts what
# followed the sequence's latest tokens in its prompt and in earlier answers, on the
# host, with no model either. vLLM's proposer takes one draft length for every batch
# (its ``propose`` asserts it), so a plan gives it a fixed K, not a schedule.
SUFFIX = "suffix"
# The methods that draft on the host: no drafter weights or KV, host time per step
# (``host_time``), an acceptance that is the traffic's.
HOST_METHODS = (NGRAM, SUFFIX)
# The model's own multi-token-prediction layers (DeepSeek-V3's), in its checkpoint: no
# drafter to name either, and only for a model that has them.
MTP = "mtp"
# Where a model of DeepSeek-V3's architecture (MLA with MTP layers) drafts with its own
# MTP layer: the second token is accepted 85-90 % of the time (the lower end taken).
MTP_ACCEPTANCE = 0.85
MTP_ACCEPTANCE_SOURCE = (
    "DeepSeek-V3 Technical Report (arXiv:2412.19437), section 5.4.3: the second token's "
    "prediction accepted 85-90 % of the time across generation topics"
)


@dataclass(frozen=True)
class Drafter:
    """A published drafter for one catalog model (``catalog/drafters.yaml``).

    Attributes:
        method: eagle3 or draft_model (vLLM's speculative ``method``).
        repo: what vLLM loads (``--speculative-config`` "model").
        source, licence: where it is published and the licence its card states.
        layers, draft_vocab: an EAGLE-3 head's decoder layers and vocabulary (0: the
            model's).
        model: a draft model's catalog id (its shape).
        acceptance: the per-token acceptance solved from the published acceptance
            length (None: nothing published for the pair).
        acceptance_source: the figure's source.
    """

    method: str
    repo: str
    source: str = ""
    licence: str = ""
    layers: int = 1
    draft_vocab: int = 0
    model: str = ""
    acceptance: float | None = None
    acceptance_source: str = ""


NGRAM_DRAFTER = Drafter(
    method=NGRAM,
    repo="ngram",
    source="vLLM's n-gram prompt-lookup proposer (vllm/v1/spec_decode/ngram_proposer.py)",
    licence="Apache-2.0 (vLLM)",
)
SUFFIX_DRAFTER = Drafter(
    method=SUFFIX,
    repo="suffix",
    source=(
        "vLLM's suffix-decoding proposer (vllm/v1/spec_decode/suffix_decoding.py) over "
        "Arctic Inference's suffix trees (arctic_inference.suffix_decoding)"
    ),
    licence="Apache-2.0 (vLLM, Arctic Inference)",
)
HOST_DRAFTERS = {NGRAM: NGRAM_DRAFTER, SUFFIX: SUFFIX_DRAFTER}


def mtp_drafter(model: ModelSpec) -> Drafter | None:
    """The model's multi-token-prediction layers as its drafter (None: it has none);
    the published acceptance where the model has DeepSeek-V3's architecture."""
    if model.mtp_layers < 1:
        return None
    published = model.is_mla
    return Drafter(
        method=MTP,
        repo=model.hf_repo or model.id,
        source="the model's own checkpoint (its multi-token-prediction layers)",
        licence="the model's",
        layers=model.mtp_layers,
        acceptance=MTP_ACCEPTANCE if published else None,
        acceptance_source=MTP_ACCEPTANCE_SOURCE if published else "",
    )


def tokens_per_step(acceptance: float, draft_tokens: float) -> float:
    """E(a, K) = (1 − a^(K+1)) / (1 − a): tokens a sequence advances per verified step."""
    if draft_tokens <= 0:
        return 1.0
    return float((1.0 - acceptance ** (draft_tokens + 1)) / (1.0 - acceptance))


def acceptance_from_length(length: float, draft_tokens: float) -> float:
    """The per-token acceptance a with E(a, K) = ``length`` (bisection; E rises with a)."""
    if not 1.0 <= length <= draft_tokens + 1:
        raise ValueError(f"acceptance length {length} outside [1, {draft_tokens + 1}]")
    low, high = 0.0, 0.999999
    for _ in range(60):
        mid = (low + high) / 2.0
        low, high = (mid, high) if tokens_per_step(mid, draft_tokens) < length else (low, mid)
    return round((low + high) / 2.0, 4)


# ---------------------------------------------------------------- the drafter catalog

_DRAFTER_FIELDS = {
    "eagle3": {"repo", "source", "licence", "layers", "draft_vocab"},
    "draft_model": {"repo", "source", "licence", "model"},
}
_ACCEPTANCE_FIELDS = {"acceptance_length", "acceptance_k", "acceptance_source"}


@lru_cache(maxsize=1)
def packaged_drafters() -> Mapping[str, Mapping[str, Drafter]]:
    """The packaged ``catalog/drafters.yaml``: model id -> method -> drafter."""
    text = resources.files("rooftop_planner").joinpath("catalog", "drafters.yaml").read_text()
    return parse_drafters(yaml.safe_load(text) or {}, "catalog/drafters.yaml")


def parse_drafters(data: Mapping[str, Any], where: str) -> dict[str, dict[str, Drafter]]:
    """Checked drafters: every field known, a repo each, an acceptance figure whole."""
    out: dict[str, dict[str, Drafter]] = {}
    for model_id, methods in data.items():
        if not isinstance(methods, Mapping):
            raise CatalogError(f"{where}: {model_id}: expected a mapping of method -> drafter")
        out[str(model_id)] = {
            str(method): _drafter(f"{where}: {model_id}.{method}", str(method), entry)
            for method, entry in methods.items()
        }
    return out


def _drafter(at: str, method: str, entry: Any) -> Drafter:
    if method not in _DRAFTER_FIELDS:
        raise CatalogError(f"{at}: unknown method; use one of {', '.join(METHODS)}")
    if not isinstance(entry, Mapping) or not entry.get("repo"):
        raise CatalogError(f"{at}: needs repo (what vLLM loads)")
    allowed = _DRAFTER_FIELDS[method] | _ACCEPTANCE_FIELDS
    if unknown := sorted(set(entry) - allowed):
        raise CatalogError(f"{at}: unknown field(s) {', '.join(unknown)}")
    if method == "draft_model" and not entry.get("model"):
        raise CatalogError(f"{at}: needs model, the draft's catalog id")
    values = {k: entry[k] for k in _DRAFTER_FIELDS[method] if k in entry}
    return Drafter(method=method, **values, **_acceptance(at, entry))


def _acceptance(at: str, entry: Mapping[str, Any]) -> dict[str, Any]:
    given = _ACCEPTANCE_FIELDS & set(entry)
    if not given:
        return {}
    if given != _ACCEPTANCE_FIELDS:
        raise CatalogError(
            f"{at}: acceptance_length, acceptance_k and acceptance_source go together"
        )
    try:
        rate = acceptance_from_length(float(entry["acceptance_length"]), int(entry["acceptance_k"]))
    except ValueError as err:
        raise CatalogError(f"{at}: {err}") from err
    return {"acceptance": rate, "acceptance_source": str(entry["acceptance_source"])}


def eagle_head(model: ModelSpec, drafter: Drafter) -> ModelSpec:
    """An EAGLE-3 head as a model shape: ``layers`` decoder layers of the model's width,
    an LM head over ``draft_vocab``. Parameters: the layers, whose first QKV takes the
    embedding and the fused hidden state side by side (2 · hidden wide), the fusion of
    three hidden states (3 · hidden²), and the LM head; it shares the model's embedding."""
    vocab = drafter.draft_vocab or model.vocab_size
    hidden, d = model.hidden_size, model.head_dim
    qkv = hidden * d * (model.num_heads + 2 * model.num_kv_heads)
    layer = qkv + hidden * d * model.num_heads + 3 * hidden * model.intermediate_size
    params = drafter.layers * layer + qkv + 3 * hidden * hidden + vocab * hidden
    return replace(
        model,
        id=f"{model.id}+{drafter.repo}",
        num_layers=drafter.layers,
        vocab_size=vocab,
        param_count=float(params),
        num_experts=1,
        experts_per_token=1,
        dense_layers=0,
        shared_expert_size=0,
        checkpoints={},
        aliases=(),
    )


def mtp_head(model: ModelSpec) -> ModelSpec:
    """The model's multi-token-prediction layers as a model shape: ``mtp_layers`` of
    its own layers (an expert layer where it has experts, as DeepSeek-V3's), a
    projection of the embedding and hidden state side by side (2 · hidden²) and an LM
    head (the published checkpoint carries its own copy); it shares the model's
    embedding. Parameters as ``catalog.estimate_param_count`` counts them."""
    shape = {
        "hidden_size": model.hidden_size,
        "num_layers": model.mtp_layers,
        "num_heads": model.num_heads,
        "num_kv_heads": model.num_kv_heads,
        "head_dim": model.head_dim,
        "intermediate_size": model.intermediate_size,
        "num_experts": model.num_experts,
        "shared_expert_size": model.shared_expert_size,
        "vocab_size": model.vocab_size,
        "tie_word_embeddings": True,  # the head counted once: the embedding is shared
        "kv_lora_rank": model.kv_lora_rank,
        "q_lora_rank": model.q_lora_rank,
        "qk_nope_head_dim": model.qk_nope_head_dim,
        "qk_rope_head_dim": model.qk_rope_head_dim,
        "v_head_dim": model.v_head_dim,
    }
    params = estimate_param_count(shape) + 2 * model.hidden_size**2
    return replace(
        model,
        id=f"{model.id}+mtp",
        num_layers=model.mtp_layers,
        param_count=float(params),
        dense_layers=0,
        dense_intermediate_size=0,
        sliding_layers=None,
        sliding_window=None,
        mtp_layers=0,
        checkpoints={},
        aliases=(),
    )


def drafter_shape(model: ModelSpec, drafter: Drafter, catalog: Catalog) -> ModelSpec:
    """The shape ``drafter`` runs as beside ``model``: a draft model's catalog shape,
    which must share the model's vocabulary (vLLM verifies token ids), an EAGLE-3 head
    built from the model's (``eagle_head``), or its own MTP layers (``mtp_head``)."""
    if drafter.method == MTP:
        return mtp_head(model)
    if drafter.method != "draft_model":
        return eagle_head(model, drafter)
    try:
        draft = catalog.model(drafter.model)
    except CatalogError as err:
        raise CatalogError(f"the drafter {drafter.repo}'s shape: {err}") from err
    if draft.vocab_size != model.vocab_size:
        raise CatalogError(
            f"drafter {drafter.repo} for {model.id}: vocabulary {draft.vocab_size} is "
            f"not the model's {model.vocab_size}; vLLM verifies token ids"
        )
    return draft


def with_drafter(model_id: str, drafter: Drafter | None) -> dict[str, Drafter]:
    """The catalog's drafters for ``model_id`` (method -> drafter), ``drafter`` in place
    of the one of its method."""
    known = dict(packaged_drafters().get(model_id, {}))
    if drafter is not None:
        known[drafter.method] = drafter
    return known


def named_drafter(spec: ServingTargetSpec) -> Drafter | None:
    """``spec.engine.drafter`` as a drafter (no published acceptance for it)."""
    named = spec.engine.drafter
    if named is None:
        return None
    return Drafter(
        method=named.method.value,
        repo=named.model,
        source="spec.engine.drafter",
        layers=named.layers,
        draft_vocab=named.draft_vocab_size or 0,
        model=named.catalog_model or "",
    )


def drafters_for(spec: ServingTargetSpec, model: ModelSpec) -> Mapping[str, Mapping[str, Drafter]]:
    """The drafter catalog, with ``spec.engine.drafter`` in place of the catalog's
    drafter for its method and this model."""
    named = named_drafter(spec)
    if named is None:
        return packaged_drafters()
    return {**packaged_drafters(), model.id: with_drafter(model.id, named)}


def planned_drafter(spec: ServingTargetSpec, method: str) -> Drafter | None:
    """The drafter a plan of ``spec`` speculating by ``method`` drafts with: the one
    ``spec.engine.drafter`` names, else the catalog's for its model (None: neither);
    vLLM's host lookups for ``ngram`` and ``suffix``, the model's own layers for
    ``mtp``."""
    if method in HOST_DRAFTERS:
        return HOST_DRAFTERS[method]
    if method == MTP:
        try:
            return mtp_drafter(resolve_model(spec, load_catalog()))
        except CatalogError:  # the spec's model does not read: the planner says so
            return None
    try:
        model_id = load_catalog().model(spec.model).id
    except CatalogError:  # a model outside the catalog (spec.modelConfig) has no entry
        model_id = spec.model
    return with_drafter(model_id, named_drafter(spec)).get(method)


def planned_acceptance(spec: ServingTargetSpec, method: str) -> float | None:
    """The acceptance a plan of ``spec`` speculating by ``method`` was made with: the
    target's stated one, else its drafter's published figure (None: neither; always
    for ``ngram`` and ``suffix``, whose acceptance is the traffic's)."""
    if spec.workload.acceptance_rate is not None:
        return spec.workload.acceptance_rate
    drafter = planned_drafter(spec, method)
    return drafter.acceptance if drafter is not None else None
