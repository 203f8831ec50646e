"""The vLLM Rooftop deploys is the vLLM its tests run and its flag checks describe.

Three places name it: the operator's default engine image (settings.VLLM_IMAGE, and the
chart's operator.vllmImage that overrides it in a release), the vLLM build the engine
tests install (tests/engine/install-vllm.sh) and the flag table extraArgs are checked
against (catalog/vllm_flags.json, `make vllm-flags`). A bump of one alone would check
flags, or run contract tests, against a vLLM that no pod runs.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from rooftop_operator import settings
from rooftop_planner.vllm_args import load_table

ROOT = Path(__file__).resolve().parents[2]


def image_version(image: str) -> str:
    match = re.fullmatch(r"vllm/vllm-openai:v(\d+\.\d+\.\d+)", image)
    assert match, f"{image} is not a vllm/vllm-openai release tag"
    return match.group(1)


def installed_version() -> str:
    script = (ROOT / "tests/engine/install-vllm.sh").read_text()
    (version,) = re.findall(r"^VLLM_VERSION=(\S+)$", script, flags=re.M)
    return version


def test_the_default_engine_image_is_the_tested_vllm() -> None:
    chart = yaml.safe_load((ROOT / "charts/rooftop/values.yaml").read_text())
    table = load_table().vllm_version
    assert image_version(settings.VLLM_IMAGE) == table, "run `make vllm-flags`"
    assert image_version(chart["operator"]["vllmImage"]) == table
    assert installed_version() == table, "install-vllm.sh installs another vLLM"
