"""The chart's PrometheusRule: SLO burn-rate alerts and the operator's own alerts.

The rules are rendered by helm and run by promtool, `check rules` (syntax, names) and
`test rules` on tests/unit/operator/data/prometheus-rules.test.yaml (series that make
alerts fire and others that must not). Both binaries come from `make tools` (helm from
tests/cluster/build-bins.sh, promtool with Prometheus from
tests/cluster/fetch-prometheus.sh); these tests skip without them, as the chart's other
rendering tests do without helm.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.cluster.controlplane import cache_dir
from tests.unit.operator.test_operator_chart import HELM, needs_helm, render

from rooftop_control import signals
from rooftop_operator import metrics, metrics_client
from rooftop_sim.engine.vllm_metrics import TTFT_BUCKETS

ROOT = Path(__file__).resolve().parents[3]
CHART = ROOT / "charts" / "rooftop"
UNIT_TESTS = Path(__file__).parent / "data" / "prometheus-rules.test.yaml"
ENABLED = "prometheusRule.enabled=true"
# Gauges the rules read that the operator does not export (none: every one it reads is
# in rooftop_operator.metrics.METRIC_NAMES).
# The SRE workbook's multiwindow, multi-burn-rate table: (long, short, burn rate, severity).
WORKBOOK = {("1h", "5m", 14.4, "critical"), ("6h", "30m", 6.0, "critical"),
            ("3d", "6h", 1.0, "warning")}  # fmt: skip


def find_promtool() -> Path | None:
    """The cached promtool from fetch-prometheus.sh, else `promtool` on PATH."""
    cached = cache_dir() / "prometheus" / "bin" / "promtool"
    if cached.is_file() and os.access(cached, os.X_OK):
        return cached
    found = shutil.which("promtool")
    return Path(found) if found else None


PROMTOOL = find_promtool()
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool not fetched: make tools")


def rule_spec(*sets: str) -> dict[str, Any]:
    """The PrometheusRule's spec (its rule groups), rendered with the rule enabled."""
    (rule,) = [d for d in render(ENABLED, *sets) if d["kind"] == "PrometheusRule"]
    spec: dict[str, Any] = rule["spec"]
    return spec


def rules(*sets: str) -> list[dict[str, Any]]:
    return [r for group in rule_spec(*sets)["groups"] for r in group["rules"]]


def write_rules(directory: Path) -> Path:
    path = directory / "rules.yaml"
    path.write_text(yaml.safe_dump(rule_spec(), sort_keys=False))
    return path


# ---------------------------------------------------------------- promtool


@needs_helm
@needs_promtool
def test_promtool_checks_the_rules(tmp_path: Path) -> None:
    result = subprocess.run([str(PROMTOOL), "check", "rules", str(write_rules(tmp_path))],
                            capture_output=True, text=True)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


@needs_helm
@needs_promtool
def test_promtool_rule_unit_tests_pass(tmp_path: Path) -> None:
    """Burn-rate pages fire for a fast burn and not for a short burst, a slow burn opens
    a ticket, TTFT falls back to p90, vLLM's le="1.0" is matched, and the operator's
    alerts (metrics missing, infeasible, over budget, not ready, down) fire after their
    `for` with the annotations the file spells out."""
    write_rules(tmp_path)
    shutil.copy(UNIT_TESTS, tmp_path / UNIT_TESTS.name)
    result = subprocess.run([str(PROMTOOL), "test", "rules", UNIT_TESTS.name], cwd=tmp_path,
                            capture_output=True, text=True)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr


# ---------------------------------------------------------------- rendering


@needs_helm
def test_the_rule_is_opt_in_and_carries_the_selector_labels() -> None:
    assert not [d for d in render() if d["kind"] == "PrometheusRule"]
    # `helm upgrade --reuse-values` from a chart without prometheusRule
    assert not [d for d in render("prometheusRule=null") if d["kind"] == "PrometheusRule"]
    (rule,) = [d for d in render(ENABLED, "prometheusRule.labels.release=kps")
               if d["kind"] == "PrometheusRule"]  # fmt: skip
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["labels"]["release"] == "kps"


@needs_helm
def test_helm_lint_with_the_rule() -> None:
    result = subprocess.run([str(HELM), "lint", str(CHART), "--set", ENABLED],
                            capture_output=True, text=True)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr


@needs_helm
def test_the_rule_without_operator_metrics_fails_with_the_fix() -> None:
    args = [str(HELM), "template", "rt", str(CHART), "--set", ENABLED, "--set",
            "metrics.enabled=false"]  # fmt: skip
    result = subprocess.run(args, capture_output=True, text=True)
    assert result.returncode != 0 and "set metrics.enabled=true" in result.stderr


@needs_helm
def test_alert_labels_reach_every_alert() -> None:
    alerts = [r for r in rules("prometheusRule.alertLabels.team=ml") if "alert" in r]
    assert len(alerts) == 11
    assert all(a["labels"]["team"] == "ml" for a in alerts)


@needs_helm
def test_each_alerts_hold_is_a_value_and_the_burn_rates_keep_theirs() -> None:
    """``prometheusRule.for.<alert without Rooftop>`` sets that alert's ``for``; the
    others keep their defaults, and so does every alert after ``helm upgrade
    --reuse-values`` from a chart without the value."""
    holds = {"RooftopEngineMetricsMissing": "10m", "RooftopServingTargetInfeasible": "5m",
             "RooftopServingTargetOverBudget": "15m", "RooftopEngineNotReady": "15m",
             "RooftopEngineDown": "15m"}  # fmt: skip

    def held(*sets: str) -> dict[str, str]:
        return {r["alert"]: r["for"] for r in rules(*sets) if r.get("alert") in holds}

    assert held() == holds
    assert held("prometheusRule.for=null") == holds
    shorter = held("prometheusRule.for.engineMetricsMissing=30s")
    assert shorter == holds | {"RooftopEngineMetricsMissing": "30s"}
    burns = {r["for"] for r in rules("prometheusRule.for.engineDown=1m")
             if r.get("alert", "").endswith("ErrorBudgetBurn")}  # fmt: skip
    assert burns == {"2m", "15m", "3h"}


@needs_helm
def test_burn_rate_alerts_follow_the_workbook_table() -> None:
    """Per SLI, three alerts: (long, short window, burn rate, severity) as in the SRE
    workbook, each requiring both windows over the same multiple of the budget."""
    for sli, histogram in (("TPOT", signals.REQUEST_TPOT_HISTOGRAM),
                           ("TTFT", signals.TTFT_HISTOGRAM)):  # fmt: skip
        errors = f"namespace_servingtarget:{histogram.replace(':', '_')}_slo_errors:ratio_rate"
        budget = f"namespace_servingtarget:rooftop_slo_{sli.lower()}_error_budget:ratio"
        seen = set()
        for alert in (r for r in rules() if r.get("alert") == f"Rooftop{sli}ErrorBudgetBurn"):
            labels = alert["labels"]
            long, short = labels["long_window"], labels["short_window"]
            factors = re.findall(rf"{errors}(\w+) > on \(namespace, servingtarget\) "
                                 rf"\(([\d.]+) \* {budget}\)", alert["expr"])  # fmt: skip
            assert [w for w, _ in factors] == [long, short], alert["expr"]
            assert factors[0][1] == factors[1][1]
            seen.add((long, short, float(factors[0][1]), labels["severity"]))
        assert seen == WORKBOOK


def _attainment_clauses(key: str) -> list[tuple[float, float | None, str]]:
    """(lower, upper or None, le) of each clause of the attainment-bucket rule."""
    record = f"namespace_servingtarget_le:rooftop_slo_{key}_seconds:attainment_bucket"
    (rule,) = [r for r in rules() if r.get("record") == record]
    clauses = re.findall(r'>= ([\d.]+)(?: < ([\d.]+))?, "le", "([^"]+)"', rule["expr"])
    return [(float(lo), float(hi) if hi else None, le) for lo, hi, le in clauses]


@needs_helm
def test_the_rules_judge_the_operators_attainment_bucket() -> None:
    """TPOT: the bucket bounds are the operator's, and every SLO picks the bucket its
    tpot_attainment query reads (metrics_client.attainment_bucket); TTFT: vLLM's buckets.
    The `le` values are as the rules normalize vLLM's ("1.0" -> "1")."""
    tpot = _attainment_clauses("tpot")
    assert [le for _, _, le in tpot] == [f"{b:g}" for b in metrics_client.TPOT_BUCKETS]
    ttft = _attainment_clauses("ttft")
    assert [le for _, _, le in ttft] == [f"{b:g}" for b in TTFT_BUCKETS]
    for clauses in (tpot, ttft):  # contiguous, each from its bucket to the next
        assert all(hi == nxt for (_, hi, _), (nxt, _, _) in pairwise(clauses))
        assert clauses[-1][1] is None
    for slo_ms in (5, 10, 24.9, 25, 26, 80, 999, 1000, 1200, 4999, 5000, 60_000):
        slo = slo_ms / 1e3
        picked = [le for lo, hi, le in tpot if lo <= slo and (hi is None or slo < hi)]
        bucket = metrics_client.attainment_bucket(slo_ms)
        assert picked == ([] if bucket is None else [f"{bucket:g}"]), slo_ms


@needs_helm
def test_the_rules_read_metrics_that_exist() -> None:
    """Every rooftop_ metric is one the operator exports, and the vLLM histograms are
    the ones the loop reads."""
    exprs = " ".join(r["expr"] for r in rules())
    read = set(re.findall(r"(?<![\w:])rooftop_\w+", exprs))  # not inside recorded names
    assert read <= set(metrics.METRIC_NAMES), read - set(metrics.METRIC_NAMES)
    vllm = set(re.findall(r"\bvllm:\w+", exprs))
    assert vllm == {f"{h}_{suffix}" for h in (signals.REQUEST_TPOT_HISTOGRAM,
                                              signals.TTFT_HISTOGRAM)
                    for suffix in ("bucket", "count")}  # fmt: skip
    # the operator's series are per target: `namespace` and `name`
    assert metrics.TARGET_LABELS == ("namespace", "name")


@needs_helm
def test_rule_names_and_annotations() -> None:
    """Recording rules are level:metric:operations; every alert names its target in a
    summary and a description, and has a severity."""
    for rule in rules():
        if "record" in rule:
            level, metric, operations = rule["record"].split(":")
            assert level in {"namespace_servingtarget", "namespace_servingtarget_le"}
            assert re.fullmatch(r"[a-z][a-z0-9_]*", metric) and operations
            continue
        assert re.fullmatch(r"Rooftop[A-Za-z]+", rule["alert"])
        assert rule["labels"]["severity"] in {"critical", "warning"}
        for text in (rule["annotations"]["summary"], rule["annotations"]["description"]):
            assert "{{ $labels.namespace }}/{{ $labels.servingtarget }}" in text or (
                "-n {{ $labels.namespace }} {{ $labels.servingtarget }}" in text
            ), text
        assert "kubectl describe servingtarget" in rule["annotations"]["description"]
