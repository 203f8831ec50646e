"""The Prometheus Operator, and a real Prometheus on the configuration it generates.

The operator binary and its CRDs come from tests/cluster/build-prometheus-operator.sh
(built from its Go module). It runs as a host process against the local control plane
and does what it does in any cluster: it selects PodMonitors and PrometheusRules for
each ``Prometheus`` resource and writes that Prometheus' configuration to the
``prometheus-<name>`` Secret and its rule files to ``prometheus-<name>-rulefiles-*``
ConfigMaps.

In a cluster its StatefulSet's Prometheus container loads them, mounted under
/etc/prometheus, with a config-reloader sidecar that expands ``$(POD_NAME)`` and
reloads the server on every change. ``GeneratedPrometheus`` plays that sidecar for a
Prometheus process on this machine: it copies the Secret's configuration and the rule
ConfigMaps into its work directory and reloads the server whenever either changes. It
changes only what a pod would get from its mounts and environment: the rule files'
directory, ``$(POD_NAME)``, and the in-cluster API credentials Kubernetes service
discovery reads from the ServiceAccount mount, given instead as ``kubeconfig_file``.
Selection, relabeling, ``honor_labels``, intervals and rules are the operator's own.
Pods it discovers must be reachable from this machine: the real node's are
(tests/cluster/realnode.py), and so are the processes a test binds to a kwok pod's
loopback IP (tests/cluster/engines.py).
"""

from __future__ import annotations

import base64
import contextlib
import gzip
import hashlib
import json
import re
import subprocess
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from tests.cluster.controlplane import free_port, parent_death_signal
from tests.cluster.handle import ClusterHandle, wait_until
from tests.cluster.operator_process import Operator
from tests.cluster.prometheus import PrometheusServer, find_prometheus

STACK_RELEASE = "kps"  # the kube-prometheus-stack release a closed-loop test's stack mimics
STACK_PROMETHEUS = "kps-prometheus"  # and that release's Prometheus resource
RULES_DIR = "/etc/prometheus/rules/"  # where the operator's StatefulSet mounts rule files
ENV_VAR = re.compile(r"\$\(([A-Z_]+)\)")  # $(POD_NAME): the config-reloader expands them


def kps_prometheus(
    name: str, release: str, *, version: str, interval: str = "30s"
) -> dict[str, Any]:
    """A Prometheus as kube-prometheus-stack 88's values render it by default: monitors
    and rules selected by its release label (``*SelectorNilUsesHelmValues: true``), in
    every namespace (empty namespace selectors). ``version`` is the server's, so the
    configuration is generated for the binary that runs it; ``interval`` is the scrape
    and evaluation interval (the stack's ``prometheusSpec.scrapeInterval``, 30 s by
    default; tests shorten it)."""
    by_release = {"matchLabels": {"release": release}}
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "Prometheus",
        "metadata": {"name": name, "labels": {"release": release}},
        "spec": {
            "version": version,
            "replicas": 1,
            "scrapeInterval": interval,
            "evaluationInterval": interval,
            "podMonitorSelector": by_release,
            "podMonitorNamespaceSelector": {},
            "serviceMonitorSelector": by_release,
            "serviceMonitorNamespaceSelector": {},
            "ruleSelector": by_release,
            "ruleNamespaceSelector": {},
            "probeSelector": by_release,
            "scrapeConfigSelector": by_release,
        },
    }


def install_crds(cluster: ClusterHandle, crds: Path) -> list[str]:
    """The release's CRDs, server-side (the Prometheus CRD is over the 256 KiB a
    client-side apply's annotation may hold); their names."""
    # BaseLoader: an enum of the CRDs holds "=", YAML 1.1's value tag to the safe loader
    names = [yaml.load(p.read_text(), yaml.BaseLoader)["metadata"]["name"]
             for p in sorted(crds.glob("*.yaml"))]  # fmt: skip
    for name in names:  # an earlier module's, deleted without waiting: an apply would
        _gone_unless_live(cluster, name)  # not revive it, and it would vanish mid-test
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crds))
    for name in names:
        cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", f"crd/{name}")
    return names


def _gone_unless_live(cluster: ClusterHandle, crd: str, timeout: float = 120.0) -> None:
    """Wait until ``crd`` is either absent or not being deleted."""

    def settled() -> bool:
        found = cluster.kubectl("get", "crd", crd, "-o",
                                "jsonpath={.metadata.deletionTimestamp}", check=False)  # fmt: skip
        return found.returncode != 0 or not found.stdout.strip()

    wait_until(settled, timeout, f"CRD {crd} deleted")


def start_prometheus_operator(binary: Path, kubeconfig: Path, log: Path) -> subprocess.Popen[bytes]:
    argv = [str(binary), "--log-level=info", f"--web.listen-address=127.0.0.1:{free_port()}"]
    with log.open("ab") as out:
        return subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, env={"KUBECONFIG": str(kubeconfig)},
            start_new_session=True, preexec_fn=parent_death_signal,
        )  # fmt: skip


@contextlib.contextmanager
def running(
    cluster: ClusterHandle,
    built: Path,
    namespace: str,
    prometheus: str,
    release: str,
    work: Path,
    *,
    interval: str = "30s",
) -> Iterator[None]:
    """While inside: the built Prometheus Operator (``built``: bin/operator and crds/)
    watches the cluster, and a kube-prometheus-stack-like ``Prometheus`` named
    ``prometheus`` in ``namespace`` (``kps_prometheus``) selects by ``release``, for
    the Prometheus binary the tests run. On the way out the operator stops and its CRDs
    go: later modules stand in their own PodMonitor API, or none."""
    binary = find_prometheus()
    if binary is None:
        raise FileNotFoundError("no prometheus binary: run tests/cluster/fetch-prometheus.sh")
    crds = install_crds(cluster, built / "crds")
    operator = start_prometheus_operator(built / "bin" / "operator", cluster.kubeconfig,
                                         work / "po.log")  # fmt: skip
    try:
        spec = kps_prometheus(prometheus, release, version=server_version(binary),
                              interval=interval)  # fmt: skip
        cluster.kubectl("apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump(spec))
        yield
    finally:
        operator.terminate()
        operator.wait(timeout=20)
        for name in crds:
            cluster.kubectl("delete", "crd", name, "--wait=false", check=False)
        for name in crds:  # gone before the next module looks for a PodMonitor API
            _gone_unless_live(cluster, name)


def stack_chart_values(metrics_port: int, interval: str) -> list[str]:
    """``helm install`` flags of a kube-prometheus-stack user (docs/operating.md): the
    operator's PodMonitor on, scraped every ``interval``, and the engines' PodMonitors
    labelled with the stack's release. The operator's metrics on ``metrics_port`` (a
    free port: a test's operator process binds it on every local address, the kwok
    pod's loopback IP among them)."""
    release = f"release={STACK_RELEASE}"
    return ["--set", "image.tag=e2e", "--set", f"metrics.port={metrics_port}",
            "--set", "metrics.podMonitor.enabled=true",
            "--set-string", f"metrics.podMonitor.interval={interval}",
            "--set-string", f"metrics.podMonitor.labels.{release}",
            "--set-string", f"engine.podMonitor.labels.{release}"]  # fmt: skip


@contextlib.contextmanager
def stack(
    cluster: ClusterHandle, built: Path, namespace: str, work: Path, *, interval: str
) -> Iterator[GeneratedPrometheus]:
    """``running`` the stack-like Prometheus ``STACK_PROMETHEUS`` in ``namespace``, and
    a ``GeneratedPrometheus`` started on its configuration (stopped on the way out)."""
    with running(cluster, built, namespace, STACK_PROMETHEUS, STACK_RELEASE, work,
                 interval=interval):  # fmt: skip
        prometheus = GeneratedPrometheus(work / "prometheus", cluster, namespace,
                                         STACK_PROMETHEUS).start()  # fmt: skip
        try:
            yield prometheus
        finally:
            prometheus.stop()


@dataclass(frozen=True)
class MonitoredRelease:
    """The chart installed as a kube-prometheus-stack user installs it, the stack's
    Prometheus, and the operator to run as a process (a kwok pod runs no container)
    with the chart's ServiceAccount, metrics port and engines' label."""

    prometheus: GeneratedPrometheus
    operator: Operator
    metrics_port: int

    def operator_args(self) -> tuple[str, ...]:
        return ("--metrics-port", str(self.metrics_port))

    def operator_env(self) -> dict[str, str]:
        """What the chart's Deployment would set from ``stack_chart_values``: this
        Prometheus, and the engines' label."""
        labels = json.dumps({"release": STACK_RELEASE})
        return {"ROOFTOP_PROMETHEUS_URL": self.prometheus.url, "ROOFTOP_PODMONITOR_LABELS": labels}


@contextlib.contextmanager
def monitored_release(
    cluster: ClusterHandle,
    built: Path,
    chart: Path,
    release: str,
    namespaces: tuple[str, str],
    work: Path,
    *,
    interval: str,
) -> Iterator[MonitoredRelease]:
    """``stack`` in the release's namespace and the chart installed there for it
    (``stack_chart_values``); ``namespaces``: (the release's, the one its operator
    watches). On the way out the operator stops and the release goes; the namespaces
    are the caller's to delete."""
    system, targets = namespaces
    with stack(cluster, built, system, work, interval=interval) as prometheus:
        port = free_port()
        values = stack_chart_values(port, interval)
        cluster.helm("install", release, str(chart), "--namespace", system, *values)
        try:
            kubeconfig = cluster.serviceaccount_kubeconfig(system, f"{release}-rooftop")
            operator = Operator(kubeconfig, targets, work / "operator.log")
            try:
                yield MonitoredRelease(prometheus, operator, port)
            finally:
                operator.stop()
        finally:
            cluster.helm("uninstall", release, "--namespace", system, check=False)


def server_version(binary: Path) -> str:
    """``v2.53.3`` from ``prometheus, version 2.53.3+ds1 (...)``."""
    out = subprocess.run([str(binary), "--version"], capture_output=True, text=True, check=True)
    number = out.stdout.split()[2].split("+")[0]
    return f"v{number}"


def generated_config(api: Any, namespace: str, name: str) -> dict[str, Any]:
    """The configuration the Prometheus Operator generated (its Secret), or {}."""
    try:
        secret = client.CoreV1Api(api).read_namespaced_secret(f"prometheus-{name}", namespace)
    except client.ApiException:
        return {}
    raw = (secret.data or {}).get("prometheus.yaml.gz")
    if not raw:
        return {}
    parsed: dict[str, Any] = yaml.safe_load(gzip.decompress(base64.b64decode(raw)))
    return parsed


def rule_config_maps(api: Any, namespace: str, name: str) -> dict[str, dict[str, str]]:
    """Every rule ConfigMap the Prometheus Operator rendered for that Prometheus:
    ConfigMap name -> file name -> rules."""
    maps = client.CoreV1Api(api).list_namespaced_config_map(
        namespace, label_selector=f"prometheus-name={name}"
    )
    found: dict[str, dict[str, str]] = {}
    for config_map in maps.items:
        assert config_map.metadata is not None and config_map.metadata.name
        found[config_map.metadata.name] = dict(config_map.data or {})
    return found


def as_mounted(
    config: Mapping[str, Any], *, rules_dir: Path, kubeconfig: Path, env: Mapping[str, str]
) -> dict[str, Any]:
    """The generated configuration as a pod's mounts and environment would give it to
    the server: rule files under ``rules_dir``, ``$(VAR)`` expanded from ``env`` (the
    StatefulSet's ``POD_NAME`` and ``SHARD``), and the API server's credentials (in a
    pod, the ServiceAccount mount) as a kubeconfig.

    Raises:
        ValueError: it names another file under /etc/prometheus (a secret, a
            certificate), a mount this harness does not provide, or a variable
            ``env`` lacks.
    """
    text = ENV_VAR.sub(lambda m: _env(env, m.group(1)), yaml.safe_dump(dict(config)))
    text = text.replace(RULES_DIR, f"{rules_dir}/")
    if "/etc/prometheus/" in text:
        line = next(x for x in text.splitlines() if "/etc/prometheus/" in x)
        raise ValueError(f"the generated configuration needs a mount: {line.strip()}")
    mounted: dict[str, Any] = yaml.safe_load(text)
    for job in mounted.get("scrape_configs") or []:
        for sd in job.get("kubernetes_sd_configs") or []:
            sd.setdefault("kubeconfig_file", str(kubeconfig))
    return mounted


def _env(env: Mapping[str, str], name: str) -> str:
    if name not in env:
        raise ValueError(f"the generated configuration reads ${name}: give it in env")
    return env[name]


class GeneratedPrometheus(PrometheusServer):
    """A Prometheus process on what the Prometheus Operator generates for ``name`` in
    ``namespace``, followed as its config-reloader would follow it (every ``poll_s``).

    ``host`` is the address it listens on: the real node's bridge address lets the
    node's pods (an in-cluster operator's feedback loop) query it.
    """

    def __init__(
        self,
        workdir: Path,
        cluster: ClusterHandle,
        namespace: str,
        name: str,
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        poll_s: float = 1.0,
    ) -> None:
        super().__init__(workdir, host=host, port=port)
        self.cluster = cluster
        self.namespace, self.name = namespace, name
        self.poll_s = poll_s
        self.rules_dir = workdir / "rules"
        self._mounted: dict[str, Any] = {}
        self._api: Any = None  # an API client while it runs
        self._seen = ""
        self._stop = threading.Event()
        self._follower: threading.Thread | None = None

    def generated(self) -> dict[str, Any]:
        return generated_config(self._api, self.namespace, self.name)

    def wait_generated(self, timeout: float = 90.0) -> None:
        self._wait(lambda: bool(self.generated()), timeout, "the generated configuration")

    def start(self, timeout: float = 60.0) -> GeneratedPrometheus:
        self._api = self.cluster.api()
        self.wait_generated()
        self._sync()
        super().start(timeout)
        self._stop.clear()
        self._follower = threading.Thread(target=self._follow, name="config-reloader", daemon=True)
        self._follower.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._follower is not None:
            self._follower.join(timeout=10)
            self._follower = None
        super().stop()
        if self._api is not None:
            self._api.close()
            self._api = None

    def _follow(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                if self._sync():
                    self.reload()
            except Exception as err:  # noqa: BLE001 (a reloader logs and retries)
                with self.log_path.open("a") as log:
                    log.write(f"config-reloader: {err}\n")

    def _sync(self) -> bool:
        """Write the generated configuration and rule files when either changed."""
        config, maps = self.generated(), rule_config_maps(self._api, self.namespace, self.name)
        digest = hashlib.sha256(yaml.safe_dump([config, maps]).encode()).hexdigest()
        if not config or digest == self._seen:
            return False
        for map_name, files in maps.items():
            folder = self.rules_dir / map_name
            folder.mkdir(parents=True, exist_ok=True)
            for old in folder.glob("*"):
                if old.name not in files:
                    old.unlink()
            for file_name, rules in files.items():
                (folder / file_name).write_text(rules)
        self._mounted = as_mounted(config, rules_dir=self.rules_dir,
                                   kubeconfig=self.cluster.kubeconfig,
                                   env={"POD_NAME": f"prometheus-{self.name}-0",
                                        "SHARD": "0"})  # fmt: skip
        self._seen = digest
        self._write_config()
        return True

    def _config(self) -> dict[str, Any]:
        return self._mounted
