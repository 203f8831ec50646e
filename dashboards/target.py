"""Per-target view: one ServingTarget's latency against its SLO, load, plan and cost."""

from __future__ import annotations

from typing import Final

from dashboards import panels as p
from dashboards.queries import MODEL_NAME_VALUES, NAMESPACE_VALUES, TARGET_VALUES, Query
from dashboards.queries import TARGET_QUERIES as Q

UID: Final = "rooftop-target"

_PCT: Final = ("p50", "p90", "p99")
_MET: Final = p.value_map({"1": ("Met", "green"), "0": ("Violated", "red")})
_FEASIBLE: Final = p.value_map({"1": ("Feasible", "green"), "0": ("Infeasible", "red")})
_CALIBRATION: Final = p.thresholds((None, "orange"), (0.8, "green"), (1.25, "orange"))


def _quantiles(histogram: str) -> list[Query]:
    """The p50/p90/p99 queries of one vLLM histogram (``tpot``, ``itl``, ``ttft``)."""
    return [Q[f"{histogram}_{x}"] for x in _PCT]


def _summary() -> list[p.Json]:
    return [
        p.stat("SLO", [Q["slo_met"]], mappings=[_MET], w=3),
        p.stat("Plan", [Q["feasible"]], mappings=[_FEASIBLE], w=3),
        p.stat("GPU", [Q["gpus"]], text_mode="value_and_name", w=3, description="GPUs by type."),
        p.replicas_now(Q["replicas_ready"], Q["replicas_desired"], w=3),
        p.money("Cost $/h", Q["cost"], w=3),
        p.money("Budget $/h", Q["budget"], w=3),
        p.stat(
            "Calibration factor",
            [Q["calibration"]],
            steps=_CALIBRATION,
            decimals=2,
            w=3,
            description="Observed over predicted decode step time (1 = the model is right).",
        ),
        p.stat("Engine metrics", [Q["metrics_state"]], text_mode="name", w=3),
    ]


def _latency() -> list[p.Json]:
    return [
        p.latency(
            "TPOT (per-request time per output token)",
            [*_quantiles("tpot"), Q["slo_tpot"]],
            description="vllm:request_time_per_output_token_seconds quantiles; dashed: SLO.",
        ),
        p.latency(
            "Inter-token latency",
            [*_quantiles("itl"), Q["slo_tpot"]],
            description="vllm:inter_token_latency_seconds quantiles; dashed: TPOT SLO.",
        ),
        p.latency(
            "TTFT",
            [*_quantiles("ttft"), Q["slo_ttft"]],
            description="vllm:time_to_first_token_seconds quantiles; dashed: SLO if set.",
        ),
        p.latency(
            "TPOT predicted vs observed",
            [Q["predicted_tpot"], Q["observed_tpot"], Q["slo_tpot"]],
            description="Planner's prediction and the operator's observation at the SLO "
            "percentile.",
        ),
        p.latency(
            "TTFT predicted vs observed", [Q["predicted_ttft"], Q["observed_ttft"], Q["slo_ttft"]]
        ),
        p.timeseries(
            "Calibration factor and latency trim",
            [Q["calibration"], Q["trim"]],
            unit="short",
            min_value=None,
            w=8,
            description="Observed over predicted decode step time: the planner scales its "
            "step time by it when re-planning. Latency trim: the multiplier on the rate "
            "the planner sizes for, learned from the share of requests within the TPOT "
            "bound (above 1: the planner's capacity was optimistic).",
        ),
        p.latency("Request latency", [Q["e2e_p90"], Q["e2e_p99"], Q["queue_p90"]], w=24, h=6),
    ]


def _load() -> list[p.Json]:
    return [
        p.timeseries("Tokens / s", [Q["generation_tokens"], Q["prompt_tokens"]], unit="short", w=8),
        p.timeseries("Finished requests / s", [Q["requests"]], unit="reqps", w=8),
        p.timeseries("Requests running / waiting", [Q["running"], Q["waiting"]], unit="short", w=8),
        p.fraction(
            "KV cache usage",
            [Q["kv_cache_max"], Q["kv_cache_avg"]],
            description="Max and mean over the target's engines.",
        ),
        p.timeseries("Preemptions / s", [Q["preemptions"]], unit="short", w=8),
        p.fraction("Prefix cache hit ratio", [Q["prefix_cache_hit_ratio"]]),
        p.timeseries(
            "Speculative decoding: tokens per draft",
            [Q["drafted_per_draft"], Q["accepted_per_draft"]],
            unit="short",
            w=8,
            description="Draft tokens each verification step carried, and those the model "
            "accepted (empty where the engines do not speculate). The loop solves the "
            "per-token acceptance from the two.",
        ),
        p.fraction(
            "Speculative decoding: accepted by draft position",
            [Q["accepted_by_position"], Q["drafted_share"]],
            description="Share of verification steps whose draft was accepted up to each "
            "position (a^(i+1) where every position accepts a, as the planner assumes; "
            "a steeper fall says longer drafts pay less than planned; where the schedule "
            "drafts fewer tokens at larger batches, deep positions also fall by the steps "
            "that did not reach them), and the share of decode steps that drafted at all "
            "(under 1 where prompt lookup found no match, which the loop counts for ngram).",
        ),
    ]


def _scaling() -> list[p.Json]:
    return [
        p.replicas(Q["replicas_desired"], Q["replicas_ready"], w=8),
        p.scaling_decisions(
            Q["scaling_decisions"],
            w=8,
            description="Decisions per interval by direction and reason.",
        ),
        p.cost_vs_budget(Q["cost"], Q["budget"], w=8),
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
        links=[p.dashboard_link("Fleet", "rooftop-fleet", include_vars=False)],
    )
