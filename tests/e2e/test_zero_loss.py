"""Lost requests under load while Rooftop changes the fleet, on the real node.

One scenario per module (``run``), then one assertion per event. A ``mode: vllm``
ServingTarget (the tiny model from a hostPath PV/PVC, minReplicas = maxReplicas = 2)
is deployed by the operator onto the real kubelet node (tests/cluster/realnode.py), in
the local vLLM CPU image. Open-loop Poisson load runs from this host against the
target's ClusterIP Service from two clients: ``rooftop load``'s own request code
(``rooftop_sim.loadgen.send_request``: one aiohttp session, keep-alive connections,
a stream counts as served only when it ends with ``data: [DONE]``), and the OpenAI
Python client from the vLLM venv (tests/cluster/openai_load.py: httpx keep-alive
connections and the client's default retries, a stream served when it finished with
every token). After a 20 s
baseline, each event runs while the load runs, and records the requests sent in its
window (from 5 s before the action, so the requests in flight at the action count, to
the moment the target is Ready with its desired pods and no pod terminating), how many
failed, how many of those were cut streams, and the seconds until recovery:

1. rollout: a new env var in spec.engine.env changes the pod template;
2. operator-kill: the operator SIGKILLed and restarted;
3. engine-kill: one engine's container SIGKILLed (ctr): only the requests in flight on
   it may fail, and every request sent after it is served;
4. drain: ``kubectl drain`` of the (only) real node: the PDB (maxUnavailable 1) lets
   the first eviction proceed and holds the second; then uncordon;
5. scale-down: minReplicas = maxReplicas = 1;
6. before: for comparison, a plain Deployment of the same image as Rooftop rendered it
   before (``--shutdown-timeout 0``, no preStop), rolled out (an env var added) and then
   scaled 2 -> 1 under the same load.

After each event the previous log of any engine container that restarted is kept in
the work directory (``previous-POD-CONTAINER.log``) and the event names it.

Both scale-downs add BURST long streams just before the change, so the pod that stops
certainly holds requests (at RATE alone a pod often holds none at that instant).

Through a ClusterIP, kept-alive connections stay pinned to a pod after it leaves the
endpoints, and vLLM, once draining, refuses new requests (HTTP 200, ``data: [DONE]``
and no token). The engine pods' drain middleware and preStop (rooftop_operator/
engine_drain.py) move those clients to other pods before SIGTERM; the "before" row
shows what a pod without them, and with vLLM's default abort, loses.

Out of scope here: the operator runs as a HOST process (tests/cluster/operator_process),
not as the chart's pod: the local API server listens on 127.0.0.1, which pods cannot
reach. The chart's CRD and RBAC are installed with helm and the process authenticates
as the chart's ServiceAccount.

Harness adaptations, both stated: the kwok H100 nodes are cordoned for the module (the
target's nodeSelector also requires the real node's label), and a mutating webhook
(tests/cluster/requests_webhook.py) lowers the engine pods' CPU/memory requests, since
the real node is an "8-GPU" node with this machine's 2 cores.

``ROOFTOP_ZERO_LOSS_RECORD=path.json`` writes the table's rows there.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
import yaml

from rooftop_sim.loadgen import LoadSpec, RequestResult, connector, send_request
from tests.cluster.handle import ClusterHandle, wait_until
from tests.cluster.operator_process import Operator
from tests.cluster.realnode import ENGINE_IMAGE, REAL_NODE_LABEL, RealNode
from tests.cluster.requests_webhook import RequestsWebhook
from tests.cluster.vllm_engines import model_config
from tests.e2e.test_loop import Run  # one record per phase, as the loop scenario keeps
from tests.e2e.test_real_node import engine_manifests, real_node  # noqa: F401 (fixture)

# Not in `make test` (`make zero-loss`): 17 minutes on 2 cores, and in the recorded
# run an engine died on its own right after turning Ready, failing two requests in the
# operator-restart window (docs/benchmarks.md).
pytestmark = [pytest.mark.e2e, pytest.mark.vllm, pytest.mark.realnode, pytest.mark.zeroloss]

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "rooftop"
RELEASE = "zero-loss"
GROUP, VERSION, PLURAL = "rooftop.dev", "v1alpha1", "servingtargets"
NAME = "tiny-chat"
SERVED = "tiny-llama"
CLAIM = "models"
PORT = 8000
# ~600 tokens/s on 2 cores: a 160-token stream lasts about a second alone, a few under
# load, so every event finds requests in flight.
PROMPT_TOKENS, OUTPUT_TOKENS = 16, 160
RATE = 2.0
OPENAI_RATE = 0.5  # the OpenAI client's requests per second, on top of RATE
BASELINE_S = 20.0
# Both scale-downs (Rooftop's and the plain Deployment's) add this many long streams
# just before the change, so each certainly has requests in flight on the pod it stops.
BURST, BURST_TOKENS = 6, 1500
LEAD_S = 5.0  # the window opens this long before the action
# Two vLLM pods start one after the other in a rollout: about 2-3 minutes each beside
# a serving engine on 2 cores.
RECOVER_TIMEOUT_S = 600.0
EVENTS = ("rollout", "operator-kill", "engine-kill", "drain", "scale-down")


def target(model_dir: Path, replicas: int, env: dict[str, str] | None = None) -> dict[str, Any]:
    extra = [{"name": k, "value": v} for k, v in (env or {}).items()]
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ServingTarget",
        "metadata": {"name": NAME},
        "spec": {
            "model": SERVED,
            "modelConfig": model_config(model_dir),
            "mode": "vllm",
            # shutdown timeout: 1.5 x (TTFT + p99 output x TPOT) is below its 30 s floor
            "slo": {"tpotMs": 20, "tpotPercentile": "p90", "ttftMs": 1000},
            "workload": {
                "requestsPerSecond": RATE,
                "promptTokens": {"mean": PROMPT_TOKENS},
                "outputTokens": {"mean": OUTPUT_TOKENS},
            },
            "budget": {"usdPerHour": 200},
            "constraints": {"gpuTypes": ["h100-sxm"], "weightDtypes": ["bf16"],
                            "kvDtypes": ["auto"], "maxTensorParallel": 1,
                            "minReplicas": replicas, "maxReplicas": replicas,
                            "nodeSelector": {REAL_NODE_LABEL: "true"}},
            "engine": {
                "modelVolume": {"claimName": CLAIM, "path": model_dir.name},
                # no torch.compile warm-up (about 55 s alone, minutes beside a serving
                # engine on 2 cores): every event here restarts engines
                "extraArgs": ["--enforce-eager"],
                "env": [
                    {"name": "VLLM_CPU_KVCACHE_SPACE", "value": "1"},  # GiB
                    {"name": "HF_HUB_OFFLINE", "value": "1"},
                    # vLLM's CPU build pins its compute thread to one logical CPU per
                    # physical core, the same one in every engine: on this 2-vCPU
                    # machine all engines (and a starting one) would share one CPU.
                    # One unpinned thread each lets the kernel spread them.
                    {"name": "VLLM_CPU_OMP_THREADS_BIND", "value": "nobind"},
                    {"name": "OMP_NUM_THREADS", "value": "1"},
                    *extra,
                ],
            },
        },
    }  # fmt: skip


class PhaseFailed(AssertionError):
    pass


# ---------------------------------------------------------------- load


@dataclass
class Sent:
    at: float  # time.monotonic() when sent
    ended: float | None = None
    result: RequestResult | None = None


@dataclass
class Load:
    """Open-loop Poisson load at ``rate`` on its own thread and event loop, each
    request's send and end time kept, so any window can be counted afterwards."""

    url: str
    rate: float
    seed: int = 1
    sent: list[Sent] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _burst: list[int] = field(default_factory=list)

    def burst(self, n: int, output_tokens: int) -> None:
        """Send ``n`` more requests now, of ``output_tokens`` each: long streams, so a
        scale-down certainly finds requests in flight on the pod it stops."""
        self._burst += [output_tokens] * n

    def start(self) -> Load:
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 120) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    async def _run(self) -> None:
        spec = LoadSpec(url=self.url, model=SERVED, rate=self.rate,
                        prompt_tokens=PROMPT_TOKENS, output_tokens=OUTPUT_TOKENS)  # fmt: skip
        rng = np.random.default_rng(self.seed)
        tasks: set[asyncio.Task[None]] = set()
        timeout = aiohttp.ClientTimeout(total=300)
        async with aiohttp.ClientSession(connector=connector(), timeout=timeout) as session:
            next_at = time.monotonic()
            while not self._stop.is_set():
                outputs = [self._burst.pop() for _ in list(self._burst)]
                if time.monotonic() >= next_at:
                    outputs.append(OUTPUT_TOKENS)
                    next_at += float(rng.exponential(1 / self.rate))
                for output in outputs:
                    entry = Sent(time.monotonic())
                    self.sent.append(entry)
                    task = asyncio.create_task(self._one(session, spec, entry, output))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                await asyncio.sleep(0.02)
            if tasks:
                await asyncio.wait(tasks, timeout=60)

    @staticmethod
    async def _one(
        session: aiohttp.ClientSession, spec: LoadSpec, entry: Sent, output: int
    ) -> None:
        entry.result = await send_request(session, spec, PROMPT_TOKENS, output, entry.at)
        entry.ended = time.monotonic()

    def settled(self, until: float, timeout: float = 90) -> None:
        """Wait until every request sent before ``until`` has ended."""
        wait_until(lambda: all(s.ended is not None for s in self.sent if s.at < until),
                   timeout, "requests of the window to end")  # fmt: skip

    def window(self, start: float, end: float) -> dict[str, Any]:
        inside = [s for s in self.sent if start <= s.at < end]
        failed = [s for s in inside if s.result is None or s.result.error is not None]
        errors = [s.result.error if s.result else "never ended" for s in failed]
        return {
            "sent": len(inside),
            "failed": len(failed),
            "cut": sum(1 for s in failed if s.result is not None and s.result.cut),
            "errors": sorted({str(e) for e in errors})[:5],
            "failed_at": [round(s.at - start, 2) for s in failed],
        }


OPENAI_SCRIPT = ROOT / "tests" / "cluster" / "openai_load.py"


@dataclass
class OpenAILoad:
    """The OpenAI Python client's load (tests/cluster/openai_load.py) in the vLLM venv,
    counted per window like ``Load``."""

    python: Path
    url: str
    rate: float
    path: Path
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> OpenAILoad:
        argv = [str(self.python), str(OPENAI_SCRIPT), self.url, SERVED, str(self.rate),
                str(OUTPUT_TOKENS), str(self.path)]  # fmt: skip
        log = self.path.with_suffix(".log").open("ab")
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=log,
                                     stderr=subprocess.STDOUT)  # fmt: skip
        return self

    def stop(self, timeout: float = 150) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        assert proc.stdin is not None
        proc.stdin.close()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()

    def records(self) -> list[dict[str, Any]]:
        merged: dict[int, dict[str, Any]] = {}
        if self.path.exists():
            for line in self.path.read_text().splitlines():
                record = json.loads(line)
                merged.setdefault(record["id"], {}).update(record)
        return list(merged.values())

    def settled(self, until: float, timeout: float = 90) -> None:
        wait_until(lambda: all("ended" in r for r in self.records() if r["at"] < until),
                   timeout, "the OpenAI client's requests of the window to end")  # fmt: skip

    def window(self, start: float, end: float) -> dict[str, Any]:
        inside = [r for r in self.records() if start <= r["at"] < end]
        failed = [r for r in inside if not _openai_served(r)]
        return {
            "sent": len(inside),
            "failed": len(failed),
            "cut": sum(1 for r in failed if r.get("chunks") or r.get("finish") == "abort"),
            "errors": sorted({str(r.get("error") or r.get("finish")) for r in failed})[:5],
        }


def _openai_served(record: dict[str, Any]) -> bool:
    return (record.get("error") is None and record.get("finish") == "length"
            and record.get("tokens") == OUTPUT_TOKENS)  # fmt: skip


# ---------------------------------------------------------------- the world


@dataclass
class World:
    cluster: ClusterHandle
    node: RealNode
    namespace: str
    operator: Operator
    work: Path
    model_dir: Path
    vllm_python: Path
    load: Load | None = None
    openai: OpenAILoad | None = None

    def count(self, start: float, end: float) -> dict[str, Any]:
        """Both clients' requests sent in [start, end), once every one has ended."""
        assert self.load is not None
        self.load.settled(end)
        out = self.load.window(start, end)
        if self.openai is not None:
            self.openai.settled(end)
            out["openai"] = self.openai.window(start, end)
        return out

    def kubectl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.cluster.kubectl("-n", self.namespace, *args, check=check)

    def get(self, *args: str) -> Any:
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)

    def apply_target(self, replicas: int, env: dict[str, str] | None = None) -> None:
        doc = target(self.model_dir, replicas, env)
        path = self.work / "target.yaml"
        path.write_text(yaml.safe_dump(doc))
        self.kubectl("apply", "-f", str(path))

    def pods(self) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.get("pods", "-l", f"rooftop.dev/servingtarget={NAME}")[
            "items"
        ]
        return items

    def recovered(self, replicas: int) -> bool:
        """Ready condition True and exactly ``replicas`` pods, all Ready, none going."""
        found = self.get("servingtarget", NAME)
        conds = {c["type"]: c["status"] for c in found.get("status", {}).get("conditions", [])}
        pods = self.pods()
        ready = [p for p in pods if _pod_ready(p)]
        return (conds.get("Ready") == "True" and len(pods) == replicas
                and len(ready) == replicas)  # fmt: skip


def _pod_ready(pod: dict[str, Any]) -> bool:
    if pod["metadata"].get("deletionTimestamp"):
        return False
    conds = pod.get("status", {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)


def event(
    world: World, action: Callable[[], dict[str, Any] | None], replicas: int,
    recovered: Callable[[], bool] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Run ``action`` under load; count the window until the fleet is whole again."""
    assert world.load is not None
    time.sleep(LEAD_S)
    t0 = time.monotonic()
    extra = action() or {}
    check = recovered or (lambda: world.recovered(replicas))
    time.sleep(2)  # let the change reach the Deployment before "recovered" can hold
    wait_until(check, RECOVER_TIMEOUT_S, "the target Ready with its desired pods")
    t1 = time.monotonic()
    out = world.count(t0 - LEAD_S, t1)
    restarted = _keep_restart_logs(world)
    return out | {"recover_s": round(t1 - t0, 1), "action_at": LEAD_S,
                  "restarted": restarted} | extra  # fmt: skip


def _keep_restart_logs(world: World) -> list[str]:
    """Pods whose engine container restarted, its previous log kept in the work dir: a
    crash nobody caused is otherwise gone with the next event."""
    restarted = []
    for pod in world.pods():
        name = pod["metadata"]["name"]
        for status in pod["status"].get("containerStatuses") or []:
            if status.get("restartCount", 0) == 0:
                continue
            restarted.append(f"{name}/{status['name']} x{status['restartCount']}")
            log = world.kubectl("logs", name, "-c", status["name"], "--previous",
                                "--tail=300", check=False)  # fmt: skip
            (world.work / f"previous-{name}-{status['name']}.log").write_text(
                log.stdout + log.stderr
            )
    return restarted


# ---------------------------------------------------------------- events


def rollout(world: World) -> dict[str, Any]:
    before = {p["metadata"]["name"] for p in world.pods()}
    strategy = world.get("deployment", f"{NAME}-engine")["spec"]["strategy"]
    result = event(world, lambda: world.apply_target(2, {"ROOFTOP_ZERO_LOSS": "1"}), 2,
                   lambda: world.recovered(2) and not before & _names(world))  # fmt: skip
    return result | {"strategy": strategy}


def _names(world: World) -> set[str]:
    return {p["metadata"]["name"] for p in world.pods()}


def operator_kill(world: World) -> dict[str, Any]:
    def kill() -> dict[str, Any]:
        world.operator.stop(signal.SIGKILL)
        time.sleep(5)
        world.operator.start(ROOFTOP_VLLM_IMAGE=ENGINE_IMAGE)
        return {}

    pods = _names(world)
    result = event(world, kill, 2)
    return result | {"pods_unchanged": _names(world) == pods}


def engine_kill(world: World) -> dict[str, Any]:
    pod = world.pods()[0]
    cid = pod["status"]["containerStatuses"][0]["containerID"].split("://", 1)[1]
    restarts = pod["status"]["containerStatuses"][0]["restartCount"]
    name = pod["metadata"]["name"]
    killed: dict[str, Any] = {}

    def kill() -> dict[str, Any]:
        assert world.load is not None
        killed["at"] = time.monotonic()
        argv = [*world.node.ctr(), "-n", "k8s.io", "tasks", "kill", "-s", "SIGKILL", cid]
        subprocess.run(argv, check=True, capture_output=True, timeout=30)
        return {"pod": name}

    def back() -> bool:
        p = world.get("pod", name)
        status = p["status"]["containerStatuses"][0]
        return bool(status["restartCount"] > restarts) and world.recovered(2)

    result = event(world, kill, 2, back)
    assert world.load is not None
    # The endpoints drop the pod once its readiness probe fails; requests sent before
    # that may still reach it. Count those sent 10 s after the kill separately.
    late_span = (killed["at"] + 10, killed["at"] + result["recover_s"])
    late = world.load.window(*late_span)
    if world.openai is not None:  # both clients' requests after the kill
        openai_late = world.openai.window(*late_span)
        late = {k: late[k] + openai_late[k] for k in ("sent", "failed")}
    return result | {"failed_10s_after_kill": late["failed"], "sent_10s_after_kill": late["sent"]}


def drain(world: World) -> dict[str, Any]:
    out: dict[str, Any] = {}

    def do() -> dict[str, Any]:
        done = world.cluster.kubectl(
            "drain", world.node.name, "--ignore-daemonsets", "--delete-emptydir-data",
            "--timeout=45s", f"--pod-selector=rooftop.dev/servingtarget={NAME}",
            check=False, timeout=120,
        )  # fmt: skip
        out["drain_rc"] = done.returncode
        out["drain_output"] = (done.stdout + done.stderr)[-800:]
        out["pods_after_drain"] = [
            (p["metadata"]["name"], _pod_ready(p), p["status"].get("phase")) for p in world.pods()
        ]
        world.cluster.kubectl("uncordon", world.node.name)
        return out

    return event(world, do, 2)


def scale_down(world: World) -> dict[str, Any]:
    def act() -> None:
        assert world.load is not None
        world.load.burst(BURST, BURST_TOKENS)
        time.sleep(1)  # the burst's streams are running
        world.apply_target(1, {"ROOFTOP_ZERO_LOSS": "1"})

    return event(world, act, 1)


def before(world: World, cluster: ClusterHandle) -> dict[str, Any]:
    """What Rooftop rendered before: --shutdown-timeout 0 (vLLM's default: abort) and
    no preStop, a plain Deployment of the same image rolled out (an env var added,
    Kubernetes' default rolling update) and then scaled 2 -> 1 under load."""
    ns = f"{world.namespace}-before"
    cluster.create_namespace(ns)
    items = engine_manifests(world.node, world.model_dir)
    deployment = next(i for i in items if i["kind"] == "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    container["args"] = ["/models/tiny", "--served-model-name", SERVED, "--port", str(PORT),
                         "--max-model-len", "2048", "--max-num-seqs", "8", "--enforce-eager",
                         "--shutdown-timeout", "0"]  # fmt: skip
    del container["lifecycle"]
    container["env"] += [
        {"name": "VLLM_CPU_OMP_THREADS_BIND", "value": "nobind"},
        {"name": "OMP_NUM_THREADS", "value": "1"},
    ]  # as target() says
    deployment["spec"]["replicas"] = 2
    deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 30
    listed = {"apiVersion": "v1", "kind": "List", "items": items}
    cluster.kubectl("-n", ns, "apply", "-f", "-", stdin=json.dumps(listed))

    def pods() -> list[dict[str, Any]]:
        return list(json.loads(cluster.kubectl("-n", ns, "get", "pods", "-l", "app=engine",
                                               "-o", "json").stdout)["items"])  # fmt: skip

    def names() -> set[str]:
        return {p["metadata"]["name"] for p in pods()}

    def ready(n: int) -> bool:
        now = pods()
        return len(now) == n and all(_pod_ready(p) for p in now)

    def set_env(assignment: str) -> None:  # a rollout, as the edited target's was
        cluster.kubectl("-n", ns, "set", "env", "deployment/engine", assignment)

    wait_until(lambda: ready(2), RECOVER_TIMEOUT_S, "the plain Deployment's 2 pods Ready")
    ip = cluster.kubectl("-n", ns, "get", "service", "engine", "-o",
                         "jsonpath={.spec.clusterIP}").stdout  # fmt: skip
    load = world.load = Load(f"http://{ip}:{PORT}", RATE, seed=7).start()
    try:
        time.sleep(10)
        old = names()
        out = {"before-rollout": event(
            world, lambda: set_env("ROOFTOP_ZERO_LOSS=1"), 2,
            lambda: ready(2) and not old & names())}  # fmt: skip

        def scale() -> None:
            load.burst(BURST, BURST_TOKENS)
            time.sleep(1)
            cluster.kubectl("-n", ns, "scale", "deployment", "engine", "--replicas=1")

        return out | {"before-scale-down": event(world, scale, 1, lambda: ready(1))}
    finally:
        load.stop()
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def scenario(world: World, run: Run) -> None:
    world.apply_target(2)
    t = time.monotonic()
    try:
        wait_until(lambda: world.recovered(2), 600, "2 engine pods Ready")
    except TimeoutError as err:
        run.failed = f"deploy: {err}\n{_debug(world)}"
        return
    run.phases["deployed"] = {"ready_s": round(time.monotonic() - t, 1),
                              "pod": world.pods()[0]}  # fmt: skip
    ip = world.kubectl("get", "service", NAME, "-o", "jsonpath={.spec.clusterIP}").stdout
    world.load = Load(f"http://{ip}:{PORT}", RATE).start()
    world.openai = OpenAILoad(world.vllm_python, f"http://{ip}:{PORT}", OPENAI_RATE,
                              world.work / "openai.jsonl").start()  # fmt: skip
    steps: list[tuple[str, Callable[[], dict[str, Any]]]] = [
        ("baseline", lambda: _baseline(world)),
        ("rollout", lambda: rollout(world)),
        ("operator-kill", lambda: operator_kill(world)),
        ("engine-kill", lambda: engine_kill(world)),
        ("drain", lambda: drain(world)),
        ("scale-down", lambda: scale_down(world)),
    ]
    try:
        for name, step in steps:
            print(f"\n[{time.strftime('%H:%M:%S')}] {name} ...", flush=True)
            try:
                run.phases[name] = step()
            except (PhaseFailed, TimeoutError, subprocess.SubprocessError) as err:
                run.failed = f"{name}: {err}\n{_debug(world)}"
                return
            print(f"  {json.dumps(run.phases[name])[:600]}", flush=True)
    finally:
        world.load.stop()
        world.openai.stop()
    world.kubectl("delete", "servingtarget", NAME, "--wait=false", check=False)
    try:
        run.phases.update(before(world, world.cluster))
    except (TimeoutError, subprocess.SubprocessError) as err:
        run.failed = f"before: {err}"


def _baseline(world: World) -> dict[str, Any]:
    assert world.load is not None
    t0 = time.monotonic()
    time.sleep(BASELINE_S)
    t1 = time.monotonic()
    return world.count(t0, t1) | {"recover_s": 0.0}


def _debug(world: World) -> str:
    pods = world.kubectl("get", "pods", "-o", "wide", check=False).stdout
    events = world.kubectl("get", "events", "--sort-by=.lastTimestamp", check=False).stdout
    return f"pods:\n{pods}\nevents:\n{events[-2500:]}\noperator:\n{world.operator.tail(20)}"


def table(run: Run) -> str:
    rows = ["| event | requests sent | failed | cut | OpenAI client: sent | failed | cut "
            "| seconds to recover |", "|---|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for name in ("baseline", *EVENTS, "before-rollout", "before-scale-down"):
        if name in run.phases:
            p = run.phases[name]
            o = p.get("openai") or {"sent": "-", "failed": "-", "cut": "-"}
            rows.append(f"| {name} | {p['sent']} | {p['failed']} | {p['cut']} | {o['sent']} "
                        f"| {o['failed']} | {o['cut']} | {p['recover_s']:.1f} |")  # fmt: skip
    return "\n".join(rows)


# ---------------------------------------------------------------- fixtures


def _apply(cluster: ClusterHandle, work: Path, doc: dict[str, Any], *args: str) -> None:
    path = work / f"{doc['kind'].lower()}-{doc['metadata']['name']}.yaml"
    path.write_text(yaml.safe_dump(doc))
    cluster.kubectl("apply", *args, "-f", str(path))


def _model_claim(cluster: ClusterHandle, work: Path, ns: str, pv: str, host_dir: Path) -> None:
    """A hostPath PV (the model's parent directory on this host, which is the node's)
    bound to the ``models`` PVC."""
    spec = {"accessModes": ["ReadOnlyMany"], "storageClassName": ""}
    _apply(cluster, work, {
        "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": pv},
        "spec": spec | {"capacity": {"storage": "1Gi"},
                        "hostPath": {"path": str(host_dir), "type": "Directory"},
                        "persistentVolumeReclaimPolicy": "Retain",
                        "claimRef": {"namespace": ns, "name": CLAIM}},
    })  # fmt: skip
    _apply(cluster, work, {
        "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": CLAIM},
        "spec": spec | {"volumeName": pv, "resources": {"requests": {"storage": "1Gi"}}},
    }, "-n", ns)  # fmt: skip
    cluster.kubectl("wait", "-n", ns, "--for=jsonpath={.status.phase}=Bound",
                    "--timeout=60s", f"pvc/{CLAIM}")  # fmt: skip


def _kwok_gpu_nodes(cluster: ClusterHandle, node: RealNode) -> list[str]:
    nodes = json.loads(cluster.kubectl("get", "nodes", "-o", "json").stdout)["items"]
    names = [n["metadata"]["name"] for n in nodes if not n["spec"].get("unschedulable")]
    return [name for name in names if name != node.name]


@pytest.fixture(scope="module")
def run(
    cluster: ClusterHandle,
    real_node: RealNode,  # noqa: F811 (the imported fixture)
    tiny_model_dir: Path,
    vllm_py: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Run]:
    suffix = uuid.uuid4().hex[:6]
    system, ns = f"zl-system-{suffix}", f"zl-{suffix}"
    work = tmp_path_factory.mktemp("zero-loss")
    cluster.create_namespace(system)
    cluster.create_namespace(ns)
    cluster.helm("install", RELEASE, str(CHART), "--namespace", system, "--set", "image.tag=e2e")
    cordoned = _kwok_gpu_nodes(cluster, real_node)
    for name in cordoned:
        cluster.kubectl("cordon", name)
    pv = f"zl-models-{suffix}"
    _model_claim(cluster, work, ns, pv, tiny_model_dir.parent)
    webhook = RequestsWebhook(cluster, ns, cpu="500m", memory="4Gi").install()
    kubeconfig = cluster.serviceaccount_kubeconfig(system, f"{RELEASE}-rooftop")
    operator = Operator(kubeconfig, ns, work / "operator.log")
    world = World(cluster, real_node, ns, operator, work, tiny_model_dir, vllm_py)
    result = Run()
    try:
        operator.start(ROOFTOP_VLLM_IMAGE=ENGINE_IMAGE)
        scenario(world, result)
        print("\n" + table(result))
        record = os.environ.get("ROOFTOP_ZERO_LOSS_RECORD")
        if record:
            Path(record).write_text(json.dumps(result.phases, indent=1, default=str))
        yield result
    finally:
        if world.load is not None:
            world.load.stop(10)
        if world.openai is not None:
            world.openai.stop(10)
        operator.stop()
        webhook.close()
        (work / "run.json").write_text(json.dumps(result.phases, indent=1, default=str))
        cluster.kubectl("uncordon", real_node.name, check=False)
        for name in cordoned:
            cluster.kubectl("uncordon", name, check=False)
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
        cluster.helm("uninstall", RELEASE, "--namespace", system, check=False)
        cluster.kubectl("delete", "namespace", system, "--wait=false", check=False)
        cluster.kubectl("delete", "pv", pv, "--wait=false", check=False)


# ---------------------------------------------------------------- the promises


def _no_loss(phase: dict[str, Any]) -> None:
    assert phase["sent"] > 0, phase
    assert (phase["failed"], phase["cut"]) == (0, 0), phase
    assert phase["openai"]["failed"] == 0, phase  # nor through the OpenAI client


def test_baseline_serves_every_request(run: Run) -> None:
    _no_loss(run.need("baseline"))


def test_rollout_loses_no_request(run: Run) -> None:
    _no_loss(run.need("rollout"))


def test_operator_kill_loses_no_request(run: Run) -> None:
    phase = run.need("operator-kill")
    _no_loss(phase)
    assert phase["pods_unchanged"], phase


def test_engine_kill_loses_only_its_in_flight_requests(run: Run) -> None:
    phase = run.need("engine-kill")
    assert phase["sent_10s_after_kill"] > 0, phase
    assert phase["failed_10s_after_kill"] == 0, phase
    # at RATE over 2 pods, a pod holds a few requests at once
    assert phase["failed"] <= 10, phase


def test_drain_first_eviction_loses_no_request(run: Run) -> None:
    _no_loss(run.need("drain"))


def test_scale_down_loses_no_request(run: Run) -> None:
    _no_loss(run.need("scale-down"))


def test_before_scale_down_cut_in_flight_streams(run: Run) -> None:
    """The comparison: what --shutdown-timeout 0 without preStop did (reported)."""
    phase = run.need("before-scale-down")
    print(f"\nbefore: {phase}")
    assert phase["sent"] > 0 and phase["cut"] > 0, phase


def test_before_rollout_is_measured(run: Run) -> None:
    """Reported, not asserted lost: without a burst the rollout's stopping pods may hold
    no stream at SIGTERM (the scale-down above is the certain case)."""
    phase = run.need("before-rollout")
    print(f"\nbefore rollout: {phase}")
    assert phase["sent"] > 0 and not phase["restarted"], phase
