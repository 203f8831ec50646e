"""Kubernetes-style status conditions: the one condition type, and how a list is merged.

Conventions (Kubernetes API conventions, "typical status properties"): one entry per
``type``; ``status`` is "True"/"False"/"Unknown"; ``reason`` is a CamelCase word for
machines, ``message`` a sentence for people; ``lastTransitionTime`` moves only when
``status`` changes, so "Ready since" stays meaningful across repeated reconciles.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final, Literal

from rooftop_api.spec import ConditionStatus

PLANNED: Final = "Planned"
FEASIBLE: Final = "Feasible"
DEPLOYED: Final = "Deployed"
READY: Final = "Ready"
SLO_MET: Final = "SLOMet"
WITHIN_BUDGET: Final = "WithinBudget"
MODEL_CACHED: Final = "ModelCached"
WORKLOAD_OBSERVED: Final = "WorkloadObserved"
# Display order in `kubectl describe`; unknown types (from other writers) go last.
ORDER: Final = (
    PLANNED,
    FEASIBLE,
    DEPLOYED,
    READY,
    SLO_MET,
    WITHIN_BUDGET,
    WORKLOAD_OBSERVED,
    MODEL_CACHED,
)

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


def find(conditions: Sequence[ConditionStatus] | None, type_: str) -> ConditionStatus | None:
    """The condition of that type, or None."""
    return next((c for c in conditions or () if c.type == type_), None)


def _entry(
    new: Condition, old: ConditionStatus | None, now: str, generation: int | None
) -> ConditionStatus:
    """The stored condition; keeps the old transition time while the status is unchanged."""
    unchanged = old is not None and old.status == new.status
    since = old.last_transition_time if unchanged and old is not None else None
    return ConditionStatus(
        type=new.type,
        status=new.status,
        reason=new.reason,
        message=new.message,
        last_transition_time=since or now,
        observed_generation=generation,
    )


def merge(
    current: Sequence[ConditionStatus] | None,
    updates: Iterable[Condition],
    *,
    now: str,
    generation: int | None = None,
) -> list[ConditionStatus]:
    """The full condition list after applying ``updates``; other types are kept as-is.

    Args:
        current: the list in ``status.conditions`` (may be None).
        updates: conditions this writer owns and has just evaluated.
        now: timestamp for conditions whose status changed.
        generation: ``metadata.generation`` the updates were computed from.
    """
    by_type = {c.type: c for c in current or ()}
    for new in updates:
        by_type[new.type] = _entry(new, by_type.get(new.type), now, generation)
    rank = {t: i for i, t in enumerate(ORDER)}
    return sorted(by_type.values(), key=lambda c: (rank.get(c.type, len(ORDER)), c.type))
