"""docs/reference.md is generated from the API models; these tests keep the two in step."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, Field, create_model

from rooftop_api import crd, reference
from rooftop_api.spec import ServingTarget, ServingTargetSpec, ServingTargetStatus, Slo


def test_the_committed_page_is_up_to_date(capsys: pytest.CaptureFixture[str]) -> None:
    assert reference.main(["--check"]) == 0, capsys.readouterr().err
    assert reference.DEFAULT_OUTPUT.read_text() == reference.render()


def test_check_fails_on_a_stale_page_and_says_how_to_fix_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    page = tmp_path / "reference.md"
    assert reference.main(["--check", "--output", str(page)]) == 1  # missing
    page.write_text(reference.render().replace("`tpotMs`", "`tpot`"))
    assert reference.main(["--check", "--output", str(page)]) == 1
    assert "run `python -m rooftop_api.reference`" in capsys.readouterr().err
    assert reference.main(["--output", str(page)]) == 0
    assert reference.main(["--check", "--output", str(page)]) == 0


def _spec_with(**fields: Any) -> type[BaseModel]:
    """ServingTargetSpec with one more field, as a changed spec.py would have it."""
    model: type[BaseModel] = create_model("ServingTargetSpec", __base__=ServingTargetSpec, **fields)
    return model


def _manifest(spec: type[BaseModel]) -> type[BaseModel]:
    model: type[BaseModel] = create_model("ServingTarget", __base__=ServingTarget, spec=(spec, ...))
    return model


def test_a_field_added_to_the_models_makes_the_committed_page_stale() -> None:
    added = _spec_with(
        warm_pool_size=(int, Field(default=2, ge=0, le=8, description="Idle replicas kept warm."))
    )
    page = reference.render(_manifest(added))
    assert page != reference.DEFAULT_OUTPUT.read_text()
    row = next(line for line in page.splitlines() if line.startswith("| `warmPoolSize`"))
    assert row == "| `warmPoolSize` | integer | `2` | ≥ 0; ≤ 8 | Idle replicas kept warm. |"


def test_a_renamed_field_makes_the_committed_page_stale() -> None:
    slo = create_model(
        "Slo",
        __base__=BaseModel,
        __config__=Slo.model_config,
        __doc__=Slo.__doc__,
        tpot_bound_ms=(float, Field(gt=0, description="Time per output token bound.")),
    )
    renamed = _spec_with(slo=(slo, ...))
    page = reference.render(_manifest(renamed))
    assert page != reference.DEFAULT_OUTPUT.read_text()
    assert "| `tpotBoundMs` | number | **required** | > 0 |" in page
    assert "`tpotMs`" not in page.split("## `spec.slo`")[1].split("## ")[0]


def _crd_paths(node: dict[str, Any], path: str) -> Iterator[str]:
    """Every field path of the CRD schema, in the page's notation (``[]`` items, ``.*``)."""
    for name, sub in node.get("properties", {}).items():
        here = f"{path}.{name}" if path else name
        yield here
        yield from _crd_paths(sub, here)
        if "items" in sub:
            yield from _crd_paths(sub["items"], f"{here}[]")
        if isinstance(sub.get("additionalProperties"), dict):
            yield from _crd_paths(sub["additionalProperties"], f"{here}.*")


def _page_paths() -> set[str]:
    paths = set()
    for section in reference.build_sections():
        for prefix in section.paths:
            for row in section.rows:
                paths.add(row.name if prefix == reference.ROOT else f"{prefix}.{row.name}")
    return paths


def test_every_field_of_the_crd_is_on_the_page() -> None:
    schema = crd.build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    in_crd = set(_crd_paths(schema, ""))
    on_page = _page_paths()
    assert in_crd - on_page == set(), "fields in the CRD missing from docs/reference.md"
    # the page's extras: the manifest's metadata fields, which the CRD leaves to Kubernetes
    assert on_page - in_crd == {"metadata.name", "metadata.namespace"}


def test_every_field_has_a_type_and_a_description() -> None:
    for section in reference.build_sections():
        assert section.description, section.paths
        for row in section.rows:
            assert row.type and row.description, (section.paths[0], row.name)


def test_notes_only_fill_in_missing_descriptions() -> None:
    """A NOTES entry names a real field whose model has no description of its own; once
    spec.py describes the field, the note must go (one source per description)."""
    schemas: dict[str, Any] = {}
    for model in (ServingTarget, ServingTargetStatus):
        raw = model.model_json_schema(by_alias=True, mode="validation")
        schemas |= raw.pop("$defs", {}) | {model.__name__: raw}
    fields = {
        reference.field_path(section.paths[0], name): prop
        for section in reference.build_sections()
        for name, prop in schemas[section.model]["properties"].items()
    }
    for path in reference.NOTES:
        assert path in fields, f"NOTES names {path}, which is not a field (renamed or moved?)"
        assert "description" not in fields[path], (
            f"{path} has a description in spec.py now: delete its NOTES entry"
        )


def test_links_on_the_page_point_at_its_sections() -> None:
    """mkdocs checks links between pages; links within the page are checked here."""
    page = reference.render()
    anchors = set(re.findall(r"\{#([a-z0-9-]+)\}", page))
    links = set(re.findall(r"\]\(#([^)]+)\)", page))
    assert links and links <= anchors, links - anchors


@pytest.mark.parametrize(
    ("path", "anchor"),
    [("spec.slo", "spec-slo"), ("spec.engine.env[]", "spec-engine-env"),
     ("spec.engine.checkpoints.*", "spec-engine-checkpoints")],
)  # fmt: skip
def test_anchors(path: str, anchor: str) -> None:
    assert reference.anchor(path) == anchor
