"""Generate the ServingTarget CRD from the pydantic models in ``rooftop_api.spec``.

Why generated: the models are the single source of truth for the resource, so the CRD
in ``charts/rooftop/crds/`` is a build artefact. ``python -m rooftop_api.crd``
rewrites it; ``--check`` exits non-zero when the file is stale (CI and a unit test run it).

Pydantic emits JSON Schema (draft 2020-12 with ``$defs``); Kubernetes wants a
*structural* OpenAPI v3 schema: every node typed, no ``$ref``, no ``anyOf`` with null
(``nullable: true`` instead), no ``additionalProperties: false`` (the API server's strict
field validation rejects unknown fields instead), numeric ``exclusiveMinimum`` as a
boolean. Cross-field rules that pydantic checks in ``model_validator``s are repeated here
as CEL ``x-kubernetes-validations`` (``CEL_RULES``), so ``kubectl apply`` rejects what
``rooftop plan`` would reject, with a message naming the field.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import yaml
from pydantic import BaseModel

from rooftop_api import spec as st
from rooftop_api import vllm_args
from rooftop_api.errors import ApiError
from rooftop_api.generated import write_or_check
from rooftop_api.spec import GROUP, PLURAL, SINGULAR, VERSION

SHORT_NAMES: Final = ["st"]
CRD_NAME: Final = f"{PLURAL}.{GROUP}"
# Children are named "<name>" (Service) and "<name>-engine" (Deployment, PodMonitor), and
# the Service name must be a DNS-1035 label (63 chars): 63 - len("-engine") = 56. The
# manifest loader checks the same (spec.Metadata).
MAX_NAME_LENGTH: Final = st.MAX_NAME_LENGTH

REPO_ROOT: Final = Path(__file__).resolve().parents[2]
DEFAULT_OUTPUT: Final = REPO_ROOT / "charts" / "rooftop" / "crds" / f"{CRD_NAME}.yaml"

Schema = dict[str, Any]


def guarded_options() -> list[str]:
    """The option strings of every dest Rooftop owns (``vllm_args.PLANNED`` and
    ``RESERVED``) and the all-underscore spelling of the long ones, for CEL.

    Why only these: CEL cannot replay argparse (unique prefixes, ``--x_Y`` mixes), so the
    API server refuses the spellings people write and the pydantic check (operator and
    ``rooftop plan``) does the rest with vLLM's parsing rules.
    """
    return _spellings({*vllm_args.PLANNED, *vllm_args.RESERVED})


def secret_options() -> list[str]:
    """The option strings of the flags that carry a secret (``vllm_args.SECRET_FLAGS``),
    with their all-underscore spellings, for CEL."""
    return _spellings(set(vllm_args.SECRET_FLAGS))


def _spellings(dests: set[str]) -> list[str]:
    """Every option string that sets one of ``dests``, and the all-underscore spelling
    of the long ones (``--max_num_seqs``)."""
    table = vllm_args.load_table()
    options = sorted({o for o, f in table.by_option.items() if f.dest in dests})
    underscored = [o.replace("-", "_").replace("__", "--", 1) for o in options]
    return sorted({*options, *(u for u in underscored if u.startswith("--"))})


def _no_flag_of(flags: Sequence[str]) -> str:
    """CEL: no extraArgs entry is one of ``flags``, alone or as ``--flag=value``."""
    listed = ", ".join(f"'{f}'" for f in flags)
    return (
        f"!has(self.extraArgs) || self.extraArgs.all(a, [{listed}].all(f, "
        "a != f && !a.startsWith(f + '=')))"
    )


# CEL rules per pydantic model (by class name), mirroring its model_validator.
# fieldPath makes the API server's error name the offending field (Kubernetes >= 1.28).
CEL_RULES: Final[dict[str, list[Schema]]] = {
    "TokenLengths": [
        {
            "rule": "has(self.mean) || has(self.histogram)",
            "message": "give either mean (and optionally p90) or histogram",
        },
        {
            "rule": "!(has(self.mean) && has(self.histogram))",
            "message": "give either mean/p90 or histogram, not both",
            "fieldPath": ".histogram",
        },
        {
            "rule": "!has(self.mean) || !has(self.p90) || self.p90 >= self.mean",
            "message": "p90 must be >= mean",
            "fieldPath": ".p90",
        },
    ],
    "Constraints": [
        {
            "rule": "self.minReplicas <= self.maxReplicas",
            "message": "minReplicas must be <= maxReplicas",
            "fieldPath": ".minReplicas",
        },
        {
            "rule": "!has(self.nodeSelector) || "
            f"self.nodeSelector.all(k, k.matches('{st.LABEL_KEY}'))",
            "message": "nodeSelector keys must be label keys ([prefix/]name, e.g. "
            "example.com/pool)",
            "fieldPath": ".nodeSelector",
        },
    ],
    "EnvVar": [
        {
            "rule": "!(self.name in [" + ", ".join(f"'{n}'" for n in vllm_args.SECRET_ENV) + "])",
            "message": "env must not carry a secret in plain text: name a Secret in "
            "spec.engine.hfTokenSecretRef (HF_TOKEN, HUGGING_FACE_HUB_TOKEN) or "
            "spec.engine.apiKeySecretRef (VLLM_API_KEY)",
            "fieldPath": ".name",
        },
    ],
    "Toleration": [
        {
            "rule": "!has(self.tolerationSeconds) || "
            "(has(self.effect) && self.effect == 'NoExecute')",
            "message": "tolerationSeconds applies only to effect NoExecute",
            "fieldPath": ".tolerationSeconds",
        },
        {
            "rule": "!has(self.operator) || self.operator != 'Exists' || "
            "!has(self.value) || self.value == ''",
            "message": "value must be empty with operator Exists",
            "fieldPath": ".value",
        },
    ],
    "Engine": [
        {
            "rule": _no_flag_of(guarded_options()),
            "message": "extraArgs must not set what Rooftop sets (the plan's engine shape, "
            "the model, the port, a --config file): "
            + ", ".join(o for o in guarded_options() if "_" not in o),
            "fieldPath": ".extraArgs",
        },
        {
            "rule": _no_flag_of(secret_options()),
            "message": "extraArgs must not carry a secret (stored in plain text): put it in "
            "a Secret and name it in spec.engine.apiKeySecretRef (--api-key) or "
            "spec.engine.hfTokenSecretRef (--hf-token)",
            "fieldPath": ".extraArgs",
        },
        {
            "rule": _no_flag_of(list(vllm_args.REMOVED)),
            "message": f"extraArgs must not use a flag vLLM {vllm_args.load_table().vllm_version} "
            "does not have: " + ", ".join(vllm_args.REMOVED),
            "fieldPath": ".extraArgs",
        },
    ],
}

CEL_RULES["ServingTargetSpec"] = [
    {
        "rule": "!has(self.constraints) || !has(self.constraints.speculative) || "
        "size(self.constraints.speculative) == 0 || !has(self.engine) || "
        + _no_flag_of(_spellings({"speculative_config"})).replace(
            "self.extraArgs", "self.engine.extraArgs"
        ),
        "message": "engine.extraArgs sets --speculative-config while constraints.speculative "
        "lets the planner choose the drafter and draft lengths; remove one of them",
        "fieldPath": ".engine.extraArgs",
    },
    {
        "rule": "!has(self.constraints) || !has(self.constraints.speculative) || "
        "!('draft_model' in self.constraints.speculative) || !has(self.engine) || "
        + _no_flag_of(_spellings({"watermark_config"})).replace(
            "self.extraArgs", "self.engine.extraArgs"
        ),
        "message": "engine.extraArgs sets --watermark-config, which vLLM refuses beside a "
        "draft_model drafter (it watermarks only EAGLE-style drafts); remove draft_model "
        "from constraints.speculative or the watermark config",
        "fieldPath": ".engine.extraArgs",
    },
    {
        "rule": "!has(self.constraints) || !has(self.constraints.speculative) || "
        "!('ngram' in self.constraints.speculative || 'suffix' in self.constraints.speculative) "
        "|| !has(self.engine) || "
        + _no_flag_of(st.ASYNC_SCHEDULING_FLAGS).replace("self.extraArgs", "self.engine.extraArgs"),
        "message": "engine.extraArgs sets --async-scheduling, which vLLM refuses beside "
        "ngram and suffix drafts; remove them from constraints.speculative or the flag",
        "fieldPath": ".engine.extraArgs",
    },
    {
        "rule": "!has(self.engine) || !has(self.engine.drafter) || "
        "(has(self.constraints) && has(self.constraints.speculative) && "
        "self.engine.drafter.method in self.constraints.speculative)",
        "message": "engine.drafter's method must be listed in constraints.speculative",
        "fieldPath": ".engine.drafter",
    },
]
CEL_RULES["Drafter"] = [
    {
        "rule": "!(self.method in ['ngram', 'suffix', 'mtp'])",
        "message": "ngram, suffix and mtp load no drafter of their own; remove engine.drafter",
        "fieldPath": ".method",
    },
    {
        "rule": "self.method != 'draft_model' || has(self.catalogModel)",
        "message": "a draft_model drafter needs catalogModel, the catalog model whose shape it has",
        "fieldPath": ".catalogModel",
    },
    {
        "rule": "self.method != 'eagle3' || !has(self.catalogModel)",
        "message": "an eagle3 head has no catalogModel; give layers and draftVocabSize",
        "fieldPath": ".catalogModel",
    },
]

# Rules with no pydantic counterpart: Kubernetes naming limits of the children.
ROOT_RULES: Final[list[Schema]] = [
    {
        "rule": (
            f"size(self.metadata.name) <= {MAX_NAME_LENGTH} && "
            f"self.metadata.name.matches('{st.NAME_PATTERN}')"
        ),
        "message": (
            f"metadata.name must be a DNS-1035 label of at most {MAX_NAME_LENGTH} characters "
            "(it names the Service and the Deployment)"
        ),
    },
]

# Per-field additions (model, alias) -> keys merged into the converted schema. Pricing's
# validator (prices >= 0) is a plain bound on the map values, no CEL needed.
FIELD_EXTRAS: Final[Mapping[tuple[str, str], Schema]] = {
    ("Pricing", "usdPerGpuHour"): {"additionalProperties": {"type": "number", "minimum": 0}},
    ("ServingTargetStatus", "conditions"): {
        "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": ["type"],
    },
}

PRINTER_COLUMNS: Final[list[Schema]] = [
    {"name": "Model", "type": "string", "jsonPath": ".spec.model"},
    {"name": "GPU", "type": "string", "jsonPath": ".status.gpu"},
    {"name": "TP", "type": "integer", "jsonPath": ".status.plan.tp"},
    {"name": "Replicas", "type": "integer", "jsonPath": ".status.plan.replicas"},
    {"name": "Batch", "type": "integer", "jsonPath": ".status.plan.maxNumSeqs"},
    {
        "name": "TPOT",
        "type": "number",
        "jsonPath": ".status.observed.tpotMs",
        "description": "Observed TPOT (ms) at the SLO percentile.",
    },
    {"name": "SLO", "type": "string", "jsonPath": ".status.slo"},
    {"name": "$/h", "type": "number", "jsonPath": ".status.plan.usdPerHour"},
    {"name": "Ready", "type": "string", "jsonPath": ".status.ready"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]

_PASSTHROUGH: Final = frozenset(
    {
        "type",
        "description",
        "enum",
        "minimum",
        "maximum",
        "minLength",
        "maxLength",
        "pattern",
        "minItems",
        "maxItems",
        "format",
        "default",
        "required",
        "minProperties",
        "maxProperties",
    }
)
_DROPPED: Final = frozenset({"title"})


class SchemaError(ApiError):
    """Pydantic produced a construct this converter does not know how to translate."""


def _deref(node: Schema, defs: Mapping[str, Schema]) -> tuple[Schema, str | None]:
    """Inline a ``$ref``; sibling keys (description, default) override the target's."""
    ref = node.get("$ref")
    if ref is None:
        return node, None
    name = ref.rsplit("/", 1)[-1]
    merged = {**defs[name], **{k: v for k, v in node.items() if k != "$ref"}}
    return merged, name


def _unwrap_nullable(node: Schema) -> tuple[Schema, bool]:
    """``anyOf: [X, {type: null}]`` -> (X + sibling keys, True)."""
    options = node.get("anyOf")
    if options is None:
        return node, False
    non_null = [o for o in options if o.get("type") != "null"]
    if len(non_null) != 1 or len(options) != 2:
        raise SchemaError(f"anyOf other than 'X or null' is not structural: {options}")
    siblings = {k: v for k, v in node.items() if k != "anyOf"}
    return {**non_null[0], **siblings}, True


def convert(node: Schema, defs: Mapping[str, Schema], model: str | None = None) -> Schema:
    """Convert one pydantic JSON Schema node into a structural OpenAPI v3 node."""
    node, nullable = _unwrap_nullable(node)
    node, ref_model = _deref(node, defs)
    if ref_model is not None:  # the target may itself be "X or null"
        return _finish(convert(node, defs, ref_model), nullable)
    out: Schema = {}
    rules: list[Schema] = []
    for key, value in node.items():
        if key in _DROPPED or (key == "default" and value is None):
            continue
        if key == "const":
            out["enum"] = [value]
        elif key == "exclusiveMinimum":
            out.update(minimum=value, exclusiveMinimum=True)
        elif key == "properties":
            out["properties"] = {
                name: _property(model, name, sub, defs) for name, sub in value.items()
            }
        elif key == "items":
            out["items"] = convert(value, defs)
        elif key == "additionalProperties":
            out.update(_additional(value, defs))
        elif key == "propertyNames":
            rules.append(_key_rule(value))
        elif key in _PASSTHROUGH:
            out[key] = value
        else:
            raise SchemaError(f"unsupported JSON Schema keyword {key!r} in {node}")
    if "type" not in out and "enum" in out:
        out["type"] = "string"
    if model is not None and model in CEL_RULES:
        rules += CEL_RULES[model]
    if rules:
        out["x-kubernetes-validations"] = rules
    return _finish(out, nullable)


def _key_rule(names: Schema) -> Schema:
    """CEL for a map's key bound (OpenAPI has no propertyNames), so that no key is
    longer than the models allow."""
    unknown = set(names) - {"maxLength", "minLength"}
    if unknown or "maxLength" not in names:
        raise SchemaError(f"propertyNames other than a length bound: {names}")
    low, high = names.get("minLength", 0), names["maxLength"]
    size = f"size(k) >= {low} && size(k) <= {high}" if low else f"size(k) <= {high}"
    return {"rule": f"self.all(k, {size})", "message": f"keys must have {low} to {high} characters"}


# Canonical key order so the generated YAML reads type-first, children last.
_KEY_ORDER: Final = (
    "type",
    "description",
    "nullable",
    "enum",
    "default",
    "format",
    "minimum",
    "exclusiveMinimum",
    "maximum",
    "minLength",
    "maxLength",
    "pattern",
    "minItems",
    "maxItems",
    "minProperties",
    "maxProperties",
    "required",
    "properties",
    "items",
    "additionalProperties",
    "x-kubernetes-preserve-unknown-fields",
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
    "x-kubernetes-validations",
)


def _finish(out: Schema, nullable: bool) -> Schema:
    if nullable:
        out = {**out, "nullable": True}
    return {key: out[key] for key in sorted(out, key=_KEY_ORDER.index)}


def _property(model: str | None, name: str, sub: Schema, defs: Mapping[str, Schema]) -> Schema:
    converted = convert(sub, defs)
    return _finish({**converted, **FIELD_EXTRAS.get((model or "", name), {})}, False)


def _additional(value: bool | Schema, defs: Mapping[str, Schema]) -> Schema:
    """``false`` is dropped (strict field validation does its job); ``true`` (a free-form
    mapping such as modelConfig) keeps unknown fields; a schema types the map values."""
    if value is False:
        return {}
    if value is True:
        return {"x-kubernetes-preserve-unknown-fields": True}
    return {"additionalProperties": convert(value, defs)}


def model_schema(model: type[BaseModel]) -> Schema:
    """A pydantic model's structural schema, its own CEL rules included."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    defs = raw.pop("$defs", {})
    return convert(raw, defs, model.__name__)


def open_api_schema() -> Schema:
    """The whole ``openAPIV3Schema``: apiVersion/kind/metadata, spec and status."""
    return {
        "type": "object",
        "description": st.ServingTarget.__doc__ or "",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": model_schema(st.ServingTargetSpec),
            "status": model_schema(st.ServingTargetStatus),
        },
        "x-kubernetes-validations": ROOT_RULES,
    }


def build_crd() -> Schema:
    """The CustomResourceDefinition as a dict."""
    version = {
        "name": VERSION,
        "served": True,
        "storage": True,
        "schema": {"openAPIV3Schema": open_api_schema()},
        "subresources": {"status": {}},
        "additionalPrinterColumns": PRINTER_COLUMNS,
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": CRD_NAME, "labels": {"app.kubernetes.io/part-of": "rooftop"}},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": st.KIND,
                "listKind": f"{st.KIND}List",
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": SHORT_NAMES,
                "categories": ["rooftop"],
            },
            "versions": [version],
        },
    }


HEADER: Final = (
    "# Generated by `python -m rooftop_api.crd` from rooftop_api/spec.py.\n"
    "# Do not edit by hand: change the pydantic models and regenerate.\n"
)


class _NoAliasDumper(yaml.SafeDumper):
    """Shared enum lists would otherwise become YAML anchors (&id001), which are valid
    but make the CRD hard to read and diff."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def render() -> str:
    """The CRD as YAML text, exactly as written to the chart."""
    body = yaml.dump(
        build_crd(), Dumper=_NoAliasDumper, sort_keys=False, width=100, allow_unicode=True
    )
    return HEADER + body


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rooftop_api.crd", description=__doc__)
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="CRD YAML path")
    parser.add_argument("--check", action="store_true", help="fail if the file is stale")
    args = parser.parse_args(argv)
    return write_or_check(
        args.output, render(), check=args.check, stale_hint="run `python -m rooftop_api.crd`"
    )


if __name__ == "__main__":
    sys.exit(main())
