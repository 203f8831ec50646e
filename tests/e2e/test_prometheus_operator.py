"""The Prometheus Operator, built from its Go module, as users run it: the
configuration it generates, read without a Prometheus to run it
(test_kube_prometheus_stack.py and the closed-loop tests run one on it).

The real Prometheus Operator (tests/cluster/build-prometheus-operator.sh) watches the
local control plane, with its own CRDs and a Prometheus resource selecting as
kube-prometheus-stack's defaults do (PodMonitors and rules labelled
``release: <release>``, in any namespace), and turns the chart's and the operator's
PodMonitors and PrometheusRule into the configuration its Prometheus would load (the
``prometheus-<name>`` Secret and rule ConfigMaps). What a default install of the chart
leaves unselected, and what the documented label changes, is read from there.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from rooftop_planner.catalog import load_catalog
from tests.cluster import prometheus_operator
from tests.cluster.handle import ClusterHandle, wait_until
from tests.cluster.operator_process import Operator
from tests.cluster.prometheus_operator import generated_config, rule_config_maps
from tests.e2e.test_operator import Env, ready_example

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "rooftop"
RELEASE = "rooftop"  # fullname: the chart's name is in the release's
KPS_RELEASE = "kps"  # the kube-prometheus-stack release whose label selects
SELECTED = {"release": KPS_RELEASE}
TARGET = "chat"
TIMEOUT = 90.0


@dataclass
class World:
    env: Env  # the operator and its targets (tests/e2e/test_operator.py's)
    monitoring: str
    system: str
    prometheus: str
    notes: str
    work: Path

    @property
    def api(self) -> Any:
        return self.env.api

    @property
    def targets(self) -> str:
        return self.env.namespace

    def config(self) -> dict[str, Any]:
        """The configuration the Prometheus Operator generated (its Secret), or {}."""
        return generated_config(self.api, self.monitoring, self.prometheus)

    def jobs(self) -> dict[str, dict[str, Any]]:
        return {job["job_name"]: job for job in self.config().get("scrape_configs") or []}

    def rule_files(self) -> str:
        """Every rule file the Prometheus Operator rendered for that Prometheus."""
        maps = rule_config_maps(self.api, self.monitoring, self.prometheus)
        return "\n".join(v for files in maps.values() for v in files.values())


def pod_monitor(name: str, namespace: str, labels: dict[str, str]) -> dict[str, Any]:
    """A PodMonitor of pods no one runs: its scrape job is all it gives."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "selector": {"matchLabels": {"app": "nothing"}},
            "podMetricsEndpoints": [{"port": "metrics"}],
        },
    }


def engine_job(w: World) -> str:
    return f"podMonitor/{w.targets}/{TARGET}-engine/0"


def operator_job(w: World) -> str:
    return f"podMonitor/{w.system}/{RELEASE}/0"


@pytest.fixture(scope="module")
def world(
    cluster: ClusterHandle, prometheus_operator_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[World]:
    suffix = uuid.uuid4().hex[:6]
    monitoring, system, targets = (f"{n}-{suffix}" for n in ("monitoring", "rooftop-po", "po"))
    work = tmp_path_factory.mktemp("prometheus-operator")
    for ns in (monitoring, system, targets):
        cluster.create_namespace(ns)
    with prometheus_operator.running(cluster, prometheus_operator_dir, monitoring, "kps",
                                     KPS_RELEASE, work):  # fmt: skip
        yield from _installed(cluster, monitoring, system, targets, work)


def _installed(
    cluster: ClusterHandle, monitoring: str, system: str, targets: str, work: Path
) -> Iterator[World]:
    """The chart, labelled for the stack but not its engines, and the operator (a host
    process) with one ready target."""
    api = cluster.api()
    installed = cluster.helm(
        "install", RELEASE, str(CHART), "--namespace", system, "--set", "image.tag=e2e",
        "--set", "metrics.podMonitor.enabled=true",
        "--set", f"metrics.podMonitor.labels.release={KPS_RELEASE}",
        "--set", "prometheusRule.enabled=true",
        "--set", f"prometheusRule.labels.release={KPS_RELEASE}",
    )  # fmt: skip
    kubeconfig = cluster.serviceaccount_kubeconfig(system, RELEASE)
    operator = Operator(kubeconfig, targets, work / "operator.log")
    env = Env(cluster, api, targets, operator, load_catalog(), release=RELEASE)
    w = World(env, monitoring, system, "kps", installed.stdout, work)
    try:
        operator.start(ROOFTOP_PODMONITOR_LABELS="{}")  # the chart's default
        ready_example(env, TARGET)
        yield w
    finally:
        operator.stop()
        cluster.helm("uninstall", RELEASE, "--namespace", system, check=False)
        for ns in (targets, system, monitoring):
            cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
        for node in env.nodes:
            cluster.kubectl("delete", "node", node, "--wait=false", check=False)
        api.close()


# ---------------------------------------------------------------- what users get


def test_a_default_install_warns_that_the_engines_go_unscraped(world: World) -> None:
    """engine.podMonitor.labels left empty: the Prometheus selects the operator's own
    PodMonitor (labelled as the chart was told) and not the engines', and the install's
    NOTES say so with the flag that fixes it."""
    wait_until(lambda: operator_job(world) in world.jobs(), TIMEOUT, "the operator's job")
    # a selected PodMonitor made after the engines': once its job is there, the
    # configuration was generated with the engines' PodMonitor in the cluster
    control = pod_monitor("control", world.targets, SELECTED)
    path = world.work / "control.yaml"
    path.write_text(yaml.safe_dump(control))
    world.env.cluster.kubectl("apply", "-f", str(path))
    control_job = f"podMonitor/{world.targets}/control/0"
    wait_until(lambda: control_job in world.jobs(), TIMEOUT, "the control job")
    assert engine_job(world) not in world.jobs()
    assert "WARNING: engine.podMonitor.labels is empty" in world.notes
    assert f"--set engine.podMonitor.labels.release={KPS_RELEASE}" in world.notes


def test_the_operators_own_series_keep_the_targets_namespace(world: World) -> None:
    """honorLabels on the operator's PodMonitor: its per-target series' ``namespace``
    (the ServingTarget's) survives the scrape rather than becoming exported_namespace."""
    job = wait_until(lambda: world.jobs().get(operator_job(world)), TIMEOUT, "operator job")
    assert isinstance(job, dict) and job.get("honor_labels") is True


def test_the_chart_s_alerts_are_loaded_by_the_rule_selector(world: World) -> None:
    """The PrometheusRule, labelled as the chart was told, is rendered into the
    Prometheus' rule files; its rules are the chart's."""
    rules = wait_until(lambda: world.rule_files(), TIMEOUT, "rule files")
    assert isinstance(rules, str)
    for alert in ("RooftopTPOTErrorBudgetBurn", "RooftopEngineMetricsMissing",
                  "RooftopServingTargetInfeasible", "RooftopEngineDown"):  # fmt: skip
        assert f"alert: {alert}" in rules, alert


def test_the_documented_label_selects_the_engines(world: World) -> None:
    """As ``helm upgrade --set engine.podMonitor.labels.release=kps`` renders it: the
    operator, restarted, labels the engine PodMonitor, and the Prometheus Operator
    generates its scrape job, its relabelings keeping the target and namespace labels
    the loop's queries group by."""
    world.env.operator.stop()
    world.env.operator.start(ROOFTOP_PODMONITOR_LABELS=json.dumps(SELECTED))
    job = wait_until(lambda: world.jobs().get(engine_job(world)), TIMEOUT, "the engines' job")
    assert isinstance(job, dict)
    targets = {r.get("target_label") for r in job.get("relabel_configs") or []}
    assert {"namespace", "servingtarget"} <= targets, targets
