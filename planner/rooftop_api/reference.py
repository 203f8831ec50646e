"""Generate the ServingTarget reference page (``docs/reference.md``) from ``rooftop_api.spec``.

Why generated: the pydantic models are the single source of truth for the resource (the
CRD is generated from them too), so the page lists exactly the fields the API server
accepts, under the camelCase names YAML uses, with the models' types, defaults, bounds
and descriptions. ``python -m rooftop_api.reference`` rewrites the page; ``--check``
exits 1 when it is stale (``make lint`` and a unit test run it).

The page is built from the same JSON Schema the CRD generator reads
(``model_json_schema(by_alias=True, mode="validation")``): one section per object, named
by its path in the manifest (``spec.workload.promptTokens``), one table row per field.
A field whose model gives no description takes a line from ``NOTES`` (a unit test keeps
``NOTES`` to fields without one), else the docstring of the object it holds.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from pydantic import BaseModel

from rooftop_api import spec as st
from rooftop_api.generated import write_or_check

REPO_ROOT: Final = Path(__file__).resolve().parents[2]
DEFAULT_OUTPUT: Final = REPO_ROOT / "docs" / "reference.md"

Node = Mapping[str, object]

# Descriptions for fields whose model has none, keyed by the field's path in the manifest
# (for an object at several paths, its first). Where a model gains a description, its
# entry here must go (tests/unit/api/test_reference.py).
NOTES: Final[Mapping[str, str]] = {
    "apiVersion": "The API group and version.",
    "kind": "The resource kind.",
    "metadata": "Standard Kubernetes object metadata; a manifest needs `name`.",
    "metadata.name": "The target's name. It names the engine Deployment (`NAME-engine`) "
    "and Service (`NAME`), so it must be a DNS-1035 label of at most 56 characters: the "
    "API server and `rooftop plan` refuse any other, and say what to use instead.",
    "metadata.namespace": "The namespace; the engine objects are created in it.",
    "spec.constraints.maxTensorParallel": "Largest tensor-parallel size to plan (GPUs per "
    "replica).",
    "spec.constraints.minReplicas": "Fewest replicas the loop keeps (0 allows scaling to zero "
    "without load). At most `maxReplicas`.",
    "spec.constraints.maxReplicas": "Most replicas the plan and the loop may use.",
    "spec.constraints.tolerations": "Tolerations added to the engine pods (they always "
    "tolerate the `nvidia.com/gpu` taint).",
    "spec.engine.env": "Extra environment variables for the engine container; one here wins "
    "over the operator's variable of the same name.",
    "spec.engine.env[].name": "Variable name.",
    "spec.engine.env[].value": "Variable value.",
    "spec.workload.promptTokens.histogram[].tokens": "Token count of this bin.",
    "spec.workload.promptTokens.histogram[].weight": "Relative weight of this bin (the "
    "weights need not sum to 1).",
    "spec.engine.imagePullSecrets[].name": "Secret name.",
    "spec.engine.hfTokenSecretRef.name": "Secret name.",
    "spec.engine.hfTokenSecretRef.key": "Key in the Secret.",
    "spec.constraints.tolerations[].key": "Taint key the toleration matches (empty: all keys).",
    "spec.constraints.tolerations[].operator": "`Exists` or `Equal` (default `Equal`).",
    "spec.constraints.tolerations[].value": "Taint value to match with `Equal`.",
    "spec.constraints.tolerations[].effect": "Taint effect to match (empty: all effects).",
    "status.conditions": "Six conditions: `Planned`, `Feasible`, "
    "`Deployed`, `Ready`, `SLOMet`, `WithinBudget`.",
    "status.observedGeneration": "The spec generation the plan was made for.",
    "status.replicas": "Engine pods the Deployment has.",
    "status.readyReplicas": "Engine pods that are ready.",
    "status.conditions[].type": "`Planned`, `Feasible`, `Deployed`, `Ready`, `SLOMet` or "
    "`WithinBudget`.",
    "status.conditions[].status": "Whether the condition holds.",
    "status.conditions[].reason": "One CamelCase word; the operating guide's status conditions "
    "table lists them all.",
    "status.conditions[].message": "What happened, in a sentence with the numbers.",
    "status.conditions[].lastTransitionTime": "When the status last changed (RFC 3339).",
    "status.conditions[].observedGeneration": "The spec generation the condition describes.",
    "status.observed.tpotMs": "Observed time per output token at the SLO's percentile, "
    "milliseconds.",
    "status.observed.ttftMs": "Observed time to first token at the SLO's percentile, milliseconds.",
    "status.observed.requestsPerSecond": "Observed arrival rate.",
    "status.observed.running": "Requests running in the engines (sum over pods).",
    "status.observed.waiting": "Requests waiting in the engines' queues (sum over pods).",
    "status.observed.kvCacheUsageRatio": "KV cache in use, 0 to 1 (mean over pods).",
    "status.observed.calibrationFactor": "Observed over predicted decode step time; the "
    "planner's step times are scaled by it when the loop re-plans.",
    "status.plan.gpu": "GPU catalog id.",
    "status.plan.tp": "Tensor-parallel size (GPUs per replica).",
    "status.plan.replicas": "Engine replicas (the loop updates it).",
    "status.plan.maxNumSeqs": "vLLM `--max-num-seqs`, the batch cap (the loop may move it).",
    "status.plan.weightDtype": "Weight dtype.",
    "status.plan.kvDtype": "KV cache dtype.",
    "status.plan.maxModelLen": "vLLM `--max-model-len`.",
    "status.plan.predicted": "What the planner predicts for the plan at the planned rate.",
    "status.plan.usdPerHour": "Cost of all replicas, USD per hour.",
    "status.plan.summary": "The plan in one sentence, as the `Planned` condition says it.",
    "status.plan.predicted.tpotMs": "Predicted time per output token at the SLO's "
    "percentile, milliseconds.",
    "status.plan.predicted.ttftMs": "Predicted time to first token at the SLO's percentile, "
    "milliseconds.",
    "status.plan.predicted.outputTokS": "Predicted output tokens per second per replica.",
}

# What the resource's top level says about ``status``, which has no field in the
# manifest model (the operator writes it; a manifest never carries it).
STATUS_DESCRIPTION: Final = (
    "Written by the operator: the plan, what the loop observed, the conditions and the "
    "printer columns. Read-only."
)
ROOT: Final = "ServingTarget"  # the top-level section's title; fields below it are `spec...`


@dataclass(frozen=True)
class Row:
    """One field of one object, as the page prints it."""

    name: str
    type: str
    default: str
    constraints: str
    description: str


@dataclass
class Section:
    """One object (a pydantic model) and the paths in the manifest where it appears."""

    model: str
    paths: list[str]
    description: str
    rows: list[Row] = field(default_factory=list)

    @property
    def anchor(self) -> str:
        return anchor(self.paths[0])


def anchor(path: str) -> str:
    """A heading id for a manifest path: ``spec.engine.env[]`` -> ``spec-engine-env``."""
    return re.sub(r"[^a-z0-9]+", "-", path.lower()).strip("-")


# ---- reading the JSON Schema (values are plain JSON: narrowed, never trusted) ----


def _node(value: object) -> Node:
    return value if isinstance(value, Mapping) else {}


def _str(value: object) -> str:
    return value if isinstance(value, str) else ""


def _list(value: object) -> list[object]:
    return list(value) if isinstance(value, list) else []


def _ref(node: Node) -> str | None:
    """The model name a ``$ref`` node points at."""
    ref = _str(node.get("$ref"))
    return ref.rsplit("/", 1)[-1] if ref else None


def _non_null(node: Node) -> Node:
    """``anyOf: [X, {type: null}]`` -> X with the node's own keys (default, description)."""
    options = [_node(o) for o in _list(node.get("anyOf")) if _node(o).get("type") != "null"]
    if not options:
        return node
    if len(options) != 1:
        raise ValueError(f"anyOf other than 'X or null': {node}")
    return {**options[0], **{k: v for k, v in node.items() if k != "anyOf"}}


def _is_object(node: Node, defs: Node) -> bool:
    name = _ref(node)
    return name is not None and "properties" in _node(defs.get(name))


def _json(value: object) -> str:
    """A JSON value as the page prints it; whole numbers with thousands separators."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return json.dumps(value, ensure_ascii=False)


# ---- types, bounds, defaults ----


def _enum_values(node: Node, defs: Node) -> list[object] | None:
    name = _ref(node)
    target = _node(defs.get(name)) if name else node
    if "const" in target:
        return [target["const"]]
    values = _list(target.get("enum"))
    return values or None


def _type(node: Node, defs: Node, links: Mapping[str, str]) -> str:
    """The field's type in words; objects link to their section."""
    node = _non_null(node)
    name = _ref(node)
    if name is not None and name in links:
        return f"[{name}](#{links[name]})"
    if _enum_values(node, defs) is not None:
        return "string"
    kind = _str(node.get("type"))
    if kind == "array":
        return f"list of {_type(_node(node.get('items')), defs, links)}"
    if kind == "object":
        values = node.get("additionalProperties")
        if isinstance(values, Mapping):
            return f"map of string to {_type(values, defs, links)}"
        return "object (any fields)"
    return kind or "any"


def _bounds(node: Node) -> list[str]:
    """A node's own bounds in words (numbers, lengths, counts, patterns)."""
    out: list[str] = []
    low = node.get("exclusiveMinimum")
    if low is not None:
        out.append(f"> {_json(low)}")
    elif node.get("minimum") is not None:
        out.append(f"≥ {_json(node['minimum'])}")
    if node.get("maximum") is not None:
        out.append(f"≤ {_json(node['maximum'])}")
    for key, unit in (("Length", "characters"), ("Items", "items")):
        lo, hi = node.get(f"min{key}"), node.get(f"max{key}")
        if lo is not None and hi is not None:
            out.append(f"{_json(lo)}-{_json(hi)} {unit}")
        elif hi is not None:
            out.append(f"at most {_json(hi)} {unit}")
        elif lo is not None:
            out.append(f"at least {_json(lo)} {unit}")
    pattern = _str(node.get("pattern"))
    if pattern:
        out.append(f"matches `{pattern}`")
    return out


def _constraints(node: Node, defs: Node) -> str:
    node = _non_null(node)
    parts = _bounds(node)
    values = _enum_values(node, defs)
    if values is not None:
        parts.append("one of " + ", ".join(f"`{v}`" for v in values))
    items = _node(node.get("items"))
    if items:
        inner = _bounds(items)
        item_values = _enum_values(items, defs)
        if item_values is not None:
            inner.append("one of " + ", ".join(f"`{v}`" for v in item_values))
        parts.extend(f"each {part}" for part in inner)
    return "; ".join(parts)


def _default(node: Node, required: bool, defs: Node) -> str:
    if required:
        return "**required**"
    if "default" not in node:  # a default_factory: an object of its fields' defaults
        return "`{}`" if _is_object(node, defs) else ""
    value = node["default"]
    if value is None:
        return "unset"
    if value == "":
        return '`""`'
    return f"`{value}`" if isinstance(value, str) else f"`{_json(value)}`"


def prose(text: str) -> str:
    """A docstring or description as one Markdown line (``x`` -> `x`)."""
    return " ".join(text.replace("``", "`").split())


def field_path(section_path: str, name: str) -> str:
    """A field's path in the manifest: ``spec.slo`` + ``tpotMs``; top-level fields bare."""
    return name if section_path == ROOT else f"{section_path}.{name}"


def _description(path: str, node: Node, defs: Node) -> str:
    # a mixed fleet's pools keep the plan's own fields, described as the plan's are
    text = _str(node.get("description")) or NOTES.get(path.replace(".pools[]", ""), "")
    if not text:
        targets = [_ref(child) for _, child in _children(node)]
        target = targets[0] if targets else None
        text = _str(_node(defs.get(target)).get("description")) if target else ""
    return prose(text)


# ---- the page ----


def _children(node: Node) -> Iterator[tuple[str, Node]]:
    """The object nodes a field leads to, with the path suffix of each."""
    node = _non_null(node)
    if _ref(node) is not None:
        yield "", node
    items = _node(node.get("items"))
    if items:
        yield from ((f"[]{s}", n) for s, n in _children(items))
    values = node.get("additionalProperties")
    if isinstance(values, Mapping):
        yield from ((f".*{s}", n) for s, n in _children(values))


def _walk(model: str, path: str, defs: Node, sections: dict[str, Section]) -> None:
    """Collect ``model``'s section and, depth-first, those of the objects it holds."""
    schema = _node(defs.get(model))
    if model in sections:  # an object at a second path (outputTokens): record it, and below
        sections[model].paths.append(path)
    else:
        sections[model] = Section(model, [path], prose(_str(schema.get("description"))))
    for name, sub in _node(schema.get("properties")).items():
        for suffix, child in _children(_node(sub)):
            target = _ref(child)
            if target is not None and _is_object(child, defs):
                _walk(target, field_path(path, name) + suffix, defs, sections)


def _fill(sections: Mapping[str, Section], defs: Node) -> None:
    """The rows of every section."""
    links = {name: s.anchor for name, s in sections.items()}
    for section in sections.values():
        schema = _node(defs.get(section.model))
        required = {_str(r) for r in _list(schema.get("required"))}
        for name, raw in _node(schema.get("properties")).items():
            node = _node(raw)
            section.rows.append(
                Row(
                    name=name,
                    type=_type(node, defs, links),
                    default=_default(node, name in required, defs),
                    constraints=_constraints(node, defs),
                    description=_description(field_path(section.paths[0], name), node, defs),
                )
            )


def _describe_from_fields(sections: Mapping[str, Section]) -> None:
    """An object without a docstring is described by the first field that holds it."""
    rows = [row for parent in sections.values() for row in parent.rows]
    for section in sections.values():
        holders = [row for row in rows if f"(#{section.anchor})" in row.type]
        if not section.description and holders:
            section.description = holders[0].description


def _schema(model: type[BaseModel]) -> tuple[Node, Node]:
    raw = model.model_json_schema(by_alias=True, mode="validation")
    defs = _node(raw.pop("$defs", {}))
    return raw, defs


def build_sections(
    manifest: type[BaseModel] = st.ServingTarget,
    status: type[BaseModel] = st.ServingTargetStatus,
) -> list[Section]:
    """Every object of the resource, top level first, then ``spec`` and ``status`` depth-first."""
    top, top_defs = _schema(manifest)
    status_top, status_defs = _schema(status)
    defs: dict[str, object] = {
        **top_defs,
        **status_defs,
        manifest.__name__: top,
        status.__name__: status_top,
    }
    sections: dict[str, Section] = {}
    _walk(manifest.__name__, ROOT, defs, sections)
    _walk(status.__name__, "status", defs, sections)
    _fill(sections, defs)
    sections[manifest.__name__].rows.append(
        Row(
            name="status",
            type=f"[{status.__name__}](#{sections[status.__name__].anchor})",
            default="",
            constraints="",
            description=STATUS_DESCRIPTION,
        )
    )
    _describe_from_fields(sections)
    return list(sections.values())


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


HEADER: Final = """# ServingTarget reference

<!-- Generated by `python -m rooftop_api.reference` from planner/rooftop_api/spec.py.
     Do not edit by hand: change the pydantic models and regenerate. -->

A ServingTarget (`apiVersion: rooftop.dev/v1alpha1`, `kind: ServingTarget`, short name
`st`) asks for one model served to a latency SLO within a budget. This page lists every
field the API server accepts, by its YAML name and its path in the manifest, with its type,
default, bounds and meaning. It is generated from the same models as the CRD, so the two
list the same fields (`kubectl explain servingtarget.spec` shows the CRD's view). Unknown
fields are rejected, with a message naming the field; `unset` means the field may be left
out and has no value. Rules that span fields (`minReplicas` ≤ `maxReplicas`, either `mean`
or `histogram`, the `extraArgs` checks) are checked by `kubectl apply` and `rooftop plan`
alike.

"""


def render_sections(sections: Sequence[Section]) -> str:
    """The page body: a heading, a description and a field table per object."""
    parts: list[str] = []
    for section in sections:
        title = f"## `{section.paths[0]}` {{#{section.anchor}}}\n"
        lines = [title]
        if len(section.paths) > 1:
            also = ", ".join(f"`{p}`" for p in section.paths[1:])
            lines.append(f"Also at {also}.\n")
        if section.description:
            lines.append(section.description + "\n")
        lines.append("| field | type | default | constraints | description |")
        lines.append("|---|---|---|---|---|")
        for row in section.rows:
            cells = [f"`{row.name}`", row.type, row.default, row.constraints, row.description]
            lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
        parts.append("\n".join(lines) + "\n")
    return "\n".join(parts)


def render(
    manifest: type[BaseModel] = st.ServingTarget,
    status: type[BaseModel] = st.ServingTargetStatus,
) -> str:
    """The whole page, exactly as written to ``docs/reference.md``."""
    return HEADER + render_sections(build_sections(manifest, status))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rooftop_api.reference", description=__doc__)
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="page path")
    parser.add_argument("--check", action="store_true", help="fail if the page is stale")
    args = parser.parse_args(argv)
    hint = "the ServingTarget models changed; run `python -m rooftop_api.reference` and commit it"
    return write_or_check(args.output, render(), check=args.check, stale_hint=hint)


if __name__ == "__main__":
    sys.exit(main())
