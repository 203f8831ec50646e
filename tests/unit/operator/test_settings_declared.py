"""Every operator setting is declared once, in ``settings.SETTINGS``: the variable the code
reads, the chart value that sets it (which the chart's template passes, its values and
schema define, and docs/operating.md names), the field it lands in and its default, and
the flag that overrides it."""

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


CHART_ENV = {s.env: s.chart for s in settings.SETTINGS if s.chart is not None}


def test_every_variable_the_operator_reads_is_declared() -> None:
    assert _read_variables() == {s.env for s in settings.SETTINGS}


def test_each_setting_lands_in_a_config_field_and_reads_back() -> None:
    """A declared field that does not exist would fail only when a user sets it."""
    for setting in settings.SETTINGS:
        config: Any = settings.configured({})
        for part in setting.field.split("."):
            assert hasattr(config, part), setting.field
            config = getattr(config, part)


def _chart_default(value: str) -> Any:
    node: Any = yaml.safe_load((CHART / "values.yaml").read_text())
    for part in value.split("."):
        node = node[part]
    return node


@pytest.mark.parametrize("setting", [s for s in settings.SETTINGS if s.chart], ids=lambda s: s.env)
def test_the_chart_default_is_the_operators_default(setting: settings.Setting) -> None:
    """One default: what the chart ships, read by the setting's own parser, is the
    config field's default. An empty chart value passes nothing (the field's default); a
    mapping is rendered by the template into another form (a ConfigMap becomes the path
    it is mounted at), which the template tests check."""
    shipped = _chart_default(str(setting.chart))
    if shipped in ("", None) or isinstance(shipped, dict):
        return
    text = str(shipped).lower() if isinstance(shipped, bool) else str(shipped)
    expected: Any = settings.configured({})
    for part in setting.field.split("."):
        expected = getattr(expected, part)
    assert setting.parse(setting.env, text) == expected


def test_the_flags_override_the_environment() -> None:
    environ = {"ROOFTOP_VLLM_IMAGE": "from-env", "ROOFTOP_GPU_INVENTORY": "off"}
    flags = {"--vllm-image": "from-flag", "--gpu-inventory": None}
    values = settings.read_settings(environ, flags)
    assert values == {"vllm_image": "from-flag", "gpu_inventory": False}
    with pytest.raises(ValueError, match="--gpu-inventory"):
        settings.read_settings({}, {"--gpu-inventory": "yes"})


def _lookup(tree: dict[str, Any], dotted: str) -> bool:
    node: Any = tree
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


@pytest.mark.parametrize(("variable", "value"), CHART_ENV.items())
def test_the_chart_sets_each_variable_from_its_declared_value(variable: str, value: str) -> None:
    template = (CHART / "templates" / "deployment.yaml").read_text()
    assert f"- name: {variable}\n" in template
    assert _lookup(yaml.safe_load((CHART / "values.yaml").read_text()), value), value
    schema = json.loads((CHART / "values.schema.json").read_text())
    properties = schema
    for part in value.split("."):
        properties = properties["properties"][part]


@pytest.mark.parametrize("value", CHART_ENV.values())
def test_the_operating_guide_names_each_chart_value(value: str) -> None:
    guide = (ROOT / "docs" / "operating.md").read_text()
    parent = value.rsplit(".", 1)[0]
    assert f"`{value}`" in guide or f"`{parent}.*`" in guide, value
