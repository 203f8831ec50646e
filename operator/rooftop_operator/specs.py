"""Turn a ServingTarget body (kopf's dict views) into typed values, once.

Handlers receive loosely-typed mappings; everything past this module works with the
pydantic ``ServingTargetSpec`` and the small ``TargetRef`` identity below, so builders and
control logic never index raw dicts. A spec pydantic rejects becomes a ``SpecError``
whose message lists each bad field by its YAML path, for a condition message.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from rooftop_api.spec import API_VERSION, KIND, ServingTargetSpec
from rooftop_operator.errors import OperatorError


class SpecError(OperatorError, ValueError):
    """The spec is invalid; ``str(err)`` names every offending field."""


@dataclass(frozen=True)
class TargetRef:
    """Identity of one ServingTarget: enough to name, own and find its children."""

    name: str
    namespace: str
    uid: str
    generation: int = 0

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> TargetRef:
        meta = body["metadata"]
        return cls(
            name=str(meta["name"]),
            namespace=str(meta["namespace"]),
            uid=str(meta["uid"]),
            generation=int(meta.get("generation") or 0),
        )

    def owner_reference(self) -> dict[str, Any]:
        """The ownerReference children carry, so deleting the target garbage-collects
        them. ``controller`` marks the target as *the* manager of the child."""
        return {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }


def _plain(value: Any) -> Any:
    """kopf hands out read-only mapping views; pydantic wants plain dicts and lists."""
    return json.loads(json.dumps(value, default=dict))


def _location(loc: tuple[int | str, ...]) -> str:
    path = "spec"
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else f".{part}"
    return path


def format_errors(err: ValidationError) -> str:
    """``spec.slo.tpotMs: Input should be greater than 0; spec.budget: Field required``."""
    parts = [f"{_location(e['loc'])}: {e['msg']}" for e in err.errors(include_url=False)]
    return "; ".join(parts)


def parse_spec(spec: Mapping[str, Any]) -> ServingTargetSpec:
    """Validate a ServingTarget's ``spec`` with the same models ``rooftop plan`` uses."""
    try:
        return ServingTargetSpec.model_validate(_plain(dict(spec)))
    except ValidationError as err:
        raise SpecError(format_errors(err)) from err


def slo_text(spec: ServingTargetSpec) -> str:
    """The SLO in a few characters for the printer column: ``p90 TPOT<=50ms``."""
    slo = spec.slo
    text = f"{slo.tpot_percentile.value} TPOT<={slo.tpot_ms:g}ms"
    if slo.ttft_ms is not None:
        text += f", {slo.ttft_percentile.value} TTFT<={slo.ttft_ms:g}ms"
    return text
