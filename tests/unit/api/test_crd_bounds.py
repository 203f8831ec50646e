"""Every ServingTarget the API server accepts is one the operator can store and deploy.

The largest valid spec is computed from the generated CRD schema itself (each string at
its maxLength, each list and map full), as JSON with every character escaped (6 bytes,
the worst case in etcd and in kopf's bookkeeping). A field without a bound fails here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import pytest

from rooftop_api import crd
from rooftop_api.spec import MODEL_CONFIG_BYTES

# etcd refuses a request over 1.5 MiB; the spec leaves room for metadata and status.
SPEC_LIMIT_BYTES = 1024 * 1024
ESCAPED_CHAR_BYTES = 6  # "\u00e9"
NUMBER_BYTES = 24  # the longest float repr
# Free-form objects, whose nested size no OpenAPI keyword bounds: the spec's validator
# checks their JSON size instead (and the CRD bounds their top-level keys).
FREE_FORM = {"spec.modelConfig": MODEL_CONFIG_BYTES}


class Unbounded(AssertionError):
    pass


def _key_length(node: Mapping[str, Any], path: str) -> int:
    for rule in node.get("x-kubernetes-validations", []):
        if found := re.search(r"size\(k\) <= (\d+)", rule["rule"]):
            return int(found.group(1))
    raise Unbounded(f"{path}: map keys have no length rule")


def worst_json_bytes(node: Mapping[str, Any], path: str) -> int:
    """The most bytes ``node``'s value can take as escaped JSON."""
    if node.get("x-kubernetes-preserve-unknown-fields"):
        if path not in FREE_FORM:
            raise Unbounded(f"{path}: free-form object with no size check")
        return FREE_FORM[path]
    kind = node.get("type")
    if kind == "string":
        if "enum" in node:
            return max(len(str(v)) for v in node["enum"]) + 2
        if "maxLength" not in node:
            raise Unbounded(f"{path}: string without maxLength")
        return ESCAPED_CHAR_BYTES * int(node["maxLength"]) + 2
    if kind in ("integer", "number", "boolean"):
        return NUMBER_BYTES
    if kind == "array":
        if "maxItems" not in node:
            raise Unbounded(f"{path}: list without maxItems")
        return int(node["maxItems"]) * (worst_json_bytes(node["items"], f"{path}[]") + 1) + 2
    if "properties" in node:
        fields = node["properties"].items()
        return sum(len(k) + 4 + worst_json_bytes(v, f"{path}.{k}") for k, v in fields) + 2
    if "additionalProperties" in node:
        if "maxProperties" not in node:
            raise Unbounded(f"{path}: map without maxProperties")
        key = ESCAPED_CHAR_BYTES * _key_length(node, path) + 3
        value = worst_json_bytes(node["additionalProperties"], f"{path}{{}}")
        return int(node["maxProperties"]) * (key + value + 1) + 2
    raise Unbounded(f"{path}: object of unknown shape {sorted(node)}")


def spec_schema() -> Mapping[str, Any]:
    version = crd.build_crd()["spec"]["versions"][0]
    schema: Mapping[str, Any] = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    return schema


def test_the_largest_valid_spec_fits_what_the_api_server_stores() -> None:
    assert worst_json_bytes(spec_schema(), "spec") <= SPEC_LIMIT_BYTES


def test_an_unbounded_field_is_caught() -> None:
    with pytest.raises(Unbounded, match="spec.x: string without maxLength"):
        worst_json_bytes({"properties": {"x": {"type": "string"}}}, "spec")
    with pytest.raises(Unbounded, match="map without maxProperties"):
        worst_json_bytes({"additionalProperties": {"type": "string", "maxLength": 1}}, "m")


def test_a_model_config_over_its_size_is_refused_with_the_fix() -> None:
    from pydantic import ValidationError

    from rooftop_api.spec import ServingTargetSpec

    spec = {"model": "m", "slo": {"tpotMs": 50}, "budget": {"usdPerHour": 10},
            "workload": {"requestsPerSecond": 1, "promptTokens": {"mean": 10},
                         "outputTokens": {"mean": 10}},
            "modelConfig": {"id2label": {str(i): "x" * 64 for i in range(1024)}}}  # fmt: skip
    with pytest.raises(ValidationError, match="modelConfig is .* bytes as JSON, over 65536"):
        ServingTargetSpec.model_validate(spec)
