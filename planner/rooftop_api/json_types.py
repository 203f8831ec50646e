"""A parsed manifest's types checked as the API server checks them, before pydantic reads it.

pydantic's lax mode reads YAML's ``true`` as 1 and ``"8"`` as 8; the API server converts
nothing: a CRD's structural schema types every field and ``kubectl apply`` is refused for
a value of another type. ``problems`` walks a document against the JSON Schema pydantic
writes for a model, the schema the CRD is converted from (``rooftop_api.crd``), so the two
agree on every field's type. What the API server does convert, this accepts: an integer
where a number is expected, and a whole float such as ``8.0`` where an integer is (kubectl
sends it as ``8``). Bounds, patterns and enums are left to pydantic, whose rules the CRD
states too.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import yaml

Schema = Mapping[str, Any]

_WORDS = {
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "true or false",
    "object": "a mapping",
    "array": "a list",
    "null": "nothing (null)",
}


def json_type(value: object) -> str:
    """The JSON type a value parsed from YAML has (``bool`` is not a number here, as in
    JSON), or its Python type's name for what JSON has not (a YAML date)."""
    if isinstance(value, bool):
        return "boolean"
    kinds = ((int, "integer"), (float, "number"), (str, "string"), (dict, "object"))
    for kind, name in (*kinds, (list, "array"), (type(None), "null")):
        if isinstance(value, kind):
            return name
    return type(value).__name__


def accepts(expected: str, value: object) -> bool:
    """Whether the API server takes ``value`` where the schema says ``expected``."""
    actual = json_type(value)
    if actual == expected or (expected == "number" and actual == "integer"):
        return True
    return expected == "integer" and isinstance(value, float) and value.is_integer()


def problems(value: object, schema: Schema, path: str = "") -> Iterator[str]:
    """``path: expected ..., got ...; the fix`` for each value of the wrong type in
    ``value``, a document checked against ``schema`` (a pydantic model's JSON Schema, with
    its ``$defs``)."""
    yield from _walk(value, schema, schema.get("$defs", {}), path)


def pruned(value: object, schema: Schema) -> object:
    """``value`` without the fields set to null whose schema does not allow null: the API
    server drops those before it validates and defaults (a structural schema's
    ``nullable: false``), so ``minReplicas: null`` means the default, as on the cluster."""
    return _prune(value, schema, schema.get("$defs", {}))


def _prune(value: object, node: Schema, defs: Schema) -> object:
    options = [o for o in _types(node, defs) if "type" in o]
    if isinstance(value, dict):
        mapping = next((o for o in options if o["type"] == "object"), None)
        if mapping is None:
            return value
        kept = {}
        for key, member in value.items():
            sub = _member(mapping, key)
            if sub is None:  # unknown fields are pydantic's to name
                kept[key] = member
            elif member is not None or _allows_null(sub, defs):
                kept[key] = _prune(member, sub, defs)
        return kept
    if isinstance(value, list):
        array = next((o for o in options if o["type"] == "array" and "items" in o), None)
        return [_prune(v, array["items"], defs) for v in value] if array else value
    return value


def _member(mapping: Schema, key: str) -> Schema | None:
    """The schema of a mapping's field ``key``: its own, else the one every extra key
    has; None for an unknown field (pydantic's to name)."""
    others = mapping.get("additionalProperties")
    fallback = others if isinstance(others, Mapping) else None
    found: Schema | None = mapping.get("properties", {}).get(key, fallback)
    return found


def _allows_null(node: Schema, defs: Schema) -> bool:
    """Whether a field may be null (``X | None``: the CRD's ``nullable: true``); an
    untyped one (any value) may."""
    options = _types(node, defs)
    return any(o.get("type") == "null" or "type" not in o for o in options)


def _resolved(node: Schema, defs: Schema) -> Schema:
    ref = node.get("$ref")
    return _resolved(defs[ref.rsplit("/", 1)[-1]], defs) if ref else node


def _types(node: Schema, defs: Schema) -> list[Schema]:
    """The alternatives a node allows (``X or null`` is two), each resolved."""
    node = _resolved(node, defs)
    return [_resolved(o, defs) for o in node["anyOf"]] if "anyOf" in node else [node]


def _walk(value: object, node: Schema, defs: Schema, path: str) -> Iterator[str]:
    options = _types(node, defs)
    typed = [o for o in options if "type" in o]
    if len(typed) < len(options):  # an untyped alternative (Any): anything goes
        return
    fitting = [o for o in typed if accepts(o["type"], value)]
    if not fitting:
        yield mismatch(path, [o["type"] for o in typed], value)
        return
    yield from _inside(value, fitting[0], defs, path)


def _inside(value: object, node: Schema, defs: Schema, path: str) -> Iterator[str]:
    """The problems of a mapping's or a list's members."""
    if isinstance(value, dict):
        for key, member in value.items():
            sub = _member(node, key)
            if sub is not None:  # unknown fields are pydantic's to name
                yield from _walk(member, sub, defs, f"{path}.{key}" if path else str(key))
    elif isinstance(value, list) and "items" in node:
        for i, member in enumerate(value):
            yield from _walk(member, node["items"], defs, f"{path}[{i}]")


def mismatch(path: str, expected: list[str], value: object) -> str:
    """The message for a value of the wrong type, with what to write instead."""
    wanted = " or ".join(_WORDS.get(t, t) for t in expected if t != "null")
    got = f"the string {value!r}" if isinstance(value, str) else f"{_shown(value)}"
    return f"{path or '(root)'}: expected {wanted}, got {got}; {_fix(expected, value, wanted)}"


def _shown(value: object) -> str:
    if value is None:
        return "null"
    kind = json_type(value)
    text = yaml.safe_dump(value, default_flow_style=True).removesuffix("\n...\n").strip()
    text = text if len(text) <= 60 else text[:57] + "..."  # a whole mapping can be long
    return f"{text} ({'a boolean' if kind == 'boolean' else _WORDS.get(kind, kind)})"


def _fix(expected: list[str], value: object, wanted: str) -> str:
    if expected == ["boolean"] or expected == ["boolean", "null"]:
        return "write true or false, without quotes"
    if isinstance(value, str):
        try:
            unquoted = yaml.safe_load(value)
        except yaml.YAMLError:
            unquoted = value
        if any(accepts(t, unquoted) for t in expected if t != "string"):
            return f"write {value} without quotes"
    if isinstance(value, bool) and ("number" in expected or "integer" in expected):
        return f"YAML's {str(value).lower()} is not a number; give {wanted}"
    if "string" in expected and json_type(value) in ("integer", "number", "boolean"):
        return f'quote it: "{_shown(value).split(" (")[0]}"'
    return f"give {wanted}"
