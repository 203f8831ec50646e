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


def _overview() -> list[p.Json]:
    attainment = p.thresholds((None, "red"), (0.9, "orange"), (1, "green"))
    infeasible = p.thresholds((None, "green"), (1, "red"))
    return [
        p.stat("Targets", [Q["targets"]], description="ServingTargets the operator plans."),
        p.stat(
            "SLO attainment",
            [Q["slo_attainment"]],
            unit="percentunit",
            steps=attainment,
            description="Share of targets whose observed latency meets their SLO.",
        ),
        p.stat("Infeasible targets", [Q["infeasible"]], steps=infeasible),
        p.stat("Cost", [Q["cost"]], unit="currencyUSD", description="Planned USD per hour."),
        p.stat("Budget", [Q["budget"]], unit="currencyUSD", description="USD per hour."),
        p.stat("GPUs", [Q["gpus"]], description="GPUs in all plans (replicas x tp)."),
        p.stat("Replicas ready / desired", [Q["replicas_ready"], Q["replicas_desired"]], w=6),
        p.stat(
            "Engine metrics state",
            [Q["metrics_state"]],
            w=6,
            text_mode="value_and_name",
            description="Targets per state of their vLLM metrics (ok, missing, stale, nan).",
        ),
        p.timeseries(
            "Scaling decisions",
            [Q["scaling_decisions"]],
            unit="short",
            bars=True,
            w=6,
            h=4,
        ),
        p.timeseries("Reconciles / s", [Q["reconciles"]], unit="ops", w=6, h=4),
    ]


def _targets_table() -> p.Json:
    columns = [
        ("Feasible", Q["feasible_by_target"], "short"),
        ("SLO met", Q["slo_met_by_target"], "short"),
        ("TPOT observed", Q["observed_tpot_by_target"], "s"),
        ("TPOT SLO", Q["slo_tpot_by_target"], "s"),
        ("Cost $/h", Q["cost_by_target"], "currencyUSD"),
        ("Budget $/h", Q["budget_by_target"], "currencyUSD"),
        ("Replicas desired", Q["replicas_desired_by_target"], "short"),
        ("Replicas ready", Q["replicas_ready_by_target"], "short"),
    ]
    link = {"title": "Open target", "url": TARGET_LINK}
    table = p.table("Targets", columns, links=[link], h=9)
    for override in table["fieldConfig"]["overrides"]:
        if override["matcher"]["options"] in ("Feasible", "SLO met"):
            override["properties"].append({"id": "mappings", "value": [_YES_NO]})
    return table


def _slo() -> list[p.Json]:
    over = p.thresholds((None, "green"), (0.9, "orange"), (1, "red"))
    return [
        _tpot_slo_dashed(
            p.timeseries(
                "TPOT p90 per target vs SLO",
                [Q["tpot_p90_by_target"], Q["slo_tpot_by_target"]],
                unit="s",
                w=12,
                description="vLLM per-request TPOT p90 (solid) and each target's SLO (dashed).",
            )
        ),
        p.bargauge(
            "Observed TPOT / SLO",
            [Q["tpot_over_slo"]],
            unit="percentunit",
            steps=over,
            w=6,
            description="Operator's observed TPOT at the SLO percentile over the bound.",
        ),
        p.timeseries("SLO attainment", [Q["slo_attainment"]], unit="percentunit", w=6),
        _targets_table(),
    ]


def _tpot_slo_dashed(panel: p.Json) -> p.Json:
    """Draw the per-target SLO series dashed (matched by legend suffix)."""
    panel["fieldConfig"]["overrides"].append(
        {
            "matcher": {"id": "byRegexp", "options": ".* SLO$"},
            "properties": [
                {"id": "custom.lineStyle", "value": {"dash": [10, 10], "fill": "dash"}},
                {"id": "custom.fillOpacity", "value": 0},
            ],
        }
    )
    return panel


def _cost_capacity() -> list[p.Json]:
    over = p.thresholds((None, "green"), (0.9, "orange"), (1, "red"))
    gpu_columns = [
        ("GPUs", Q["gpus_by_type"], "short"),
        ("Targets", Q["targets_by_type"], "short"),
        ("Cost $/h", Q["cost_by_type"], "currencyUSD"),
    ]
    return [
        p.timeseries("Cost vs budget", [Q["cost"], Q["budget"]], unit="currencyUSD", w=8),
        p.timeseries("Cost per target", [Q["cost_by_target"]], unit="currencyUSD", w=8),
        p.bargauge("Cost / budget", [Q["cost_over_budget"]], unit="percentunit", steps=over, w=8),
        p.timeseries(
            "Replicas desired / ready",
            [Q["replicas_desired"], Q["replicas_ready"]],
            unit="short",
            w=12,
        ),
        p.table("GPU types", gpu_columns, w=12),
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
        links=[_link_to_target()],
    )


def _link_to_target() -> p.Json:
    return {
        "asDropdown": False,
        "icon": "dashboard",
        "includeVars": True,
        "keepTime": True,
        "tags": [],
        "targetBlank": False,
        "title": "Per-target view",
        "type": "link",
        "url": "/d/rooftop-target/rooftop-target",
    }
