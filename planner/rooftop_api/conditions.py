"""Kubernetes-style status conditions: the one condition type, and how a list is merged.

Conventions (Kubernetes API conventions, "typical status properties"): one entry per
``type``; ``status`` is "True"/"False"/"Unknown"; ``reason`` is a CamelCase word for
machines, ``message`` a sentence for people; ``lastTransitionTime`` moves only when
``status`` changes, so "Ready since" stays meaningful across repeated reconciles.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, Literal

PLANNED: Final = "Planned"
FEASIBLE: Final = "Feasible"
DEPLOYED: Final = "Deployed"
READY: Final = "Ready"
SLO_MET: Final = "SLOMet"
WITHIN_BUDGET: Final = "WithinBudget"
MODEL_CACHED: Final = "ModelCached"
# Display order in `kubectl describe`; unknown types (from other writers) go last.
ORDER: Final = (PLANNED, FEASIBLE, DEPLOYED, READY, SLO_MET, WITHIN_BUDGET, MODEL_CACHED)

Status = Literal["True", "False", "Unknown"]


@dataclass(frozen=True)
class Condition:
    """One desired condition, before timestamps are attached."""

    type: str
    status: Status
    reason: str
    message: str = ""


def now_iso() -> str:
    """RFC 3339 UTC with second precision, the format Kubernetes uses in conditions."""
    return datetime.now(UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def find(conditions: Sequence[Mapping[str, Any]] | None, type_: str) -> Mapping[str, Any] | None:
    """The condition of that type, or None."""
    for cond in conditions or ():
        if cond.get("type") == type_:
            return cond
    return None


def is_true(conditions: Sequence[Mapping[str, Any]] | None, type_: str) -> bool:
    cond = find(conditions, type_)
    return cond is not None and cond.get("status") == "True"


def _entry(
    new: Condition, old: Mapping[str, Any] | None, now: str, generation: int | None
) -> dict[str, Any]:
    """A condition dict; keeps the old transition time while the status is unchanged."""
    unchanged = old is not None and old.get("status") == new.status
    since = old.get("lastTransitionTime") if unchanged and old is not None else None
    entry: dict[str, Any] = {
        "type": new.type,
        "status": new.status,
        "reason": new.reason,
        "message": new.message,
        "lastTransitionTime": since or now,
    }
    if generation is not None:
        entry["observedGeneration"] = generation
    return entry


def merge(
    current: Sequence[Mapping[str, Any]] | None,
    updates: Iterable[Condition],
    *,
    now: str,
    generation: int | None = None,
) -> list[dict[str, Any]]:
    """The full condition list after applying ``updates``; other types are kept as-is.

    Args:
        current: the list in ``status.conditions`` (may be None).
        updates: conditions this writer owns and has just evaluated.
        now: timestamp for conditions whose status changed.
        generation: ``metadata.generation`` the updates were computed from.
    """
    by_type: dict[str, dict[str, Any]] = {str(c["type"]): dict(c) for c in current or ()}
    for new in updates:
        by_type[new.type] = _entry(new, by_type.get(new.type), now, generation)
    rank = {t: i for i, t in enumerate(ORDER)}
    return sorted(by_type.values(), key=lambda c: (rank.get(c["type"], len(ORDER)), c["type"]))
