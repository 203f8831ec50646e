"""The CRD is generated from the pydantic models; these tests keep the two in step."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from rooftop_api import crd
from rooftop_api.spec import ServingTarget

INVALID_DIR = Path(__file__).resolve().parents[2] / "e2e" / "manifests" / "invalid"
# Rules only the API server enforces: Kubernetes naming limits of the children.
KUBERNETES_ONLY = {"22-name-too-long.yaml"}


def walk(node: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(node, dict):
        yield path, node
        for key, value in node.items():
            yield from walk(value, f"{path}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from walk(value, f"{path}[{i}]")


def schema() -> dict[str, Any]:
    version = crd.build_crd()["spec"]["versions"][0]
    return dict(version["schema"]["openAPIV3Schema"])


def test_chart_crd_is_up_to_date() -> None:
    assert crd.DEFAULT_OUTPUT.read_text() == crd.render(), (
        "charts/rooftop/crds is stale: run `python -m rooftop_api.crd`"
    )


def test_check_flag_fails_on_a_stale_file(tmp_path: Path) -> None:
    stale = tmp_path / "crd.yaml"
    stale.write_text("# old\n")
    assert crd.main(["--check", "--output", str(stale)]) == 1
    assert crd.main(["--output", str(stale)]) == 0
    assert crd.main(["--check", "--output", str(stale)]) == 0


def test_schema_is_structural() -> None:
    """No JSON-Schema-only constructs; every schema node has a type."""
    for path, node in walk(schema()):
        if path.endswith(".properties") or path.endswith("x-kubernetes-validations"):
            continue
        if "rule" in node:  # a CEL rule, not a schema node
            continue
        assert not {"$ref", "$defs", "anyOf", "oneOf", "allOf", "const", "title"} & node.keys(), (
            path
        )
        assert node.get("additionalProperties") is not False, path
        if "properties" in node or "items" in node or "enum" in node:
            assert "type" in node, path
        assert not isinstance(node.get("exclusiveMinimum"), int | float) or isinstance(
            node.get("exclusiveMinimum"), bool
        ), path


def test_optional_fields_are_nullable_and_free_form_config_is_preserved() -> None:
    spec = schema()["properties"]["spec"]
    assert spec["properties"]["slo"]["properties"]["ttftMs"]["nullable"] is True
    model_config = spec["properties"]["modelConfig"]
    assert model_config["x-kubernetes-preserve-unknown-fields"] is True
    assert model_config["type"] == "object"
    assert spec["required"] == ["model", "slo", "workload", "budget"]


def test_enums_bounds_and_defaults_carry_over() -> None:
    spec = schema()["properties"]["spec"]["properties"]
    percentile = spec["slo"]["properties"]["tpotPercentile"]
    assert percentile["enum"] == ["p50", "p90", "p95", "p99"] and percentile["default"] == "p90"
    tpot = spec["slo"]["properties"]["tpotMs"]
    assert (tpot["minimum"], tpot["exclusiveMinimum"], tpot["maximum"]) == (0, True, 3_600_000)
    assert spec["mode"]["enum"] == ["vllm", "simulated"]
    replicas = spec["constraints"]["properties"]["minReplicas"]
    assert (replicas["minimum"], replicas["default"]) == (0, 1)
    prices = spec["pricing"]["properties"]["usdPerGpuHour"]["additionalProperties"]
    assert prices == {"type": "number", "minimum": 0}


def test_cross_field_rules_are_cel() -> None:
    spec = schema()["properties"]["spec"]["properties"]
    lengths = spec["workload"]["properties"]["promptTokens"]["x-kubernetes-validations"]
    rules = " ".join(r["rule"] for r in lengths)
    assert "self.p90 >= self.mean" in rules and "has(self.histogram)" in rules
    replicas = spec["constraints"]["x-kubernetes-validations"]
    assert replicas[0]["rule"] == "self.minReplicas <= self.maxReplicas"
    assert all(r.get("message") for r in [*lengths, *replicas])


def test_status_subresource_printer_columns_and_names() -> None:
    generated = crd.build_crd()
    version = generated["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    columns = [c["name"] for c in version["additionalPrinterColumns"]]
    assert columns == ["Model", "GPU", "TP", "Replicas", "Batch", "TPOT", "SLO", "$/h", "Ready",
                       "Age"]  # fmt: skip
    names = generated["spec"]["names"]
    assert (names["kind"], names["plural"], names["shortNames"]) == (
        "ServingTarget", "servingtargets", ["st"]
    )  # fmt: skip
    assert generated["spec"]["scope"] == "Namespaced"
    assert generated["metadata"]["name"] == "servingtargets.rooftop.dev"


def test_printer_columns_point_at_status_fields() -> None:
    status = schema()["properties"]["status"]["properties"]
    for column in crd.PRINTER_COLUMNS:
        parts = column["jsonPath"].lstrip(".").split(".")
        if parts[0] != "status":
            continue
        node: dict[str, Any] = {"properties": status}
        for part in parts[1:]:
            node = node["properties"][part]
        assert node["type"] in {"string", "integer", "number"}, column


def test_conditions_are_a_map_keyed_by_type() -> None:
    conditions = schema()["properties"]["status"]["properties"]["conditions"]
    assert conditions["x-kubernetes-list-type"] == "map"
    assert conditions["x-kubernetes-list-map-keys"] == ["type"]
    assert "type" in conditions["items"]["required"]


@pytest.mark.parametrize("path", sorted(INVALID_DIR.glob("*.yaml")), ids=lambda p: p.name)
def test_invalid_manifests_are_invalid_for_pydantic_too(path: Path) -> None:
    """Every manifest the API server must reject, `rooftop plan` rejects as well, so the
    CRD and the models agree (the e2e test checks the API server side)."""
    if path.name in KUBERNETES_ONLY:
        pytest.skip("a Kubernetes naming rule with no pydantic counterpart")
    with pytest.raises(ValidationError):
        ServingTarget.model_validate(yaml.safe_load(path.read_text()))


def test_there_are_enough_invalid_manifests() -> None:
    manifests = sorted(INVALID_DIR.glob("*.yaml"))
    assert len(manifests) >= 15
    for path in manifests:
        assert path.read_text().startswith("# expect: "), path.name
