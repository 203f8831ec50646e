"""Monitoring as users run it: kube-prometheus-stack's selection, a real scrape, the loop.

The operator runs as the chart's pod on the real node (tests/cluster/realnode.py). The
Prometheus Operator, built from its Go module, watches the control plane with a
``Prometheus`` selecting as kube-prometheus-stack's defaults do (monitors and rules
labelled ``release: kps``, any namespace), and a real Prometheus runs the configuration
it generates (tests/cluster/prometheus_operator.py: only mount paths are mapped), on
the node's bridge address, where the operator pod's feedback loop queries it. Every
series here went through the PodMonitors the chart and the operator made, and through
the Prometheus Operator's selection, relabelings and ``honor_labels``.

One scenario (``run``), then one promise per test:

1. **Installed as documented for the stack, but without the engines' label.** The
   chart labels its own PodMonitor and PrometheusRule ``release: kps``; ``helm
   install``'s NOTES warn that ``engine.podMonitor.labels`` is empty. A simulated
   target serves load on the real node, and nothing scrapes its engine: SLOMet says
   why and which chart value fixes it, and RooftopEngineMetricsMissing fires (its hold
   shortened to 30 s with ``prometheusRule.for.engineMetricsMissing``).
2. **``helm upgrade --set engine.podMonitor.labels.release=kps``.** The engines are
   scraped with the labels the loop and the dashboards group by; the loop judges the
   SLO from them; the operator's own series keep the target's ``namespace``; every
   dashboard query returns data; every rule of the chart evaluates without error and
   none of its alerts is pending or firing for the healthy target.
3. **A surge one replica cannot serve** (the target allows one): first tokens queue past
   the TTFT bound and RooftopTTFTErrorBudgetBurn's page (1 h and 5 min over 14.4x the
   target's p99 budget, ``for: 2m``) fires.
4. **The real vLLM** (CPU build) in a ``mode: vllm`` target's pod, in place of the
   simulated one: its own histograms reach Prometheus through the PodMonitor with the
   loop's labels, and the loop reads them.

In phases 1-3 the simulated engine (``rooftop engine-sim``, in the operator's image)
stands in for vLLM: it needs no model, starts in seconds and can be overloaded.
The other alerts' default holds (5 minutes and more) are not waited out here; the
chart's promtool tests (tests/unit/operator/test_chart_rules.py) take each alert from
pending to firing.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.cluster import dashboard_queries, prometheus_operator
from tests.cluster.apiserver_relay import api_server_for_pods
from tests.cluster.controlplane import free_port
from tests.cluster.handle import ClusterHandle, wait_until
from tests.cluster.prometheus_operator import GeneratedPrometheus, running
from tests.cluster.realnode import OPERATOR_IMAGE, RealNode
from tests.cluster.requests_webhook import RequestsWebhook
from tests.e2e.test_loop import Run
from tests.e2e.test_real_node import _build, real_node  # noqa: F401 (fixture)
from tests.e2e.test_real_node_operator import _helm_values, _one_ready, _simulated, readable_copy
from tests.e2e.test_zero_loss import SERVED, _model_claim
from tests.e2e.test_zero_loss import target as vllm_target

pytestmark = [pytest.mark.e2e, pytest.mark.vllm, pytest.mark.realnode]

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "rooftop"
RELEASE = "kps-rooftop"
KPS = prometheus_operator.STACK_RELEASE  # its Prometheus selects release=kps
PROMETHEUS = prometheus_operator.STACK_PROMETHEUS
TARGET = "chat"
MODEL = "llama-3.1-8b"
INTERVAL = "5s"  # the Prometheus' scrape and rule interval, the operator's scrape
WINDOW = "1m"  # the loop's and the dashboards' rate window (4 engine scrapes of 15 s)
READY_S = 180.0
DATA_S = 240.0  # the engines' first scrapes, one window of them, a loop tick
# The surge: an L40's engine at batch 8 streams 512 tokens in about 12 s, so one replica
# serves about 0.7 requests/s of them; at 4/s the queue, and the TTFT, grow every second.
SURGE_RPS, SURGE_OUTPUT_TOKENS = 4, 512
VLLM_READY_S = 300.0  # the engine image's first start on the node, the model's load
MISSING_FOR = "30s"  # RooftopEngineMetricsMissing's hold here (prometheusRule.for)
BURN_S = 480.0  # 14.4x of a 1 % budget in both windows, then the alert's 2 minutes


@dataclass
class World:
    cluster: ClusterHandle
    node: RealNode
    prometheus: GeneratedPrometheus
    system: str
    targets: str
    work: Path
    pv: str  # the vLLM target's model volume
    loaders: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def target(self, name: str = TARGET) -> dict[str, Any]:
        out = self.cluster.kubectl("-n", self.targets, "get", "servingtarget", name, "-o", "json")
        doc: dict[str, Any] = json.loads(out.stdout)
        return doc

    def condition(self, kind: str) -> dict[str, Any]:
        conditions = self.target().get("status", {}).get("conditions") or []
        return next((c for c in conditions if c["type"] == kind), {})

    def alerts(self) -> list[dict[str, Any]]:
        """The target's alerts, pending or firing (Prometheus' /api/v1/alerts)."""
        with urllib.request.urlopen(self.prometheus.url + "/api/v1/alerts", timeout=5) as r:
            found: list[dict[str, Any]] = json.loads(r.read())["data"]["alerts"]
        mine = {"namespace": self.targets, "servingtarget": TARGET}
        return [a for a in found if mine.items() <= a["labels"].items()]

    def rules(self) -> list[dict[str, Any]]:
        """Every rule Prometheus loaded, with its group (/api/v1/rules)."""
        with urllib.request.urlopen(self.prometheus.url + "/api/v1/rules", timeout=5) as r:
            groups = json.loads(r.read())["data"]["groups"]
        return [rule | {"group": g["name"]} for g in groups for rule in g["rules"]]

    def engine_job(self) -> str:
        """The engines' ``job`` label: the Prometheus Operator's NAMESPACE/PODMONITOR
        (the scrape config itself is podMonitor/NAMESPACE/PODMONITOR/0)."""
        return f"{self.targets}/{TARGET}-engine"


def helm_values(node: RealNode, prometheus_url: str) -> list[str]:
    """The chart as a kube-prometheus-stack user installs it, minus the engines' label:
    its own PodMonitor and its alerts labelled for the stack's selectors."""
    values = {
        "metrics.podMonitor.labels.release": KPS,
        "metrics.podMonitor.interval": INTERVAL,
        "prometheusRule.labels.release": KPS,
        "loop.prometheusUrl": prometheus_url,
        "loop.window": WINDOW,
        # the unselected phase waits the alert out: 30 s, not the default 10 minutes
        "prometheusRule.for.engineMetricsMissing": MISSING_FOR,
    }
    strings = [a for k, v in values.items() for a in ("--set-string", f"{k}={v}")]
    typed = ["metrics.podMonitor.enabled=true", "prometheusRule.enabled=true",
             "loop.intervalSeconds=5"]  # fmt: skip
    return [*_helm_values(node), *strings, *(a for v in typed for a in ("--set", v))]


def target() -> dict[str, Any]:
    """The real node's simulated target (one L40-sized engine), judged at p99 TTFT so
    the chart's fastest page, 14.4x the error budget, can fire (no p90 SLO can go
    14.4x over its 10 % budget), and held to one replica so that a surge breaches."""
    doc = _simulated(TARGET)
    doc["spec"]["slo"]["ttftPercentile"] = "p99"
    doc["spec"]["constraints"]["maxReplicas"] = 1
    return doc


def load(
    world: World, rate: float, output_tokens: int, name: str = TARGET, model: str = MODEL
) -> subprocess.Popen[bytes]:
    """``rooftop load`` through the target's ClusterIP Service until stopped."""
    ip = world.cluster.kubectl("-n", world.targets, "get", "service", name, "-o",
                               "jsonpath={.spec.clusterIP}").stdout  # fmt: skip
    argv = [sys.executable, "-m", "rooftop_cli.main", "load", "--url", f"http://{ip}:8000",
            "--model", model, "--rate", str(rate), "--prompt-tokens", "16", "--output-tokens",
            str(output_tokens), "--duration", "3600", "--quiet"]  # fmt: skip
    with (world.work / f"load-{name}-{rate:g}.log").open("ab") as log:
        return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)


def wait(what: str, check: Callable[[], Any], timeout: float = DATA_S) -> Any:
    return wait_until(check, timeout, what)


# ---------------------------------------------------------------- the three phases


def unselected(world: World, notes: str) -> dict[str, Any]:
    """Installed without the engines' label: what tells the user, and what does not."""
    slo = wait("SLOMet to say the engines are not scraped",
               lambda: (c := world.condition("SLOMet")).get("reason") == "MetricsUnavailable"
               and "engine.podMonitor.labels" in c.get("message", "") and c)  # fmt: skip
    missing = "RooftopEngineMetricsMissing"
    alert = wait(f"{missing} firing", lambda: [
        a for a in world.alerts()
        if a["labels"]["alertname"] == missing and a["state"] == "firing"])  # fmt: skip
    jobs = [j["job_name"] for j in world.prometheus.generated().get("scrape_configs") or []]
    return {"notes": notes, "slo": slo, "alerts": alert, "jobs": jobs, "namespace": world.targets}


def selected(world: World) -> dict[str, Any]:
    """After the documented ``helm upgrade``: the engines scraped, the loop judging."""
    world.cluster.helm("upgrade", RELEASE, str(CHART), "--namespace", world.system,
                       "--reuse-values", "--set-string",
                       f"engine.podMonitor.labels.release={KPS}")  # fmt: skip
    up = world.prometheus.wait_for(f'up{{job="{world.engine_job()}"}} == 1', timeout=DATA_S)
    slo = wait(
        "SLOMet judged from the engines' series",
        lambda: (c := world.condition("SLOMet")).get("status") in ("True", "False") and c,
    )
    operator = world.prometheus.wait_for(f'rooftop_slo_tpot_seconds{{name="{TARGET}"}}')
    results: dict[str, Any] = {}

    def dashboards_full() -> bool:
        nonlocal results
        results = dashboard_queries.run_all(world.prometheus, world.targets, TARGET, WINDOW)
        return not dashboard_queries.empty(results)

    with contextlib.suppress(TimeoutError):  # the test names the empty ones
        wait("every dashboard query to return data", dashboards_full, 120)
    time.sleep(30)  # rules evaluated on the healthy target for a while
    observed = world.target().get("status", {}).get("observed")
    return {"namespace": world.targets, "system": world.system, "up": up, "slo": slo,
            "observed": observed, "operator_series": operator, "queries": results,
            "rules": world.rules(), "alerts": world.alerts()}  # fmt: skip


def breached(world: World) -> dict[str, Any]:
    """A surge the one allowed replica cannot serve: requests queue, their TTFT passes
    the bound, and the 1 h / 5 min burn-rate page fires (``for: 2m``)."""
    surge = load(world, SURGE_RPS, SURGE_OUTPUT_TOKENS)
    world.loaders.append(surge)
    burn = "RooftopTTFTErrorBudgetBurn"

    def firing() -> list[dict[str, Any]]:
        return [
            a
            for a in world.alerts()
            if a["labels"]["alertname"] == burn
            and a["labels"].get("long_window") == "1h"
            and a["state"] == "firing"
        ]

    fired = wait(f"{burn} (1h, 5m) firing", firing, BURN_S)
    budget = world.prometheus.query(
        f'namespace_servingtarget:rooftop_slo_ttft_error_budget:ratio{{servingtarget="{TARGET}"}}'
    )
    return {"alerts": fired, "budget": budget, "slo": world.condition("SLOMet")}


def real_vllm(world: World, tiny_model_dir: Path) -> dict[str, Any]:
    """The real vLLM (CPU build) as a ``mode: vllm`` target's pod on the node, its
    tiny model from a PersistentVolumeClaim (tests/e2e/test_zero_loss.py's target): its
    own metrics, through the engine PodMonitor's relabelings as the Prometheus Operator
    generates them, reach the loop. The simulated target and its load go first: the
    node has two cores."""
    for loader in world.loaders:
        loader.terminate()
    world.cluster.kubectl("-n", world.targets, "delete", "servingtarget", TARGET, "--wait=false")
    with readable_copy(tiny_model_dir) as model_dir:
        doc = vllm_target(model_dir, 1)
        _model_claim(world.cluster, world.work, world.targets, world.pv, model_dir.parent)
        # the vLLM pod asks for what a GPU node has; this one has two cores
        webhook = RequestsWebhook(world.cluster, world.targets, cpu="500m", memory="4Gi")
        webhook.install()
        try:
            world.cluster.kubectl("-n", world.targets, "apply", "-f", "-", stdin=json.dumps(doc))
            return read_vllm(world, doc["metadata"]["name"])
        finally:
            webhook.close()


def read_vllm(world: World, name: str) -> dict[str, Any]:
    wait("the vLLM engine pod Ready",
         lambda: _one_ready(world.cluster, world.targets, f"rooftop.dev/servingtarget={name}"),
         VLLM_READY_S)  # fmt: skip
    world.loaders.append(load(world, 1, 16, name, SERVED))
    tpot = "vllm:request_time_per_output_token_seconds_count"
    series = world.prometheus.wait_for(f'{tpot}{{servingtarget="{name}"}}', timeout=DATA_S)

    def observed() -> dict[str, Any] | None:
        reading = world.target(name).get("status", {}).get("observed") or {}
        return reading if reading.get("tpotMs") else None

    reading = wait("the loop's reading of the vLLM engine", observed)
    return {"namespace": world.targets, "name": name, "series": series, "observed": reading}


@pytest.fixture(scope="module")
def run(
    cluster: ClusterHandle,
    real_node: RealNode,  # noqa: F811 (the imported fixture)
    prometheus_operator_dir: Path,
    tiny_model_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Run]:
    work = tmp_path_factory.mktemp("kps")
    _build("build-images.sh", "operator", log=work / "build-images.log")
    real_node.import_images(OPERATOR_IMAGE)
    suffix = uuid.uuid4().hex[:6]
    monitoring, system, targets = (f"{n}-{suffix}" for n in ("kps-monitoring", "kps-system", "kps"))
    for ns in (monitoring, system, targets):
        cluster.create_namespace(ns)
    prometheus = GeneratedPrometheus(work / "prometheus", cluster, monitoring, PROMETHEUS,
                                     host=real_node.gateway, port=free_port())  # fmt: skip
    world = World(cluster, real_node, prometheus, system, targets, work, f"kps-models-{suffix}")
    result = Run()
    stack = running(cluster, prometheus_operator_dir, monitoring, PROMETHEUS, KPS, work,
                    interval=INTERVAL)  # fmt: skip
    try:
        with stack, api_server_for_pods(cluster, real_node.gateway):
            installed = cluster.helm("install", RELEASE, str(CHART), "--namespace", system,
                                     *helm_values(real_node, prometheus.url))  # fmt: skip
            prometheus.start()
            wait("the operator pod Ready",
                 lambda: _one_ready(cluster, system, f"app.kubernetes.io/instance={RELEASE}"),
                 READY_S)  # fmt: skip
            cluster.kubectl("-n", targets, "apply", "-f", "-", stdin=json.dumps(target()))
            wait("the engine pod Ready",
                 lambda: _one_ready(cluster, targets, f"rooftop.dev/servingtarget={TARGET}"),
                 READY_S)  # fmt: skip
            world.loaders.append(load(world, 2, 32))
            for name, step in (("unselected", lambda: unselected(world, installed.stdout)),
                               ("selected", lambda: selected(world)),
                               ("breached", lambda: breached(world)),
                               ("vllm", lambda: real_vllm(world, tiny_model_dir))):  # fmt: skip
                result.phases[name] = step()
            yield result
    except Exception as err:  # the tests report where it stopped
        result.failed = f"{type(err).__name__}: {err}\n{debug(world)}"
        yield result
    finally:
        for loader in world.loaders:
            loader.terminate()
            loader.wait(timeout=30)
        prometheus.stop()
        cluster.kubectl("delete", "namespace", targets, "--wait=false", check=False)
        cluster.kubectl("delete", "pv", world.pv, "--wait=false", check=False)
        cluster.helm("uninstall", RELEASE, "--namespace", system, check=False)
        for ns in (system, monitoring):
            cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def debug(world: World) -> str:
    pods = world.cluster.kubectl("get", "pods", "-A", "-o", "wide", check=False).stdout
    logs = world.cluster.kubectl("-n", world.system, "logs", f"deploy/{RELEASE}", "--tail=30",
                                 check=False).stdout  # fmt: skip
    log = world.prometheus.log_path
    prom = log.read_text()[-2000:] if log.exists() else ""
    return f"pods:\n{pods[-3000:]}\noperator:\n{logs[-2500:]}\nprometheus:\n{prom}"


# ---------------------------------------------------------------- 1. unselected


def test_a_default_install_says_the_engines_go_unscraped(run: Run) -> None:
    """The NOTES warn at install time and name the flag that fixes it."""
    notes = run.need("unselected")["notes"]
    assert "WARNING: engine.podMonitor.labels is empty" in notes
    assert f"--set engine.podMonitor.labels.release={KPS}" in notes


def test_unscraped_engines_are_named_in_slomet_with_the_fix(run: Run) -> None:
    """The loop holds the replicas and says which chart value makes the PodMonitor
    selected; the Prometheus Operator generated no job for it."""
    phase = run.need("unselected")
    slo = phase["slo"]
    assert slo["status"] == "Unknown"
    assert "no engine series" in slo["message"]
    assert (
        f"PodMonitor {phase['namespace']}/{TARGET}-engine" in slo["message"]
        and "release=<its release>" in slo["message"]
    )
    assert not [j for j in phase["jobs"] if j.endswith(f"/{TARGET}-engine/0")], phase["jobs"]


def test_unscraped_engines_fire_the_metrics_missing_alert(run: Run) -> None:
    """RooftopEngineMetricsMissing, loaded through the rule selector, fires on the
    operator's own series once its hold (``prometheusRule.for``, 30 s here) is over."""
    (alert,) = run.need("unselected")["alerts"]
    assert alert["state"] == "firing", alert
    assert alert["labels"]["severity"] == "warning" and alert["labels"]["servingtarget"] == TARGET


# ---------------------------------------------------------------- 2. selected


def test_the_documented_label_gets_the_engines_scraped_with_the_loops_labels(run: Run) -> None:
    phase = run.need("selected")
    assert phase["up"], "no engine target up"
    labels = phase["up"][0]["metric"]
    assert labels["namespace"] == phase["namespace"] and labels["servingtarget"] == TARGET
    assert labels["pod"].startswith(f"{TARGET}-"), labels


def test_the_loop_judges_the_slo_from_the_scraped_engines(run: Run) -> None:
    phase = run.need("selected")
    assert phase["slo"]["status"] in ("True", "False"), phase["slo"]
    observed = phase["observed"] or {}
    assert observed.get("tpotMs", 0) > 0 and observed.get("requestsPerSecond", 0) > 0, observed


def test_the_operators_series_keep_the_targets_namespace(run: Run) -> None:
    """honorLabels: the ServingTarget's namespace, not the operator pod's, and no
    ``exported_namespace``."""
    phase = run.need("selected")
    labels = phase["operator_series"][0]["metric"]
    assert "exported_namespace" not in labels, labels
    assert labels["namespace"] == phase["namespace"] != phase["system"], labels


def test_every_dashboard_query_returns_data_as_scraped(run: Run) -> None:
    results = run.need("selected")["queries"]
    missing = dashboard_queries.empty(results)
    assert results and not missing, (
        f"dashboard queries without data: {json.dumps(missing, indent=1)}"
    )


def test_every_chart_rule_evaluates_and_a_healthy_target_raises_no_alert(run: Run) -> None:
    phase = run.need("selected")
    rules = [r for r in phase["rules"] if r["group"].startswith("rooftop")]
    assert len(rules) > 20, rules
    broken = {r.get("name") or r.get("alert"): r.get("lastError") for r in rules
              if r.get("health") != "ok"}  # fmt: skip
    assert not broken, broken
    assert phase["alerts"] == [], phase["alerts"]


# ---------------------------------------------------------------- 3. breached


def test_a_breach_fires_the_burn_rate_page_at_the_targets_own_percentile(run: Run) -> None:
    """The surge's slow first tokens spend the p99 target's 1 % error budget over 14.4x
    as fast as it allows, in the last hour and the last 5 minutes: the page fires, its
    budget read from the quantile the operator exports for this target."""
    phase = run.need("breached")
    [alert] = phase["alerts"]
    assert alert["labels"]["severity"] == "critical" and alert["labels"]["short_window"] == "5m"
    [budget] = phase["budget"]
    assert float(budget["value"][1]) == pytest.approx(0.01)
    assert phase["slo"]["status"] in ("False", "Unknown"), phase["slo"]


# ---------------------------------------------------------------- 4. the real vLLM


def test_the_real_vllm_engine_is_scraped_through_its_podmonitor(run: Run) -> None:
    """vLLM's own TPOT histogram, named as the loop reads it (``vllm:``), with the
    target's labels from the relabelings the Prometheus Operator generated."""
    phase = run.need("vllm")
    [series] = phase["series"]
    labels = series["metric"]
    assert labels["namespace"] == phase["namespace"] and labels["servingtarget"] == phase["name"]
    assert labels["model_name"] == SERVED, labels


def test_the_loop_reads_the_real_vllm_engine_through_it(run: Run) -> None:
    observed = run.need("vllm")["observed"]
    assert observed["tpotMs"] > 0 and observed.get("requestsPerSecond", 0) > 0, observed
