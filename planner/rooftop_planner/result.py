"""What a search returns: the chosen plan, the losers and why each lost.

Data only: the search decides (``choice``), ``explain`` words it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rooftop_planner.explain import explain_result
from rooftop_planner.fleet import MixedFleet
from rooftop_planner.plan import Plan


@dataclass(frozen=True)
class Rejection:
    """A candidate that lost, and why (category is one of REJECTION_CATEGORIES)."""

    gpu: str
    tp: int
    weight_dtype: str
    kv_dtype: str
    category: str
    detail: str


REJECTION_CATEGORIES = (
    "no engine",
    "no checkpoint",
    "invalid",
    "does not fit",
    "TPOT over SLO",
    "TTFT over SLO",
    "too many replicas",
    "over budget",
)


@dataclass
class SearchResult:
    """What the search found: the plan (None when infeasible) and everything behind it.

    ``reasons`` are the lines a user reads first (``explain`` words them); ``frontier``
    the plans no other beats on both $/hour and TPOT; ``candidates`` every plan that met
    the SLO, in search order.
    """

    feasible: bool
    plan: Plan | None
    alternatives: list[Plan] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    rejections: list[Rejection] = field(default_factory=list)
    frontier: list[Plan] = field(default_factory=list)
    candidates: list[Plan] = field(default_factory=list)
    slo_tpot_ms: float = 0.0
    budget_usd_per_hour: float = 0.0
    # Infeasible only for want of GPU nodes: the plan the whole catalog would give.
    beyond_inventory: Plan | None = None
    # Where the plan's step times come from (``Efficiency.describe``); "" without a plan.
    step_times_from: str = ""
    # Pools of several GPU types that cost less than ``plan`` or serve where no single
    # type does (``fleet.cheapest_mix``): what the operator deploys (``deployed``).
    mixed: MixedFleet | None = None

    @property
    def deployed(self) -> Plan | None:
        """The plan the operator deploys: the mixed fleet where there is one (it costs
        less than the single-type plan, or no single type serves), else the single-type
        plan; None when nothing serves."""
        if self.mixed is not None:
            return self.mixed.plan()
        return self.plan if self.feasible else None

    def to_json(self) -> dict[str, Any]:
        return {
            # what deploys: the single-type plan, or the mix where there is one
            "feasible": self.deployed is not None,
            "plan": self.plan.to_json() if self.plan else None,
            "alternatives": [p.to_json() for p in self.alternatives],
            "reasons": self.reasons,
            "mixed": self.mixed.to_json() if self.mixed else None,
            "frontier": [
                {
                    "gpu": p.gpu,
                    "tp": p.tp,
                    "replicas": p.replicas,
                    "max_num_seqs": p.max_num_seqs,
                    "weight_dtype": p.weight_dtype,
                    "kv_dtype": p.kv_dtype,
                    "usd_per_hour": round(p.usd_per_hour, 3),
                    "tpot_ms": round(p.tpot_ms, 2),
                }
                for p in self.frontier
            ],
        }

    def explain(self) -> str:
        """The choice, the runners-up and every rejection class, in words."""
        return explain_result(self)
