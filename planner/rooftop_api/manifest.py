"""Reading ServingTarget manifests with errors that name the field and the fix."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from rooftop_api.spec import API_VERSION, KIND, ServingTarget


class ManifestError(ValueError):
    """The manifest cannot be used; ``str()`` is the whole message for the user."""


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
        lines.append(f"{where}: {message}")
    return "\n".join(lines)


def parse_target(document: Any, source: str = "manifest") -> ServingTarget:
    if not isinstance(document, dict):
        raise ManifestError(
            f"{source}: expected a YAML mapping with apiVersion, kind, metadata, spec"
        )
    if document.get("kind") != KIND or document.get("apiVersion") != API_VERSION:
        raise ManifestError(
            f"{source}: expected apiVersion: {API_VERSION} and kind: {KIND}, got "
            f"apiVersion: {document.get('apiVersion')!r}, kind: {document.get('kind')!r}"
        )
    try:
        return ServingTarget.model_validate(document)
    except ValidationError as err:
        raise ManifestError(
            f"{source}: invalid ServingTarget\n{format_validation_error(err)}"
        ) from err


def load_target(path: str | Path) -> ServingTarget:
    """Load one ServingTarget from a YAML file (the first ServingTarget of a multi-doc file)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise ManifestError(f"{path}: cannot read ({err.strerror})") from err
    except UnicodeDecodeError as err:
        raise ManifestError(f"{path}: not a UTF-8 text file ({err.reason}); expected a "
                            "ServingTarget manifest in YAML") from None  # fmt: skip
    try:
        documents = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as err:
        raise ManifestError(f"{path}: malformed YAML: {err}") from err
    if not documents:
        raise ManifestError(f"{path}: empty file; expected a ServingTarget manifest")
    targets = [d for d in documents if isinstance(d, dict) and d.get("kind") == KIND]
    return parse_target(targets[0] if targets else documents[0], str(path))
