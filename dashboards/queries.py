"""Every PromQL expression the Rooftop dashboards run, in one place.

The dashboards take their queries from here, and ``ALL`` lists them all under stable
keys (``fleet.<id>``, ``target.<id>``) so an end-to-end test can run each one against a
real Prometheus after ``concrete`` has filled in the Grafana variables.

Selectors:
    vLLM engine metrics carry ``namespace`` and ``servingtarget`` (added by PodMonitor
    relabeling) plus vLLM's ``model_name`` and ``engine``. Operator metrics
    (``rooftop_operator.metrics``) carry ``namespace`` and ``name``.
    Operator series are wrapped in ``max by (namespace, name)`` before aggregating, so a
    paused standby operator replica still exporting old values is not double counted.

Counters and histograms always go through ``rate()``/``increase()`` over
``$__rate_interval``: no lifetime averages (``_sum / _count`` since process start).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final


@dataclass(frozen=True)
class Query:
    """One PromQL expression and its legend.

    Attributes:
        expr: PromQL with Grafana variables ($namespace, $target, $model_name,
            $__rate_interval).
        legend: Grafana legend format (``{{label}}``); ``SLO`` marks an SLO line.
        optional: the query may rightly return no series in a healthy system (e.g.
            no scaling decision yet, or no TTFT SLO in the spec).
    """

    expr: str
    legend: str = ""
    optional: bool = False


QUANTILES: Final = (0.5, 0.9, 0.99)

# Selectors: fleet (multi-namespace regex), one target's vLLM engines, one target's
# operator series.
FLEET: Final = 'namespace=~"$namespace"'
ENGINE: Final = 'namespace="$namespace", servingtarget="$target", model_name=~"$model_name"'
TARGET: Final = 'namespace="$namespace", name="$target"'
RATE: Final = "$__rate_interval"

TPOT_HIST: Final = "vllm:request_time_per_output_token_seconds"
ITL_HIST: Final = "vllm:inter_token_latency_seconds"
TTFT_HIST: Final = "vllm:time_to_first_token_seconds"
E2E_HIST: Final = "vllm:e2e_request_latency_seconds"
QUEUE_HIST: Final = "vllm:request_queue_time_seconds"


def rate(metric: str, selector: str, func: str = "rate") -> str:
    return f"{func}({metric}{{{selector}}}[{RATE}])"


def quantile(q: float, histogram: str, selector: str, by: str = "") -> str:
    """``histogram_quantile`` over the per-second bucket rates, summed across engines."""
    labels = f"{by}, le" if by else "le"
    return f"histogram_quantile({q:g}, sum by ({labels}) ({rate(histogram + '_bucket', selector)}))"


def dedup(metric: str, selector: str, by: str = "namespace, name") -> str:
    """One series per target even if two operator replicas export it."""
    return f"max by ({by}) ({metric}{{{selector}}})"


def percentiles(histogram: str, selector: str) -> list[Query]:
    return [Query(quantile(q, histogram, selector), f"p{q * 100:g}") for q in QUANTILES]


def _d(metric: str, by: str = "namespace, name") -> str:
    """A fleet-wide operator metric, one series per target (and ``by`` labels)."""
    return dedup(metric, FLEET, by)


def _m(metric: str) -> str:
    """One target's operator metric as a single series."""
    return f"max({metric}{{{TARGET}}})"


def _e(counter: str) -> str:
    """Per-second rate of one target's engine counter, summed over its engines."""
    return f"sum({rate(counter, ENGINE)})"


def _fleet() -> dict[str, Query]:
    d = _d
    gpu = "namespace, name, gpu_type"
    return {
        "targets": Query(f"count({d('rooftop_target_feasible')}) or vector(0)", "targets"),
        "infeasible": Query(
            f"count({d('rooftop_target_feasible')} == 0) or vector(0)", "infeasible"
        ),
        "slo_attainment": Query(f"avg({d('rooftop_slo_met')})", "SLO attainment"),
        "cost": Query(f"sum({d('rooftop_plan_cost_usd_per_hour', gpu)})", "cost"),
        "budget": Query(f"sum({d('rooftop_budget_usd_per_hour')})", "budget"),
        "gpus": Query(f"sum({d('rooftop_plan_gpus', gpu)})", "GPUs"),
        "replicas_desired": Query(f"sum({d('rooftop_replicas_desired')})", "desired"),
        "replicas_ready": Query(f"sum({d('rooftop_replicas_ready')})", "ready"),
        "metrics_state": Query(
            f"sum by (state) ({d('rooftop_metrics_state', 'namespace, name, state')})",
            "{{state}}",
        ),
        "tpot_p90_by_target": Query(
            quantile(0.9, TPOT_HIST, FLEET, by="namespace, servingtarget"),
            "{{namespace}}/{{servingtarget}} p90",
        ),
        "slo_tpot_by_target": Query(d("rooftop_slo_tpot_seconds"), "{{namespace}}/{{name}} SLO"),
        "tpot_over_slo": Query(
            f"{d('rooftop_observed_tpot_seconds')} / {d('rooftop_slo_tpot_seconds')}",
            "{{namespace}}/{{name}}",
        ),
        "cost_over_budget": Query(
            f"sum by (namespace, name) ({d('rooftop_plan_cost_usd_per_hour', gpu)})"
            f" / {d('rooftop_budget_usd_per_hour')}",
            "{{namespace}}/{{name}}",
        ),
        "cost_by_target": Query(
            f"sum by (namespace, name) ({d('rooftop_plan_cost_usd_per_hour', gpu)})",
            "{{namespace}}/{{name}}",
        ),
        "feasible_by_target": Query(d("rooftop_target_feasible")),
        "slo_met_by_target": Query(d("rooftop_slo_met")),
        "observed_tpot_by_target": Query(d("rooftop_observed_tpot_seconds")),
        "budget_by_target": Query(d("rooftop_budget_usd_per_hour")),
        "replicas_desired_by_target": Query(d("rooftop_replicas_desired")),
        "replicas_ready_by_target": Query(d("rooftop_replicas_ready")),
        "gpus_by_type": Query(f"sum by (gpu_type) ({d('rooftop_plan_gpus', gpu)})"),
        "targets_by_type": Query(f"count by (gpu_type) ({d('rooftop_plan_gpus', gpu)})"),
        "cost_by_type": Query(f"sum by (gpu_type) ({d('rooftop_plan_cost_usd_per_hour', gpu)})"),
        "scaling_decisions": Query(
            f"sum by (direction) ({rate('rooftop_scaling_decisions_total', FLEET, 'increase')})",
            "{{direction}}",
            optional=True,
        ),
        "reconciles": Query(
            "sum by (result) (rate(rooftop_reconciles_total[$__rate_interval]))", "{{result}}"
        ),
    }


def _target() -> dict[str, Query]:
    m, e = _m, _e
    out: dict[str, Query] = {
        "slo_met": Query(m("rooftop_slo_met"), "SLO met"),
        "feasible": Query(m("rooftop_target_feasible"), "feasible"),
        "cost": Query(
            f"sum({dedup('rooftop_plan_cost_usd_per_hour', TARGET, 'gpu_type')})", "cost"
        ),
        "budget": Query(m("rooftop_budget_usd_per_hour"), "budget"),
        "gpus": Query(dedup("rooftop_plan_gpus", TARGET, "gpu_type"), "{{gpu_type}}"),
        "replicas_desired": Query(m("rooftop_replicas_desired"), "desired"),
        "replicas_ready": Query(m("rooftop_replicas_ready"), "ready"),
        "metrics_state": Query(
            f"{dedup('rooftop_metrics_state', TARGET, 'state')} == 1", "{{state}}"
        ),
        "slo_tpot": Query(m("rooftop_slo_tpot_seconds"), "SLO"),
        "slo_ttft": Query(m("rooftop_slo_ttft_seconds"), "SLO", optional=True),
        "predicted_tpot": Query(m("rooftop_predicted_tpot_seconds"), "predicted"),
        "observed_tpot": Query(m("rooftop_observed_tpot_seconds"), "observed"),
        "predicted_ttft": Query(m("rooftop_predicted_ttft_seconds"), "predicted", optional=True),
        "observed_ttft": Query(m("rooftop_observed_ttft_seconds"), "observed", optional=True),
        "calibration": Query(m("rooftop_calibration_factor_ratio"), "observed / predicted"),
        "trim": Query(m("rooftop_latency_trim_ratio"), "latency trim"),
        "generation_tokens": Query(e("vllm:generation_tokens_total"), "generation"),
        "prompt_tokens": Query(e("vllm:prompt_tokens_total"), "prompt"),
        "requests": Query(
            f"sum by (finished_reason) ({rate('vllm:request_success_total', ENGINE)})",
            "{{finished_reason}}",
        ),
        "preemptions": Query(e("vllm:num_preemptions_total"), "preemptions"),
        "prefix_cache_hit_ratio": Query(
            f"{e('vllm:prefix_cache_hits_total')} / {e('vllm:prefix_cache_queries_total')}",
            "prefix cache hits",
        ),
        # speculative decoding: none where the engines do not speculate
        "accepted_per_draft": Query(
            f"{e('vllm:spec_decode_num_accepted_tokens_total')} / "
            f"{e('vllm:spec_decode_num_drafts_total')}",
            "accepted",
            optional=True,
        ),
        "drafted_per_draft": Query(
            f"{e('vllm:spec_decode_num_draft_tokens_total')} / "
            f"{e('vllm:spec_decode_num_drafts_total')}",
            "drafted",
            optional=True,
        ),
        # the chance a draft gets past position i: a^(i+1) where every position accepts
        # a, as the planner's chain has it
        "accepted_by_position": Query(
            f"sum by (position) "
            f"({rate('vllm:spec_decode_num_accepted_tokens_per_pos_total', ENGINE)}) "
            f"/ ignoring(position) group_left() {e('vllm:spec_decode_num_drafts_total')}",
            "position {{position}}",
            optional=True,
        ),
        # decode steps that drafted: under 1 where prompt lookup found no match
        "drafted_share": Query(
            f"{e('vllm:spec_decode_num_drafts_total')} / {e(ITL_HIST + '_count')}",
            "steps that drafted",
            optional=True,
        ),
        "running": Query(f"sum(vllm:num_requests_running{{{ENGINE}}})", "running"),
        "waiting": Query(f"sum(vllm:num_requests_waiting{{{ENGINE}}})", "waiting"),
        "kv_cache_max": Query(f"max(vllm:kv_cache_usage_perc{{{ENGINE}}})", "max"),
        "kv_cache_avg": Query(f"avg(vllm:kv_cache_usage_perc{{{ENGINE}}})", "mean"),
        "scaling_decisions": Query(
            "sum by (direction, reason) "
            f"({rate('rooftop_scaling_decisions_total', TARGET, 'increase')})",
            "{{direction}} ({{reason}})",
            optional=True,
        ),
        "scaling_events": Query(
            "sum by (direction, reason) "
            f"({rate('rooftop_scaling_decisions_total', TARGET, 'increase')}) > 0",
            optional=True,
        ),
        "e2e_p90": Query(quantile(0.9, E2E_HIST, ENGINE), "e2e p90"),
        "e2e_p99": Query(quantile(0.99, E2E_HIST, ENGINE), "e2e p99"),
        "queue_p90": Query(quantile(0.9, QUEUE_HIST, ENGINE), "queue p90"),
    }
    for key, hist in (("tpot", TPOT_HIST), ("itl", ITL_HIST), ("ttft", TTFT_HIST)):
        for q in percentiles(hist, ENGINE):
            out[f"{key}_{q.legend}"] = q
    return out


FLEET_QUERIES: Final[Mapping[str, Query]] = _fleet()
TARGET_QUERIES: Final[Mapping[str, Query]] = _target()
ALL: Final[Mapping[str, Query]] = {
    **{f"fleet.{k}": q for k, q in FLEET_QUERIES.items()},
    **{f"target.{k}": q for k, q in TARGET_QUERIES.items()},
}

# Template variable queries (Grafana's label_values, not PromQL).
NAMESPACE_VALUES: Final = "label_values(rooftop_target_feasible, namespace)"
TARGET_VALUES: Final = 'label_values(rooftop_target_feasible{namespace="$namespace"}, name)'
MODEL_NAME_VALUES: Final = (
    'label_values(vllm:num_requests_running{namespace="$namespace", servingtarget="$target"}, '
    "model_name)"
)
VARIABLE_QUERIES: Final = (NAMESPACE_VALUES, TARGET_VALUES, MODEL_NAME_VALUES)

_VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)")


def concrete(
    expr: str,
    namespace: str,
    target: str,
    model_name: str = ".*",
    rate_interval: str = "1m",
) -> str:
    """Substitute the Grafana variables in ``expr`` so Prometheus can run it.

    ``model_name`` is matched as a regex (``=~``), like Grafana's ``All`` (``.*``);
    a plain served model name matches itself. ``namespace`` is also a regex in the
    fleet dashboard; a plain namespace matches itself.

    Raises:
        KeyError: ``expr`` uses a variable this function does not know.
    """
    values = {
        "namespace": namespace,
        "target": target,
        "model_name": model_name,
        "__rate_interval": rate_interval,
        "__interval": rate_interval,
        "__range": rate_interval,
    }
    return _VARIABLE.sub(lambda m: values[m.group(1) or m.group(2)], expr)


def extract_exprs(dashboard: Mapping[str, Any]) -> Iterator[str]:
    """Every PromQL expression in a rendered dashboard: panel targets and annotations."""
    for panel in dashboard.get("panels", []):
        for nested in [panel, *panel.get("panels", [])]:
            for t in nested.get("targets", []):
                yield t["expr"]
    for annotation in dashboard.get("annotations", {}).get("list", []):
        if "expr" in annotation:
            yield annotation["expr"]
