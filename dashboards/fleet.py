"""Fleet overview: every ServingTarget's SLO, cost, capacity and feasibility at once."""

from __future__ import annotations

from typing import Final

from dashboards import panels as p
from dashboards.queries import FLEET_QUERIES as Q
from dashboards.queries import NAMESPACE_VALUES

UID: Final = "rooftop-fleet"
TARGET_LINK: Final = (
    "/d/rooftop-target/rooftop-target?${datasource:queryparam}"
    "&var-namespace=${__data.fields.namespace}&var-target=${__data.fields.name}"
)

_YES_NO: Final = p.value_map({"1": ("Yes", "green"), "0": ("No", "red")})
_ATTAINMENT: Final = p.thresholds((None, "red"), (0.9, "orange"), (1, "green"))
_INFEASIBLE: Final = p.thresholds((None, "green"), (1, "red"))


def _overview() -> list[p.Json]:
    return [
        p.stat("Targets", [Q["targets"]], description="ServingTargets the operator plans."),
        p.stat(
            "SLO attainment",
            [Q["slo_attainment"]],
            unit="percentunit",
            steps=_ATTAINMENT,
            description="Share of targets whose observed latency meets their SLO.",
        ),
        p.stat("Infeasible targets", [Q["infeasible"]], steps=_INFEASIBLE),
        p.money("Cost", Q["cost"], description="Planned USD per hour."),
        p.money("Budget", Q["budget"], description="USD per hour."),
        p.stat("GPUs", [Q["gpus"]], description="GPUs in all plans (replicas x tp)."),
        p.replicas_now(Q["replicas_ready"], Q["replicas_desired"], w=6),
        p.stat(
            "Engine metrics state",
            [Q["metrics_state"]],
            w=6,
            text_mode="value_and_name",
            description="Targets per state of their vLLM metrics (ok, missing, stale, nan).",
        ),
        p.scaling_decisions(Q["scaling_decisions"], w=6, h=4),
        p.timeseries("Reconciles / s", [Q["reconciles"]], unit="ops", w=6, h=4),
    ]


def _slo() -> list[p.Json]:
    return [
        p.latency(
            "TPOT p90 per target vs SLO",
            [Q["tpot_p90_by_target"], Q["slo_tpot_by_target"]],
            w=12,
            dashed=".* SLO$",
            description="vLLM per-request TPOT p90 (solid) and each target's SLO (dashed).",
        ),
        p.over_limit(
            "Observed TPOT / SLO",
            Q["tpot_over_slo"],
            w=6,
            description="Operator's observed TPOT at the SLO percentile over the bound.",
        ),
        p.timeseries("SLO attainment", [Q["slo_attainment"]], unit="percentunit", w=6),
        p.table(
            "Targets",
            [
                ("Feasible", Q["feasible_by_target"], "short"),
                ("SLO met", Q["slo_met_by_target"], "short"),
                ("TPOT observed", Q["observed_tpot_by_target"], "s"),
                ("TPOT SLO", Q["slo_tpot_by_target"], "s"),
                ("Cost $/h", Q["cost_by_target"], "currencyUSD"),
                ("Budget $/h", Q["budget_by_target"], "currencyUSD"),
                ("Replicas desired", Q["replicas_desired_by_target"], "short"),
                ("Replicas ready", Q["replicas_ready_by_target"], "short"),
            ],
            links=[{"title": "Open target", "url": TARGET_LINK}],
            column_mappings={"Feasible": _YES_NO, "SLO met": _YES_NO},
            h=9,
        ),
    ]


def _cost_capacity() -> list[p.Json]:
    return [
        p.cost_vs_budget(Q["cost"], Q["budget"], w=8),
        p.timeseries("Cost per target", [Q["cost_by_target"]], unit="currencyUSD", w=8),
        p.over_limit("Cost / budget", Q["cost_over_budget"], w=8),
        p.replicas(Q["replicas_desired"], Q["replicas_ready"], w=12),
        p.table(
            "GPU types",
            [
                ("GPUs", Q["gpus_by_type"], "short"),
                ("Targets", Q["targets_by_type"], "short"),
                ("Cost $/h", Q["cost_by_type"], "currencyUSD"),
            ],
            w=12,
        ),
    ]


def build() -> p.Json:
    """The fleet dashboard (uid ``rooftop-fleet``)."""
    sections = [("Overview", _overview()), ("SLO", _slo()), ("Cost and capacity", _cost_capacity())]
    return p.dashboard(
        uid=UID,
        title="Rooftop / Fleet",
        description="All ServingTargets: SLO attainment, cost against budget, capacity.",
        panels=p.layout(sections),
        variables=[
            p.datasource_variable(),
            p.query_variable(
                "namespace", "Namespace", NAMESPACE_VALUES, include_all=True, multi=True
            ),
        ],
        links=[p.dashboard_link("Per-target view", "rooftop-target", include_vars=True)],
    )
