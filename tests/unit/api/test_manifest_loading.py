"""rooftop_api.manifest: standard input, several documents, duplicate keys, target names."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest

from rooftop_api import crd
from rooftop_api.manifest import ManifestError, load_all, load_target
from rooftop_api.spec import MAX_NAME_LENGTH, NAME_PATTERN, name_problem

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "chat-llama-3.1-8b.yaml"


def test_standard_input_is_dash(monkeypatch: pytest.MonkeyPatch) -> None:
    stdin = io.TextIOWrapper(io.BytesIO(EXAMPLE.read_bytes()))
    monkeypatch.setattr(sys, "stdin", stdin)
    (loaded,) = load_all(["-"])
    assert loaded.source == "<stdin>" and loaded.target is not None


def test_every_target_document_with_its_own_outcome(tmp_path: Path) -> None:
    path = tmp_path / "bundle.yaml"
    bad = EXAMPLE.read_text().replace("tpotMs: 25", "tpotMs: -1")
    other = "apiVersion: v1\nkind: Secret\nmetadata: {name: s}\n"
    path.write_text("---\n".join([EXAMPLE.read_text(), other, bad]))
    first, third = load_all([path])
    assert first.target is not None and first.source == f"{path} (document 1)"
    assert third.target is None and third.error.startswith(f"{path} (document 3): invalid")
    assert load_target(path).metadata.name == "chat-llama-8b"


def test_a_duplicate_key_names_its_line(tmp_path: Path) -> None:
    path = tmp_path / "twice.yaml"
    path.write_text("apiVersion: rooftop.dev/v1alpha1\nkind: ServingTarget\nkind: Other\n")
    with pytest.raises(ManifestError, match=rf"{path} line 3: duplicate key 'kind'"):
        load_target(path)


@pytest.mark.parametrize(
    ("name", "fix"),
    [("My_Chat", "my-chat"), ("9lives", "lives"), ("a.b", "a-b"), ("x-", "x"), ("-", "my-target")],
)
def test_a_bad_name_gets_a_good_one_to_use(name: str, fix: str) -> None:
    problem = name_problem(name)
    assert problem is not None and problem.endswith(f"e.g. {fix!r}")
    assert name_problem(fix) is None


def test_the_loader_and_the_crd_check_the_same_names() -> None:
    (rule,) = crd.ROOT_RULES
    assert NAME_PATTERN in rule["rule"] and f"<= {MAX_NAME_LENGTH}" in rule["rule"]
    assert name_problem("a" * MAX_NAME_LENGTH) is None
    assert name_problem("a" * (MAX_NAME_LENGTH + 1)) is not None
