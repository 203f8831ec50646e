"""What a plan's GPUs cost an hour: the GPUs you own or reserved first, then on demand.

A GPU type's price has two tiers. ``spec.pricing.owned[g]`` (the operator's
cluster-wide default fills GPU types the spec does not name: ``with_default``) says that the first
``count`` GPUs of type ``g`` cost ``usdPerGpuHour`` each (0 for hardware already paid
for); every GPU beyond them costs the on-demand price (``spec.pricing.usdPerGpuHour[g]``,
else the catalog's list price):

    cost(n) = p_own · min(n, N_own) + p_demand · max(n − N_own, 0)     USD/h for n GPUs

Without owned GPUs that is the list price times n. The search ranks plans by this cost
and, among plans of equal cost, takes the one with fewer GPUs (``choice.rank``), so a
price of 0 never means "take them all": it means "use these before paying for more".
The feedback loop prices a replica count the same way (``ReplicaPrice``), so its budget
cap and the plan's price agree wherever owned GPUs end.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from rooftop_api.spec import Pricing, ServingTargetSpec
from rooftop_planner.catalog import Catalog, CatalogError

# A budget of exactly n replicas' price must not round down to n - 1.
_BUDGET_SLACK = 1e-9


@dataclass(frozen=True)
class GpuPrice:
    """One GPU type's price tiers.

    Attributes:
        on_demand_usd: USD per GPU-hour for every GPU beyond the owned ones.
        owned: GPUs owned or reserved (the first ones a plan uses).
        owned_usd: USD per GPU-hour of an owned GPU (0: paid for).
    """

    on_demand_usd: float
    owned: int = 0
    owned_usd: float = 0.0

    def usd_per_hour(self, gpus: int) -> float:
        """``cost(n)`` of the module docstring, USD/h."""
        own = min(gpus, self.owned)
        return own * self.owned_usd + (gpus - own) * self.on_demand_usd

    def most_gpus(self, budget_usd_per_hour: float) -> float:
        """The most GPUs ``budget_usd_per_hour`` pays for (``math.inf`` where the GPUs
        it could buy cost nothing), the inverse of ``usd_per_hour``."""
        owned_cost = self.owned * self.owned_usd
        if budget_usd_per_hour < owned_cost:  # so owned_usd > 0
            return budget_usd_per_hour / self.owned_usd + _BUDGET_SLACK
        if self.on_demand_usd <= 0:
            return math.inf
        return self.owned + (budget_usd_per_hour - owned_cost) / self.on_demand_usd + _BUDGET_SLACK

    def describe(self) -> str:
        """``$2.50/GPU-h`` or ``8 owned at $0.00/GPU-h, then $2.50/GPU-h``."""
        demand = f"${self.on_demand_usd:.2f}/GPU-h"
        if not self.owned:
            return demand
        return f"{self.owned} owned at ${self.owned_usd:.2f}/GPU-h, then {demand}"


class PodsPrice(Protocol):
    """What ``n`` pods cost: one shape's (``ReplicaPrice``) or a mixed fleet's
    (``fleet.FleetPrice``), as the loop's budget limit and status price them."""

    def usd_per_hour(self, replicas: int) -> float: ...

    def affordable(self, budget_usd_per_hour: float, at_most: int) -> int: ...

    def describe(self, replicas: int) -> str: ...


@dataclass(frozen=True)
class ReplicaPrice:
    """What ``n`` replicas of a ``tp``-GPU engine cost: ``gpu.usd_per_hour(n · tp)``."""

    gpu: GpuPrice
    tp: int = 1

    @classmethod
    def flat(cls, usd_per_replica_hour: float) -> ReplicaPrice:
        """Every replica at one price (no owned GPUs)."""
        return cls(GpuPrice(usd_per_replica_hour), 1)

    def usd_per_hour(self, replicas: int) -> float:
        """The replicas' cost, USD/h."""
        return self.gpu.usd_per_hour(replicas * self.tp)

    def affordable(self, budget_usd_per_hour: float, at_most: int) -> int:
        """The most replicas (up to ``at_most``) the budget pays for."""
        most = self.gpu.most_gpus(budget_usd_per_hour) / self.tp
        return at_most if most >= at_most else max(int(most), 0)

    def describe(self, replicas: int) -> str:
        """``3 x $2.00/h`` or, across the owned GPUs' end, ``3 replicas of 4 GPU(s):
        8 owned at $0.00/GPU-h, then $2.50/GPU-h``."""
        if not self.gpu.owned:
            return f"{replicas} x ${self.usd_per_hour(1):.2f}/h"
        return f"{replicas} replica(s) of {self.tp} GPU(s): {self.gpu.describe()}"


def gpu_prices(spec: ServingTargetSpec, catalog: Catalog) -> dict[str, GpuPrice]:
    """Every catalog GPU's price for ``spec``: its ``pricing`` over the catalog's list
    prices. A GPU id the catalog lacks is an error, since a typo would otherwise plan on
    list prices without a word."""
    check_pricing(spec.pricing, catalog, "spec.pricing")
    demand = {g: gpu.usd_per_gpu_hour for g, gpu in catalog.gpus.items()}
    demand.update(spec.pricing.usd_per_gpu_hour or {})
    owned = {g: (o.count, o.usd_per_gpu_hour) for g, o in (spec.pricing.owned or {}).items()}
    return {g: GpuPrice(usd, *owned.get(g, (0, 0.0))) for g, usd in demand.items()}


def with_default(spec: ServingTargetSpec, default: Pricing | None) -> ServingTargetSpec:
    """``spec`` with the cluster-wide ``default`` pricing (the operator's) filling the
    GPU types its own ``pricing`` does not name, field by field."""
    if default is None:
        return spec
    own = spec.pricing
    merged = Pricing(
        usd_per_gpu_hour={**(default.usd_per_gpu_hour or {}), **(own.usd_per_gpu_hour or {})}
        or None,
        owned={**(default.owned or {}), **(own.owned or {})} or None,
    )
    return spec.model_copy(update={"pricing": merged})


def check_pricing(pricing: Pricing, catalog: Catalog, where: str) -> None:
    """Raise ``CatalogError`` naming ``where``'s GPU ids the catalog lacks."""
    fields: Mapping[str, Mapping[str, object] | None] = {
        "usdPerGpuHour": pricing.usd_per_gpu_hour,
        "owned": pricing.owned,
    }
    for name, entries in fields.items():
        unknown = sorted(set(entries or {}) - set(catalog.gpus))
        if unknown:
            raise CatalogError(
                f"{where}.{name}: unknown GPU id(s) {', '.join(unknown)}; use catalog "
                f"ids: {', '.join(sorted(catalog.gpus))}"
            )


def replica_price(spec: ServingTargetSpec, catalog: Catalog, gpu_id: str, tp: int) -> ReplicaPrice:
    """What replicas of ``tp`` GPUs of ``gpu_id`` cost for ``spec``."""
    return ReplicaPrice(gpu_prices(spec, catalog)[gpu_id], tp)
