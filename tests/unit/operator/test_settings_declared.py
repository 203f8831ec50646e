"""Every operator setting read from the environment is reachable by users: declared once
in ``settings.CHART_ENV`` with the chart value that sets it, which the chart's template
passes, its values and schema define, and docs/operating.md names."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from rooftop_operator import settings

ROOT = Path(__file__).resolve().parents[3]
CHART = ROOT / "charts" / "rooftop"
OPERATOR = ROOT / "operator" / "rooftop_operator"


def _read_variables() -> set[str]:
    """Every ROOFTOP_* name the operator's code spells as a string."""
    names: set[str] = set()
    for path in OPERATOR.glob("*.py"):
        names |= set(re.findall(r'"(ROOFTOP_[A-Z0-9_]+)"', path.read_text()))
    return names


def test_every_variable_the_operator_reads_is_declared() -> None:
    assert _read_variables() == set(settings.CHART_ENV) | settings.TEST_ENV


def _lookup(tree: dict[str, Any], dotted: str) -> bool:
    node: Any = tree
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


@pytest.mark.parametrize(("variable", "value"), settings.CHART_ENV.items())
def test_the_chart_sets_each_variable_from_its_declared_value(variable: str, value: str) -> None:
    template = (CHART / "templates" / "deployment.yaml").read_text()
    assert f"- name: {variable}\n" in template
    assert _lookup(yaml.safe_load((CHART / "values.yaml").read_text()), value), value
    schema = json.loads((CHART / "values.schema.json").read_text())
    properties = schema
    for part in value.split("."):
        properties = properties["properties"][part]


@pytest.mark.parametrize("value", settings.CHART_ENV.values())
def test_the_operating_guide_names_each_chart_value(value: str) -> None:
    guide = (ROOT / "docs" / "operating.md").read_text()
    parent = value.rsplit(".", 1)[0]
    assert f"`{value}`" in guide or f"`{parent}.*`" in guide, value
