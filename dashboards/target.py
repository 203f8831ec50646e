"""Per-target view: one ServingTarget's latency against its SLO, load, plan and cost."""

from __future__ import annotations

from typing import Final

from dashboards import panels as p
from dashboards.queries import MODEL_NAME_VALUES, NAMESPACE_VALUES, TARGET_VALUES
from dashboards.queries import TARGET_QUERIES as Q

UID: Final = "rooftop-target"

_PCT: Final = ("p50", "p90", "p99")


def _summary() -> list[p.Json]:
    met = p.value_map({"1": ("Met", "green"), "0": ("Violated", "red")})
    feasible = p.value_map({"1": ("Feasible", "green"), "0": ("Infeasible", "red")})
    calibration = p.thresholds((None, "orange"), (0.8, "green"), (1.25, "orange"))
    return [
        p.stat("SLO", [Q["slo_met"]], mappings=[met], w=3),
        p.stat("Plan", [Q["feasible"]], mappings=[feasible], w=3),
        p.stat("GPU", [Q["gpus"]], text_mode="value_and_name", w=3, description="GPUs by type."),
        p.stat("Replicas ready / desired", [Q["replicas_ready"], Q["replicas_desired"]], w=3),
        p.stat("Cost $/h", [Q["cost"]], unit="currencyUSD", w=3),
        p.stat("Budget $/h", [Q["budget"]], unit="currencyUSD", w=3),
        p.stat(
            "Calibration factor",
            [Q["calibration"]],
            steps=calibration,
            decimals=2,
            w=3,
            description="Observed over predicted decode step time (1 = the model is right).",
        ),
        p.stat("Engine metrics", [Q["metrics_state"]], text_mode="name", w=3),
    ]


def _latency() -> list[p.Json]:
    tpot = [Q[f"tpot_{x}"] for x in _PCT]
    itl = [Q[f"itl_{x}"] for x in _PCT]
    ttft = [Q[f"ttft_{x}"] for x in _PCT]
    return [
        p.timeseries(
            "TPOT (per-request time per output token)",
            [*tpot, Q["slo_tpot"]],
            unit="s",
            w=8,
            description="vllm:request_time_per_output_token_seconds quantiles; dashed: SLO.",
        ),
        p.timeseries(
            "Inter-token latency",
            [*itl, Q["slo_tpot"]],
            unit="s",
            w=8,
            description="vllm:inter_token_latency_seconds quantiles; dashed: TPOT SLO.",
        ),
        p.timeseries(
            "TTFT",
            [*ttft, Q["slo_ttft"]],
            unit="s",
            w=8,
            description="vllm:time_to_first_token_seconds quantiles; dashed: SLO if set.",
        ),
        p.timeseries(
            "TPOT predicted vs observed",
            [Q["predicted_tpot"], Q["observed_tpot"], Q["slo_tpot"]],
            unit="s",
            w=8,
            description="Planner's prediction and the operator's observation at the SLO "
            "percentile.",
        ),
        p.timeseries(
            "TTFT predicted vs observed",
            [Q["predicted_ttft"], Q["observed_ttft"], Q["slo_ttft"]],
            unit="s",
            w=8,
        ),
        p.timeseries(
            "Calibration factor",
            [Q["calibration"]],
            unit="short",
            min_value=None,
            w=8,
            description="Observed over predicted decode step time; the planner scales its "
            "step time by it when re-planning.",
        ),
        p.timeseries(
            "Request latency",
            [Q["e2e_p90"], Q["e2e_p99"], Q["queue_p90"]],
            unit="s",
            w=24,
            h=6,
        ),
    ]


def _load() -> list[p.Json]:
    return [
        p.timeseries(
            "Tokens / s",
            [Q["generation_tokens"], Q["prompt_tokens"]],
            unit="short",
            w=8,
        ),
        p.timeseries("Finished requests / s", [Q["requests"]], unit="reqps", w=8),
        p.timeseries("Requests running / waiting", [Q["running"], Q["waiting"]], unit="short", w=8),
        p.timeseries(
            "KV cache usage",
            [Q["kv_cache_max"], Q["kv_cache_avg"]],
            unit="percentunit",
            max_value=1,
            w=8,
            description="Max and mean over the target's engines.",
        ),
        p.timeseries("Preemptions / s", [Q["preemptions"]], unit="short", w=8),
        p.timeseries(
            "Prefix cache hit ratio",
            [Q["prefix_cache_hit_ratio"]],
            unit="percentunit",
            max_value=1,
            w=8,
        ),
    ]


def _scaling() -> list[p.Json]:
    return [
        p.timeseries(
            "Replicas desired / ready",
            [Q["replicas_desired"], Q["replicas_ready"]],
            unit="short",
            w=8,
        ),
        p.timeseries(
            "Scaling decisions",
            [Q["scaling_decisions"]],
            unit="short",
            bars=True,
            w=8,
            description="Decisions per interval by direction and reason.",
        ),
        p.timeseries("Cost vs budget", [Q["cost"], Q["budget"]], unit="currencyUSD", w=8),
    ]


def build() -> p.Json:
    """The per-target dashboard (uid ``rooftop-target``)."""
    sections = [
        ("Summary", _summary()),
        ("Latency against the SLO", _latency()),
        ("Load", _load()),
        ("Scaling and cost", _scaling()),
    ]
    variables = [
        p.datasource_variable(),
        p.query_variable("namespace", "Namespace", NAMESPACE_VALUES),
        p.query_variable("target", "ServingTarget", TARGET_VALUES),
        p.query_variable("model_name", "Model", MODEL_NAME_VALUES, include_all=True),
    ]
    events = p.prometheus_annotation(
        "Scaling decisions",
        Q["scaling_events"],
        title="scale {{direction}}",
        text="{{reason}}",
    )
    return p.dashboard(
        uid=UID,
        title="Rooftop / ServingTarget",
        description="One ServingTarget: vLLM latency against its SLO, load, plan and cost.",
        panels=p.layout(sections),
        variables=variables,
        annotations=[events],
        links=[_link_to_fleet()],
    )


def _link_to_fleet() -> p.Json:
    return {
        "asDropdown": False,
        "icon": "dashboard",
        "includeVars": False,
        "keepTime": True,
        "tags": [],
        "targetBlank": False,
        "title": "Fleet",
        "type": "link",
        "url": "/d/rooftop-fleet/rooftop-fleet",
    }
