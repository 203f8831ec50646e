"""Reading ServingTarget manifests with errors that name the field and the fix.

A manifest path may be ``-`` (standard input) and a file may hold several YAML
documents: ``load_all`` gives one entry per ServingTarget document, each with its target
or the message why it is not one, so a command can go on with the others. Documents of
other kinds (a Namespace or Secret in the same bundle) are skipped. A mapping that gives
a key twice is an error naming the line: YAML itself would keep the last value silently.
Every field's type is checked as the API server checks it (``json_types``): ``true``
is not a number, nor ``"8"`` an integer, though pydantic alone would read them as 1 and 8.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from rooftop_api import json_types
from rooftop_api.errors import ApiError
from rooftop_api.spec import API_VERSION, KIND, ServingTarget

STDIN = "-"
STDIN_NAME = "<stdin>"


class ManifestError(ApiError):
    """The manifest cannot be used; ``str()`` is the whole message for the user."""


class _DuplicateKey(yaml.YAMLError, ApiError):
    """A mapping gives ``key`` twice; ``line`` (1-based) is the second one. A YAMLError,
    so every reader of StrictLoader's YAML (manifests, catalogs, node lists) reports it
    with its other YAML errors; an ApiError, since the input is the user's."""

    def __init__(self, key: object, line: int) -> None:
        super().__init__(f"line {line}: duplicate key {key!r}")
        self.key, self.line = key, line


class StrictLoader(yaml.SafeLoader):
    """PyYAML's SafeLoader that refuses a mapping giving the same key twice."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Hashable, Any]:
        """Check the mapping's own keys (merge keys ``<<`` may be overridden), then build it."""
        seen: set[object] = set()
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag.endswith(":merge"):
                continue
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise _DuplicateKey(key, key_node.start_mark.line + 1)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def format_validation_error(err: ValidationError, prefix: str = "") -> str:
    """One line per problem: ``spec.slo.tpotMs: Input should be greater than 0``."""
    lines = []
    for problem in err.errors():
        path = ".".join(str(part) for part in problem["loc"])
        where = f"{prefix}{path}" if path else prefix.rstrip(".") or "(root)"
        message = problem["msg"]
        if problem["type"] == "extra_forbidden":
            message = "unknown field; check its spelling (fields are camelCase)"
        elif problem["type"] == "missing":
            message = "required field is missing"
        elif problem["type"] == "value_error":  # our validators' own words, no prefix
            message = str(problem.get("ctx", {}).get("error", message))
        lines.append(f"{where}: {message}")
    return "\n".join(lines)


def parse_target(document: object, source: str = "manifest") -> ServingTarget:
    """Validate one parsed YAML document as a ServingTarget (ManifestError if it is not)."""
    if not isinstance(document, dict):
        raise ManifestError(
            f"{source}: expected a YAML mapping with apiVersion, kind, metadata, spec"
        )
    if document.get("kind") != KIND or document.get("apiVersion") != API_VERSION:
        raise ManifestError(
            f"{source}: expected apiVersion: {API_VERSION} and kind: {KIND}, got "
            f"apiVersion: {document.get('apiVersion')!r}, kind: {document.get('kind')!r}"
        )
    document = json_types.pruned(document, _target_schema())
    wrong_types = list(json_types.problems(document, _target_schema()))
    if wrong_types:
        raise ManifestError(f"{source}: invalid ServingTarget\n" + "\n".join(wrong_types))
    try:
        return ServingTarget.model_validate(document)
    except ValidationError as err:
        raise ManifestError(
            f"{source}: invalid ServingTarget\n{format_validation_error(err)}"
        ) from err


@functools.cache
def _target_schema() -> dict[str, Any]:
    """The JSON Schema the CRD is converted from: its types are what the API server checks
    (pydantic's lax mode alone would read ``true`` as 1 and ``"8"`` as 8)."""
    return ServingTarget.model_json_schema(by_alias=True, mode="validation")


def read_text(path: str | Path) -> tuple[str, str]:
    """(name for messages, text) of a manifest file, or of standard input for ``-``."""
    name = STDIN_NAME if str(path) == STDIN else str(path)
    try:
        data = sys.stdin.buffer.read() if str(path) == STDIN else Path(path).read_bytes()
    except OSError as err:
        raise ManifestError(f"{name}: cannot read ({err.strerror})") from err
    try:
        return name, data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ManifestError(
            f"{name}: not a UTF-8 text file ({err.reason}); expected a "
            "ServingTarget manifest in YAML"
        ) from None


def parse_documents(text: str, name: str) -> list[tuple[str, object]]:
    """The non-empty YAML documents of ``text``, each with its name for messages
    (``x.yaml (document 2)`` when there are several)."""
    try:
        documents = list(yaml.load_all(text, Loader=StrictLoader))
    except _DuplicateKey as err:
        raise ManifestError(
            f"{name} line {err.line}: duplicate key {err.key!r}; give each "
            "field once (YAML would keep only the last)"
        ) from None
    except yaml.YAMLError as err:
        raise ManifestError(f"{name}: malformed YAML: {err}") from err
    if not any(d is not None for d in documents):
        raise ManifestError(f"{name}: empty file; expected a ServingTarget manifest")
    several = len(documents) > 1
    return [
        (f"{name} (document {i})" if several else name, doc)
        for i, doc in enumerate(documents, 1)
        if doc is not None
    ]


def _is_ours(document: object) -> bool:
    """A document meant as a ServingTarget: its kind, or Rooftop's API group."""
    if not isinstance(document, dict):
        return False
    api = str(document.get("apiVersion") or "")
    return document.get("kind") == KIND or api.startswith(API_VERSION.split("/")[0] + "/")


def target_documents(path: str | Path) -> list[tuple[str, object]]:
    """The documents of a manifest meant as ServingTargets (if none is, the first one,
    so that parsing it says what is wrong)."""
    name, text = read_text(path)
    documents = parse_documents(text, name)
    return [d for d in documents if _is_ours(d[1])] or documents[:1]


@dataclass(frozen=True)
class Loaded:
    """One ServingTarget document's outcome: its target, or why it is not one."""

    source: str
    target: ServingTarget | None = None
    error: str = ""


def _load_file(path: str | Path) -> list[Loaded]:
    """Every ServingTarget of one file; a file that cannot be read is one error entry."""
    try:
        documents = target_documents(path)
    except ManifestError as err:
        return [Loaded(STDIN_NAME if str(path) == STDIN else str(path), error=str(err))]
    out = []
    for source, document in documents:
        try:
            out.append(Loaded(source, target=parse_target(document, source)))
        except ManifestError as err:
            out.append(Loaded(source, error=str(err)))
    return out


def load_all(paths: Sequence[str | Path]) -> list[Loaded]:
    """Every ServingTarget document of every path, in order (``-``: standard input,
    which can be read once)."""
    out: list[Loaded] = []
    for i, path in enumerate(paths):
        if str(path) == STDIN and STDIN in (str(p) for p in paths[:i]):
            out.append(Loaded(STDIN_NAME, error="- (standard input) can be given only once"))
            continue
        out += _load_file(path)
    return out


def load_target(path: str | Path) -> ServingTarget:
    """Load one ServingTarget from a YAML file (the first ServingTarget of a multi-doc file)."""
    source, document = target_documents(path)[0]
    return parse_target(document, source)
