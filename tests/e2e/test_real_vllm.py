"""The operator with a real vLLM: plan, deploy, serve, measure, on the local control plane.

One scenario per module (``run``), then one promise per test, as in test_loop.py:

1. A ``mode: vllm`` ServingTarget serves a tiny Llama (tests/engine/tiny_model.py) from
   a PersistentVolumeClaim (a bound PV/PVC pair), its shape given inline in
   ``spec.modelConfig``: the planner plans it on a (kwok) L4 and the operator deploys it.
2. ``VllmFleet`` runs the Running pod's own container command and args as a local
   process with the real vLLM CPU build, on the pod's IP and port; a Prometheus on the
   Prometheus Operator's configuration for a kube-prometheus-stack-like ``Prometheus``
   finds it through the operator's PodMonitor (selector, relabelings,
   metricRelabelings, the stack's release label).
3. ``rooftop load`` drives traffic at the engine; the feedback loop fills
   ``status.observed`` with TPOT and TTFT read from the real engine's histograms through
   Prometheus, and every dashboard query returns series.
4. The engine speculates with the tiny model as its own drafter, and ``rooftop load``
   samples greedily: every draft is then the token the model would pick, so vLLM
   accepts them all (its spec-decode counters), and the loop must report that.

kwok runs no containers and there is no GPU: the pod's vLLM runs on this host's CPU
(``VLLM_CPU_KVCACHE_SPACE`` in the target's env sizes its KV cache), so latencies are
the tiny model's on a CPU, far below the SLO. The promises are about wiring, not speed.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from rooftop_api.spec import MODELS_MOUNT
from tests.cluster import dashboard_queries, prometheus_operator
from tests.cluster.handle import ClusterHandle
from tests.cluster.nodes import L4, gpu_node
from tests.cluster.operator_process import Operator
from tests.cluster.prometheus_operator import GeneratedPrometheus
from tests.cluster.vllm_engines import (
    SOURCE_PATH,
    HostPaths,
    VllmFleet,
    host_path,
    model_config,
    vllm_cli,
)
from tests.e2e.test_loop import PhaseFailed, Run

pytestmark = pytest.mark.vllm

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "rooftop"
RELEASE = "vllm-e2e"
GROUP, VERSION, PLURAL = "rooftop.dev", "v1alpha1", "servingtargets"
NAME = "tiny-chat"
SERVED = "tiny-llama"
CLAIM = "models"
PROMPT_TOKENS, OUTPUT_TOKENS = 64, 32
# Every prompt starts with the same 32 tokens, as a system prompt does: after the first
# request they are prefix-cache hits, 32/64 = 50 %. One KV block of 32 tokens: vLLM's CPU
# build defaults to 128-token blocks (a GPU's are 16), which a 64-token prompt never fills.
SHARED_TOKENS, BLOCK_TOKENS = 32, 32
# The engine drafts this many tokens per step with the model itself (greedy sampling
# accepts every one: the acceptance the loop must read is 1, which it plans as 0.99).
DRAFT_TOKENS = 2
# 150 requests: more than the 100 the loop needs before it plans with the served lengths
LOAD_RPS, LOAD_S = 2.0, 75.0
WINDOW_S = 60.0  # four scrapes of the engine's PodMonitor (builders.SCRAPE_INTERVAL)
INTERVAL = "5s"  # the stack's scrape and rule interval, and the operator's scrape
LOOP_ENV = {
    "ROOFTOP_LOOP_INTERVAL_S": "2",
    "ROOFTOP_LOOP_WINDOW": f"{WINDOW_S:g}s",
    "ROOFTOP_LOOP_STALE_AFTER_S": "40",
    "ROOFTOP_LOOP_STARTUP_S": "5",
}
# Dashboard queries that cannot return series here, and why (none so far: one engine
# and one operator give every panel data).
NO_DATA_EXPECTED: dict[str, str] = {}


def drafter(model_dir: Path) -> dict[str, Any]:
    """vLLM's speculative config: the model drafting for itself, from the same claim."""
    return {"method": "draft_model", "model": f"{MODELS_MOUNT}/{model_dir.name}",
            "num_speculative_tokens": DRAFT_TOKENS}  # fmt: skip


def target(model_dir: Path) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ServingTarget",
        "metadata": {"name": NAME},
        "spec": {
            "model": SERVED,
            "modelConfig": model_config(model_dir),
            "mode": "vllm",
            "slo": {"tpotMs": 500, "tpotPercentile": "p90", "ttftMs": 10000},
            "workload": {
                "requestsPerSecond": LOAD_RPS,
                "promptTokens": {"mean": PROMPT_TOKENS},
                "outputTokens": {"mean": OUTPUT_TOKENS},
                "prefix": {"sharedTokens": SHARED_TOKENS},
                "acceptanceRate": 0.99,
            },
            "budget": {"usdPerHour": 10},
            # vLLM's CPU build runs neither fp8 weights nor an fp8 KV cache: 16-bit only.
            "constraints": {"gpuTypes": ["l4"], "weightDtypes": ["bf16"], "kvDtypes": ["auto"],
                            "maxTensorParallel": 1, "minReplicas": 1, "maxReplicas": 1},
            "engine": {
                "modelVolume": {"claimName": CLAIM, "path": model_dir.name},
                "extraArgs": ["--block-size", str(BLOCK_TOKENS),
                              "--speculative-config", json.dumps(drafter(model_dir))],
                "env": [
                    {"name": "VLLM_CPU_KVCACHE_SPACE", "value": "1"},  # GiB
                    {"name": "HF_HUB_OFFLINE", "value": "1"},  # the model is on the PVC
                ],
            },
        },
    }  # fmt: skip


@dataclass
class World:
    cluster: ClusterHandle
    api: Any
    namespace: str
    operator: Operator
    prometheus: GeneratedPrometheus
    fleet: VllmFleet
    work: Path
    model_dir: Path

    def target(self) -> dict[str, Any]:
        found: Any = client.CustomObjectsApi(self.api).get_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, NAME
        )
        return dict(found)

    def conditions(self) -> dict[str, dict[str, Any]]:
        conds = self.target().get("status", {}).get("conditions", [])
        return {c["type"]: dict(c) for c in conds}

    def pod(self) -> dict[str, Any]:
        pods = client.CoreV1Api(self.api).list_namespaced_pod(
            self.namespace, label_selector=f"rooftop.dev/servingtarget={NAME}"
        )
        return dict(self.api.sanitize_for_serialization(pods.items[0]))


def wait(world: World, what: str, check: Callable[[], Any], timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(1.0)
    raise PhaseFailed(
        f"timed out after {timeout:.0f}s: {what}\nconditions: {world.conditions()}\n"
        f"fleet errors: {world.fleet.errors}\noperator log:\n{world.operator.tail(25)}"
    )


# ---------------------------------------------------------------- phases


def deployed(world: World) -> dict[str, Any]:
    def planned_and_deployed() -> dict[str, dict[str, Any]] | None:
        conds = world.conditions()
        ok = all(conds.get(c, {}).get("status") == "True" for c in ("Planned", "Deployed"))
        return conds if ok else None

    conds = wait(world, "Planned and Deployed", planned_and_deployed, 90)
    pod = wait(world, "a Running engine pod", lambda: _running(world), 60)
    return {"conditions": conds, "pod": pod, "plan": world.target()["status"].get("plan"),
            "model_path": f"/models/{world.model_dir.name}"}  # fmt: skip


def _running(world: World) -> dict[str, Any] | None:
    try:
        pod = world.pod()
    except IndexError:
        return None
    return pod if pod["status"].get("phase") == "Running" else None


def serving(world: World) -> dict[str, Any]:
    """The real vLLM for the pod answers /health and Prometheus scrapes it."""
    t = time.monotonic()
    urls = wait(
        world, "the pod's vLLM ready", lambda: _no_errors(world) and world.fleet.endpoints(), 240
    )
    started_s = time.monotonic() - t
    sel = f'namespace="{world.namespace}", servingtarget="{NAME}"'
    up = world.prometheus.wait_for(f"vllm:num_requests_running{{{sel}}}", timeout=60)
    name = world.pod()["metadata"]["name"]
    launched = json.loads((world.work / "engines" / f"{name}.argv.json").read_text())
    return {"urls": urls, "ready_s": round(started_s, 1), "scraped": up, "launched": launched}


def _no_errors(world: World) -> bool:
    """Fail fast on what the fleet could not do (it keeps retrying otherwise)."""
    if world.fleet.errors:
        raise PhaseFailed(f"engine fleet: {world.fleet.errors[-1]}")
    return True


def loaded(world: World, url: str) -> dict[str, Any]:
    """``rooftop load`` against the engine; meanwhile the loop must observe it and the
    dashboards must have data (rates over a window that holds traffic)."""
    argv = [sys.executable, "-m", "rooftop_cli.main", "load", "--url", url,
            "--model", SERVED, "--rate", f"{LOAD_RPS:g}", "--duration", f"{LOAD_S:g}",
            "--prompt-tokens", str(PROMPT_TOKENS), "--output-tokens", str(OUTPUT_TOKENS),
            "--shared-prefix-tokens", str(SHARED_TOKENS), "--temperature", "0",
            "--seed", "3", "--json", "--quiet"]  # fmt: skip
    env = os.environ | {"PYTHONPATH": SOURCE_PATH}
    load = subprocess.Popen(
        argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        observed = wait(world, "status.observed TPOT and TTFT", lambda: _observed(world), LOAD_S)
        panels = wait(world, "data on every dashboard panel", lambda: _dashboards(world), 20)
        out, err = load.communicate(timeout=LOAD_S + 60)
    finally:
        if load.poll() is None:
            load.kill()
    if load.returncode != 0:
        raise PhaseFailed(f"rooftop load exited {load.returncode}\n{err[-2000:]}")
    served = wait(world, "status.observed.workload", lambda: _served_workload(world), 30)
    return {"observed": observed, "conditions": world.conditions(),
            "report": json.loads(out), "queries": panels, "served": served}  # fmt: skip


def _served_workload(world: World) -> dict[str, Any] | None:
    """The served lengths, the prefix cache's hit ratio and the WorkloadObserved
    condition, once the loop plans with them."""
    observed = world.target().get("status", {}).get("observed", {})
    workload, hits = observed.get("workload"), observed.get("prefixCacheHitRatio")
    accepted = observed.get("acceptedDraftTokens")
    condition = world.conditions().get("WorkloadObserved", {})
    said = condition.get("message", "")
    ready = workload and hits is not None and "prefix-cache hits" in said
    if not (ready and accepted is not None and "drafts accepted at" in said):
        return None
    return {"workload": workload, "hits": hits, "accepted": accepted, "condition": condition}


def _observed(world: World) -> dict[str, Any] | None:
    observed = dict(world.target().get("status", {}).get("observed", {}))
    ok = observed.get("metricsState") == "ok" and "tpotMs" in observed and "ttftMs" in observed
    return observed if ok else None


def _dashboards(world: World) -> dict[str, Any] | None:
    """Every panel's query once all have data (the loop may be ahead of a rate window)."""
    results = _dashboard_queries(world)
    missing = [k for k, r in results.items() if not r["optional"] and not r["series"]]
    return results if not missing or set(missing) <= set(NO_DATA_EXPECTED) else None


def _dashboard_queries(world: World) -> dict[str, Any]:
    return dashboard_queries.run_all(world.prometheus, world.namespace, NAME, f"{WINDOW_S:g}s")


def counted(world: World, completed: int) -> dict[str, Any]:
    """What Prometheus counted from the engine once the last scrape has it."""
    sel = f'namespace="{world.namespace}", servingtarget="{NAME}"'
    promql = f"sum by (finished_reason) (vllm:request_success_total{{{sel}}})"

    def every_request(result: list[dict[str, Any]]) -> bool:
        return sum(float(s["value"][1]) for s in result) >= completed

    return {"success": world.prometheus.wait_for(promql, every_request, timeout=30)}


def scenario(world: World, run: Run) -> None:
    steps: list[tuple[str, Callable[[], dict[str, Any]]]] = [
        ("deployed", lambda: deployed(world)),
        ("serving", lambda: serving(world)),
        ("loaded", lambda: loaded(world, run.phases["serving"]["urls"][0])),
        ("counted", lambda: counted(world, run.phases["loaded"]["report"]["completed"])),
    ]
    for name, step in steps:
        t = time.monotonic()
        try:
            run.phases[name] = step() | {"took_s": round(time.monotonic() - t, 1)}
        except (PhaseFailed, TimeoutError) as err:
            run.failed = f"{name}: {err}"
            return


# ---------------------------------------------------------------- fixtures


def _apply(cluster: ClusterHandle, work: Path, doc: dict[str, Any], *args: str) -> None:
    path = work / f"{doc['kind'].lower()}-{doc['metadata']['name']}.yaml"
    path.write_text(yaml.safe_dump(doc))
    cluster.kubectl("apply", *args, "-f", str(path))


def model_claim(cluster: ClusterHandle, work: Path, ns: str, pv: str) -> None:
    """A PV bound to the ``models`` PVC (a pod with an unbound claim never schedules).
    The hostPath is never mounted (kwok runs nothing); the harness maps the claim to the
    host directory that holds the model instead."""
    spec = {"accessModes": ["ReadOnlyMany"], "storageClassName": ""}
    _apply(cluster, work, {
        "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": pv},
        "spec": spec | {"capacity": {"storage": "1Gi"}, "hostPath": {"path": "/srv/models"},
                        "persistentVolumeReclaimPolicy": "Retain",
                        "claimRef": {"namespace": ns, "name": CLAIM}},
    })  # fmt: skip
    _apply(cluster, work, {
        "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": CLAIM},
        "spec": spec | {"volumeName": pv, "resources": {"requests": {"storage": "1Gi"}}},
    }, "-n", ns)  # fmt: skip
    cluster.kubectl("wait", "-n", ns, "--for=jsonpath={.status.phase}=Bound",
                    "--timeout=60s", f"pvc/{CLAIM}")  # fmt: skip


@pytest.fixture(scope="module")
def run(
    cluster: ClusterHandle,
    prometheus_operator_dir: Path,
    vllm_py: Path,
    tiny_model_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Run]:
    suffix = uuid.uuid4().hex[:6]
    system, ns = f"vllm-system-{suffix}", f"vllm-{suffix}"
    work = tmp_path_factory.mktemp("real-vllm")
    (work / "engines").mkdir()
    cluster.create_namespace(system)
    cluster.create_namespace(ns)
    node = gpu_node(dataclasses.replace(L4, prefix=f"vllm-l4-{suffix}"), 0)
    client.CoreV1Api(api := cluster.api()).create_node(node)  # type: ignore[arg-type]
    pv = f"vllm-models-{suffix}"
    model_claim(cluster, work, ns, pv)
    paths = HostPaths(claims={CLAIM: tiny_model_dir.parent}, scratch=work / "pods")
    fleet = VllmFleet(api, ns, NAME, vllm_cli(vllm_py), paths, work / "engines")
    result = Run()
    release = prometheus_operator.monitored_release(
        cluster, prometheus_operator_dir, CHART, RELEASE, (system, ns), work, interval=INTERVAL
    )
    try:
        with release as installed:
            world = World(cluster, api, ns, installed.operator, installed.prometheus, fleet,
                          work, tiny_model_dir)  # fmt: skip
            try:
                installed.operator.start(*installed.operator_args(),
                                         **installed.operator_env(), **LOOP_ENV)  # fmt: skip
                fleet.start()
                _apply(cluster, work, target(tiny_model_dir), "-n", ns)
                scenario(world, result)
                yield result
            finally:
                fleet.stop()
                (work / "run.json").write_text(json.dumps(dataclasses.asdict(result), indent=1))
    finally:
        cluster.delete_later("namespace", ns, system)
        cluster.delete_later("node", node["metadata"]["name"])
        cluster.delete_later("pv", pv)
        api.close()


# ---------------------------------------------------------------- the promises


def test_the_tiny_model_from_a_pvc_is_planned_and_deployed(run: Run) -> None:
    phase = run.need("deployed")
    plan, pod = phase["plan"], phase["pod"]
    assert plan["gpu"] == "l4" and plan["weightDtype"] == "bf16", plan
    container = pod["spec"]["containers"][0]
    assert container["command"] == ["vllm", "serve"]
    assert container["args"][0] == phase["model_path"]  # spec.engine.modelVolume.path
    claims = [v["persistentVolumeClaim"]["claimName"] for v in pod["spec"]["volumes"]
              if "persistentVolumeClaim" in v]  # fmt: skip
    assert claims == [CLAIM]


def test_the_real_engine_runs_the_pods_own_command(run: Run) -> None:
    """Only volume paths (the PVC's host directory, temp dirs for the others; the
    drafter's in its --speculative-config too) and --host (the pod's IP) differ."""
    pod = run.need("deployed")["pod"]
    launched = run.need("serving")["launched"]
    container = pod["spec"]["containers"][0]
    argv = launched["argv"]
    assert Path(argv[0]).name == "vllm" and argv[1] == "serve"
    env, mounts = launched["env"], {k: Path(v) for k, v in launched["mounts"].items()}
    pod_args, local_args = container["args"], argv[2:]
    assert local_args[0].endswith(container["args"][0].removeprefix("/models"))
    assert Path(local_args[0], "config.json").is_file()
    assert local_args[1 : len(pod_args)] == [host_path(a, mounts) for a in pod_args[1:]]
    drafter = json.loads(pod_args[pod_args.index("--speculative-config") + 1])["model"]
    assert drafter.startswith("/models/") and not any(drafter in a for a in local_args)
    assert local_args[len(pod_args) :] == ["--host", pod["status"]["podIP"]]
    pod_env = {v["name"]: v["value"] for v in container["env"]}
    for name, value in pod_env.items():
        assert env[name] == host_path(value, mounts), name
    # HF_HOME is on the model-cache volume: a directory here, not the container's path
    assert env["HF_HOME"] != pod_env["HF_HOME"] and Path(env["HF_HOME"]).is_dir()


def test_prometheus_scrapes_it_through_the_pod_monitor(run: Run) -> None:
    """The Prometheus Operator's job for the engine PodMonitor found the pod and
    scraped its IP at the named port."""
    pod = run.need("deployed")["pod"]
    labels = run.need("serving")["scraped"][0]["metric"]
    # namespace and servingtarget come from the PodMonitor's relabelings, job, pod and
    # instance from the Prometheus Operator's, model_name and engine from vLLM itself
    assert labels["servingtarget"] == NAME and labels["namespace"] == pod["metadata"]["namespace"]
    assert labels["job"] == f"{labels['namespace']}/{NAME}-engine"
    assert labels["pod"] == pod["metadata"]["name"]
    assert labels["instance"] == f"{pod['status']['podIP']}:8000"
    assert labels["model_name"] == SERVED and labels["engine"] == "0"


def test_rooftop_load_is_served_by_the_real_engine(run: Run) -> None:
    report = run.need("loaded")["report"]
    assert report["errors"] == 0, report
    assert report["completed"] >= LOAD_RPS * LOAD_S / 3, report
    counted_ = run.need("counted")["success"]
    by_reason = {s["metric"]["finished_reason"]: float(s["value"][1]) for s in counted_}
    # ignore_eos with max_tokens: every request ends at its length, and vLLM counted each
    assert by_reason["length"] == report["completed"], by_reason


def test_status_observed_reads_the_real_engines_latency(run: Run) -> None:
    phase = run.need("loaded")
    observed, client_tpot = phase["observed"], phase["report"]["tpot_s"]
    assert observed["metricsState"] == "ok"
    assert 0 < observed["tpotMs"] < 500 and 0 < observed["ttftMs"] < 10000, observed
    # The loop's p90 of vLLM's inter-token histogram, interpolated within its first
    # bucket (10 ms) or beyond: never far below what the client measured.
    assert observed["tpotMs"] >= min(client_tpot["p50"] * 1e3, 10.0) / 2, (observed, client_tpot)
    assert phase["conditions"]["SLOMet"]["status"] == "True", phase["conditions"]["SLOMet"]


def test_the_loop_plans_with_the_lengths_the_real_engine_served(run: Run) -> None:
    """vLLM's own length histograms, through Prometheus over 15 minutes: every request
    had 64 prompt and 32 output tokens, which the means give exactly (sum over count);
    the quantiles are interpolated within vLLM's 1-2-5 buckets (64 lies in 50-100)."""
    served = run.need("loaded")["served"]
    prompt, output = served["workload"]["promptTokens"], served["workload"]["outputTokens"]
    assert prompt["mean"] == PROMPT_TOKENS and output["mean"] == OUTPUT_TOKENS, served
    assert 50 <= prompt["p50"] <= 100 and 20 <= output["p50"] <= 50, served
    # as declared: the buckets' reach is no difference to report
    lengths = ("spec.workload.promptTokens", "spec.workload.outputTokens")
    assert not differing(served["condition"], *lengths), served["condition"]


def test_the_loop_plans_with_the_real_engines_prefix_cache_hits(run: Run) -> None:
    """vLLM's own prefix-cache counters, through Prometheus: every prompt's first 32 of 64
    tokens are the same block, so all but the first request find them (50 %).
    The loop's WorkloadObserved message carries the ratio it plans with, and the stated
    sharedTokens predict it, so nothing differs from the spec."""
    served = run.need("loaded")["served"]
    # the bound's slack: requests of other phases, with prompts of their own
    assert 0.4 <= served["hits"] <= SHARED_TOKENS / PROMPT_TOKENS, served
    condition = served["condition"]
    assert "of prompt tokens prefix-cache hits" in condition["message"], condition
    assert not differing(condition, "spec.workload.prefix"), condition


def test_the_loop_reads_the_acceptance_the_real_engine_met(run: Run) -> None:
    """vLLM's spec-decode counters, through Prometheus: with the model as its own
    drafter and greedy sampling every draft token is accepted, so each verified step
    accepts all 2 (``acceptedDraftTokens``), and the loop plans with a per-token
    acceptance of 0.99 (its ceiling), as the spec declares: nothing differs."""
    served = run.need("loaded")["served"]
    assert served["accepted"] == pytest.approx(DRAFT_TOKENS, abs=0.05), served
    condition = served["condition"]
    assert "drafts accepted at 0.99 per token" in condition["message"], condition
    assert not differing(condition, "spec.workload.acceptanceRate"), condition


def differing(condition: dict[str, Any], *fields: str) -> list[str]:
    """Which of ``fields`` WorkloadObserved names as differing from the spec. Each test
    checks its own figure: how bursty the load generator's arrivals reach the engine
    (``arrivalDispersion``) depends on how busy the machine is while vLLM's CPU build
    computes beside it, and is no figure of the engine's."""
    if condition["reason"] == "AsDeclared":
        return []
    return [field for field in fields if field in condition["message"]]


def test_every_dashboard_query_returns_series_from_the_real_engine(run: Run) -> None:
    results = run.need("loaded")["queries"]
    empty = {k: r["expr"] for k, r in results.items()
             if not r["optional"] and not r["series"] and k not in NO_DATA_EXPECTED}  # fmt: skip
    assert not empty, f"dashboard queries without data: {json.dumps(empty, indent=1)}"
