"""The operator's own metrics: helpers set the right series, names follow conventions."""

from __future__ import annotations

import re
import urllib.request

import pytest
from prometheus_client import CollectorRegistry

from rooftop_operator import metrics
from rooftop_operator.metrics import OperatorMetrics

NAME_RE = re.compile(r"^rooftop_[a-z][a-z0-9]*(_[a-z0-9]+)*$")
ALLOWED_LABELS = {"namespace", "name", "gpu_type", "result", "direction", "reason", "state"}
UNIT_SUFFIXES = ("_seconds", "_ratio", "_usd_per_hour", "_total", "_gpus")
UNITLESS = {  # counts of things and 0/1 flags carry no unit suffix
    "rooftop_replicas_desired",
    "rooftop_replicas_ready",
    "rooftop_target_feasible",
    "rooftop_slo_met",
    "rooftop_metrics_state",
}


@pytest.fixture
def m() -> OperatorMetrics:
    return OperatorMetrics(CollectorRegistry())


def value(m: OperatorMetrics, metric: str, /, **labels: str) -> float | None:
    return m.registry.get_sample_value(metric, labels)


def plan(m: OperatorMetrics, gpu: str | None = "h100-sxm", feasible: bool = True) -> None:
    m.record_plan(
        "ns",
        "chat",
        feasible=feasible,
        slo_tpot_s=0.05,
        slo_ttft_s=1.0,
        budget_usd_per_hour=20.0,
        gpu_type=gpu,
        gpus=2 if gpu else None,
        usd_per_hour=8.0 if gpu else None,
        predicted_tpot_s=0.03 if gpu else None,
        predicted_ttft_s=0.4 if gpu else None,
    )


def test_names_follow_prometheus_conventions() -> None:
    assert len(set(metrics.METRIC_NAMES)) == len(metrics.METRIC_NAMES)
    for name in metrics.METRIC_NAMES:
        assert NAME_RE.match(name), name
        assert ":" not in name
        assert name.endswith(UNIT_SUFFIXES) or name in UNITLESS, name
    assert metrics.CALIBRATION_FACTOR_RATIO == "rooftop_calibration_factor_ratio"


def test_registry_matches_exported_names_types_and_labels(m: OperatorMetrics) -> None:
    families = {f.name: f for f in m.registry.collect()}
    exposed = {f"{n}_total" if f.type == "counter" else n: f for n, f in families.items()}
    assert set(exposed) == set(metrics.METRIC_NAMES)
    for name, family in exposed.items():
        assert name.endswith("_total") == (family.type == "counter"), name
        assert family.type in ("counter", "gauge"), name
    for metric in (m.reconciles, m.decisions, m.cost, m.metrics_state, m.slo_tpot):
        assert set(metric._labelnames) <= ALLOWED_LABELS


def test_record_plan_sets_series(m: OperatorMetrics) -> None:
    plan(m)
    t = {"namespace": "ns", "name": "chat"}
    assert value(m, "rooftop_target_feasible", **t) == 1
    assert value(m, "rooftop_slo_tpot_seconds", **t) == 0.05
    assert value(m, "rooftop_slo_ttft_seconds", **t) == 1.0
    assert value(m, "rooftop_budget_usd_per_hour", **t) == 20.0
    assert value(m, "rooftop_predicted_tpot_seconds", **t) == 0.03
    assert value(m, "rooftop_predicted_ttft_seconds", **t) == 0.4
    assert value(m, "rooftop_plan_cost_usd_per_hour", gpu_type="h100-sxm", **t) == 8.0
    assert value(m, "rooftop_plan_gpus", gpu_type="h100-sxm", **t) == 2


def test_the_slo_percentiles_are_exported_for_the_burn_rate_alerts(m: OperatorMetrics) -> None:
    """The chart's PrometheusRule reads each target's error budget as 1 - quantile."""
    m.record_plan("ns", "p99", feasible=True, slo_tpot_s=0.05, budget_usd_per_hour=20.0,
                  slo_ttft_s=1.0, slo_quantiles=(0.99, 0.95))  # fmt: skip
    m.record_plan("ns", "nottft", feasible=True, slo_tpot_s=0.05, budget_usd_per_hour=20.0,
                  slo_quantiles=(0.5, 0.9))  # fmt: skip
    assert value(m, "rooftop_slo_tpot_quantile_ratio", namespace="ns", name="p99") == 0.99
    assert value(m, "rooftop_slo_ttft_quantile_ratio", namespace="ns", name="p99") == 0.95
    assert value(m, "rooftop_slo_tpot_quantile_ratio", namespace="ns", name="nottft") == 0.5
    assert value(m, "rooftop_slo_ttft_quantile_ratio", namespace="ns", name="nottft") is None


def test_replan_onto_another_gpu_drops_the_old_gpu_series(m: OperatorMetrics) -> None:
    plan(m, "h100-sxm")
    plan(m, "l40s")
    t = {"namespace": "ns", "name": "chat"}
    assert value(m, "rooftop_plan_cost_usd_per_hour", gpu_type="h100-sxm", **t) is None
    assert value(m, "rooftop_plan_gpus", gpu_type="h100-sxm", **t) is None
    assert value(m, "rooftop_plan_cost_usd_per_hour", gpu_type="l40s", **t) == 8.0


def test_a_mixed_fleet_has_gpu_and_cost_series_per_gpu_type(m: OperatorMetrics) -> None:
    """The dashboards' GPUs and cost by type add up per type: a mix is one series per
    pool's type, and a re-plan back onto one type drops the others'."""
    m.record_plan("ns", "chat", feasible=True, slo_tpot_s=0.05, budget_usd_per_hour=20.0,
                  gpu_type="gh200", pools=[("a100-80gb", 4, 0.0), ("gh200", 2, 4.58)])  # fmt: skip
    t = {"namespace": "ns", "name": "chat"}
    assert value(m, "rooftop_plan_gpus", gpu_type="a100-80gb", **t) == 4.0
    assert value(m, "rooftop_plan_gpus", gpu_type="gh200", **t) == 2.0
    assert value(m, "rooftop_plan_cost_usd_per_hour", gpu_type="gh200", **t) == 4.58
    plan(m, "gh200")
    assert value(m, "rooftop_plan_gpus", gpu_type="a100-80gb", **t) is None
    assert value(m, "rooftop_plan_gpus", gpu_type="gh200", **t) == 2.0


def test_infeasible_plan_removes_plan_series_but_keeps_slo(m: OperatorMetrics) -> None:
    plan(m)
    plan(m, gpu=None, feasible=False)
    t = {"namespace": "ns", "name": "chat"}
    assert value(m, "rooftop_target_feasible", **t) == 0
    assert value(m, "rooftop_slo_tpot_seconds", **t) == 0.05
    assert value(m, "rooftop_predicted_tpot_seconds", **t) is None
    assert value(m, "rooftop_plan_cost_usd_per_hour", gpu_type="h100-sxm", **t) is None


def test_record_observation_and_enum_style_state(m: OperatorMetrics) -> None:
    m.record_observation(
        "ns",
        "chat",
        metrics_state="ok",
        tpot_s=0.04,
        ttft_s=0.5,
        calibration_factor=1.2,
        latency_trim=1.6,
        slo_met=True,
    )
    t = {"namespace": "ns", "name": "chat"}
    assert value(m, "rooftop_observed_tpot_seconds", **t) == 0.04
    assert value(m, "rooftop_observed_ttft_seconds", **t) == 0.5
    assert value(m, "rooftop_calibration_factor_ratio", **t) == 1.2
    assert value(m, "rooftop_latency_trim_ratio", **t) == 1.6
    assert value(m, "rooftop_slo_met", **t) == 1
    states = {s: value(m, "rooftop_metrics_state", state=s, **t) for s in metrics.METRICS_STATES}
    assert states == {"ok": 1, "missing": 0, "stale": 0, "nan": 0}

    m.record_observation("ns", "chat", metrics_state="stale")  # nothing measured: no stale values
    assert value(m, "rooftop_observed_tpot_seconds", **t) is None
    assert value(m, "rooftop_slo_met", **t) is None
    assert value(m, "rooftop_metrics_state", state="stale", **t) == 1
    assert value(m, "rooftop_metrics_state", state="ok", **t) == 0


def test_unknown_metrics_state_is_rejected(m: OperatorMetrics) -> None:
    with pytest.raises(ValueError, match="metrics_state"):
        m.record_metrics_state("ns", "chat", "weird")


def test_record_replicas(m: OperatorMetrics) -> None:
    m.record_replicas("ns", "chat", desired=3, ready=2)
    assert value(m, "rooftop_replicas_desired", namespace="ns", name="chat") == 3
    assert value(m, "rooftop_replicas_ready", namespace="ns", name="chat") == 2


def test_counters_fold_unknown_label_values_into_other(m: OperatorMetrics) -> None:
    m.record_reconcile("success")
    m.record_reconcile("kaboom: pod xyz-123 failed")
    m.record_decision("ns", "chat", "up", "slo_violation")
    m.record_decision("ns", "chat", "sideways", "free text from somewhere")
    assert value(m, "rooftop_reconciles_total", result="success") == 1
    assert value(m, "rooftop_reconciles_total", result="other") == 1
    t = {"namespace": "ns", "name": "chat"}
    total = "rooftop_scaling_decisions_total"
    assert value(m, total, direction="up", reason="slo_violation", **t) == 1
    assert value(m, total, direction="other", reason="other", **t) == 1


def test_forget_removes_every_label_set_of_the_target_only(m: OperatorMetrics) -> None:
    for name in ("chat", "batch"):
        m.record_plan(
            "ns", name, feasible=True, slo_tpot_s=0.05, budget_usd_per_hour=9.0, gpu_type="a10g"
        )
        m.record_observation("ns", name, metrics_state="ok", tpot_s=0.04, slo_met=True)
        m.record_replicas("ns", name, desired=1, ready=1)
        m.record_decision("ns", name, "down", "overprovisioned")
    m.forget("ns", "chat")
    samples = [s for f in m.registry.collect() for s in f.samples]
    assert not [s for s in samples if s.labels.get("name") == "chat"]
    assert [s for s in samples if s.labels.get("name") == "batch"]
    m.forget("ns", "chat")  # idempotent
    plan(m)  # a re-created target starts clean
    assert value(m, "rooftop_plan_gpus", namespace="ns", name="chat", gpu_type="h100-sxm") == 2


def test_module_helpers_use_the_default_registry() -> None:
    metrics.record_replicas("helper-ns", "t", desired=1, ready=0)
    got = metrics.REGISTRY.get_sample_value(
        "rooftop_replicas_desired", {"namespace": "helper-ns", "name": "t"}
    )
    assert got == 1
    metrics.forget("helper-ns", "t")
    assert (
        metrics.REGISTRY.get_sample_value(
            "rooftop_replicas_desired", {"namespace": "helper-ns", "name": "t"}
        )
        is None
    )


def test_start_http_server_serves_the_registry(m: OperatorMetrics) -> None:
    plan(m)
    server, thread = metrics.start_http_server(0, "127.0.0.1", registry=m.registry)
    try:
        url = f"http://127.0.0.1:{server.server_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as resp:
            body = resp.read().decode()
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
    assert 'rooftop_slo_tpot_seconds{name="chat",namespace="ns"} 0.05' in body
