"""How the operator scales with the number of ServingTargets, on the local control plane.

    .venv/bin/python benchmarks/bench_scale.py [--targets 100,300,1000] [--steady-s 60]
        [--loop-interval-s 15] [--timeout-s 900] [--json PATH] [--keep] [--quick]

For each N, a fresh local control plane (tests/cluster: etcd, kube-apiserver with an
audit log, controller manager, scheduler, kwok) with enough fake GPU nodes for every
planned pod; the chart installed with Helm; a real Prometheus (no scrape targets: the
kwok pods export nothing, so the loop holds); and the operator as a subprocess under the
chart's ServiceAccount, watching 4 namespaces, its feedback loop reading that Prometheus.
Then N copies of examples/simulated-chat.yaml (``sim-chat-0000``...) spread over the 4
namespaces go in with one ``kubectl apply --server-side``, and a watch notes when each
target's ``Deployed`` and ``Ready`` conditions first turn True.

Reported per N:

- all Deployed / all Ready: from the apply's start until the last target's condition;
- per target p50 / p95 / p99: Deployed time minus the target's creation (the audit
  log's ``requestReceivedTimestamp`` of the apply that created it);
- reconciled twice: targets whose engine Deployment the operator wrote (create, apply,
  update) more than once before every target was Ready; in parentheses, when any,
  targets whose creation handlers kopf ran more than once (its log), writes or not;
- steady state, one loop interval after all are Ready, over ``--steady-s``: operator
  RSS and CPU (% of one core, /proc), the operator's API reads/s and writes (audit log,
  its ServiceAccount's user), and PromQL queries per loop interval (Prometheus' own
  ``/api/v1/query`` request counter).

``--json`` adds what explains those numbers: CPU seconds each process (operator, API
server, etcd...) used from the apply to all Ready, the operator's requests by kind in the
burst and in the steady window, and per target its creation, Deployed and Ready times and
Deployment writes. Everything is torn down at the end, on error or Ctrl-C too; ``--keep``
leaves the logs (audit log, operator, control plane) in the work directory it prints.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import shutil
import signal
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for _path in (ROOT, ROOT / "planner", ROOT / "operator"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import live_engines  # noqa: E402  (a sibling script, not a package)
from tests.cluster.controlplane import ControlPlane, default_bin_dir  # noqa: E402
from tests.cluster.handle import ClusterHandle, wait_until  # noqa: E402
from tests.cluster.nodes import GpuType, gpu_node  # noqa: E402
from tests.cluster.operator_process import Operator  # noqa: E402
from tests.cluster.prometheus import PrometheusServer  # noqa: E402

CHART = ROOT / "charts" / "rooftop"
EXAMPLE = ROOT / "examples" / "simulated-chat.yaml"
RELEASE = "bench"
SYSTEM_NS = "rooftop-system"
SERVICE_ACCOUNT = f"{RELEASE}-rooftop"  # rooftop.fullname for this release
OPERATOR_USER = f"system:serviceaccount:{SYSTEM_NS}:{SERVICE_ACCOUNT}"
NAMESPACES = ("bench-0", "bench-1", "bench-2", "bench-3")
GROUP, VERSION, PLURAL = "rooftop.dev", "v1alpha1", "servingtargets"
GPUS_PER_NODE = 250  # fake GPUs (and pod slots) per bench node
READS = frozenset({"get", "list", "watch"})
WRITES = frozenset({"create", "update", "patch", "delete", "deletecollection"})
PROMQL = ("prometheus_http_requests_total", {"handler": "/api/v1/query"})
INNER_EVALS = ("prometheus_engine_query_duration_seconds_count", {"slice": "inner_eval"})

Obj = dict[str, Any]


def progress(msg: str) -> None:
    print(f"bench_scale: {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- audit log (pure)


@dataclass(frozen=True)
class AuditEvent:
    """One API request from the audit log (Metadata level)."""

    audit_id: str
    verb: str
    user: str
    resource: str
    subresource: str
    namespace: str
    name: str
    uri: str
    received: float  # requestReceivedTimestamp, epoch seconds (microseconds kept)
    code: int


def parse_time(stamp: str) -> float:
    """An RFC 3339 timestamp (``2025-01-02T03:04:05.123456Z``) as epoch seconds."""
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def parse_audit_line(line: str) -> AuditEvent | None:
    """One JSON line of the audit log; None for a torn or non-event line."""
    try:
        raw = json.loads(line)
    except ValueError:
        return None
    if not isinstance(raw, dict) or "auditID" not in raw:
        return None
    ref = raw.get("objectRef") or {}
    return AuditEvent(
        audit_id=raw["auditID"],
        verb=raw.get("verb", ""),
        user=(raw.get("user") or {}).get("username", ""),
        resource=ref.get("resource", ""),
        subresource=ref.get("subresource", ""),
        namespace=ref.get("namespace", ""),
        name=ref.get("name", ""),
        uri=raw.get("requestURI", ""),
        received=parse_time(raw["requestReceivedTimestamp"]),
        code=int((raw.get("responseStatus") or {}).get("code", 0)),
    )


def parse_audit(lines: Iterable[str]) -> list[AuditEvent]:
    """Each request once (a watch logs ResponseStarted and ResponseComplete), in order."""
    seen: set[str] = set()
    events = []
    for line in lines:
        event = parse_audit_line(line)
        if event is not None and event.audit_id not in seen:
            seen.add(event.audit_id)
            events.append(event)
    return events


def read_audit(path: Path) -> list[AuditEvent]:
    with path.open(errors="replace") as f:
        return parse_audit(f)


def creation_times(events: Iterable[AuditEvent], operator: str) -> dict[str, float]:
    """Per ServingTarget ("namespace/name"): when its first write by anyone but the
    operator (the apply that created it) reached the API server."""
    created: dict[str, float] = {}
    for e in events:
        if e.resource == PLURAL and not e.subresource and e.verb in WRITES and e.user != operator:
            key = f"{e.namespace}/{e.name}"
            created[key] = min(created.get(key, math.inf), e.received)
    return created


def deployment_writes(
    events: Iterable[AuditEvent], operator: str, start: float, until: float
) -> Counter[str]:
    """Per ServingTarget ("namespace/name"): the operator's writes to its engine
    Deployment (not its status) received in [start, until]."""
    writes: Counter[str] = Counter()
    for e in events:
        if (e.user == operator and e.resource == "deployments" and not e.subresource
                and e.verb in WRITES and start <= e.received <= until):  # fmt: skip
            writes[f"{e.namespace}/{e.name.removesuffix('-engine')}"] += 1
    return writes


CREATION_LINE = re.compile(r"\[([^\s/\]]+/[^\s\]]+)\] Creation is processed")


def creation_passes(operator_log: str) -> Counter[str]:
    """Per ServingTarget ("namespace/name"): how often kopf ran its creation handlers
    (the "[ns/name] Creation is processed: ..." INFO line after each pass)."""
    return Counter(m.group(1) for m in CREATION_LINE.finditer(operator_log))


@dataclass(frozen=True)
class RequestCounts:
    reads: int
    writes: int
    by_kind: dict[str, int]  # "verb resource[/subresource]" -> count


def request_counts(
    events: Iterable[AuditEvent], user: str, start: float, until: float
) -> RequestCounts:
    """The user's requests received in [start, until], reads and writes apart."""
    kinds: Counter[str] = Counter()
    for e in events:
        if e.user == user and start <= e.received <= until:
            kinds[f"{e.verb} {e.resource}{'/' + e.subresource if e.subresource else ''}"] += 1
    reads = sum(n for k, n in kinds.items() if k.split()[0] in READS)
    writes = sum(n for k, n in kinds.items() if k.split()[0] in WRITES)
    return RequestCounts(reads, writes, dict(kinds.most_common()))


# ---------------------------------------------------------------- summaries (pure)


def percentile(values: Sequence[float], q: float) -> float:
    """The q-quantile (0..1), linear between order statistics (numpy's default)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def latencies(done: Mapping[str, float], created: Mapping[str, float]) -> list[float]:
    """Per target: the time ``done`` noted minus its creation, s."""
    return [t - created[k] for k, t in done.items() if k in created]


def cpu_ticks(stat: str) -> int:
    """utime + stime from a /proc/<pid>/stat line (after the command's parentheses)."""
    fields = stat.rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # fields 14 and 15 of the whole line


def rss_kib(status: str) -> int:
    """VmRSS from /proc/<pid>/status, KiB."""
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise ValueError("no VmRSS line")


def metric_sum(text: str, name: str, labels: Mapping[str, str]) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels`` (exposition text)."""
    total = 0.0
    wanted = [f'{k}="{v}"' for k, v in labels.items()]
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            head, _, value = line.rpartition(" ")
            if all(w in head for w in wanted):
                total += float(value)
    return total


def target_docs(doc: Mapping[str, Any], n: int, namespaces: Sequence[str]) -> str:
    """``n`` copies of ``doc`` named ``<name>-0000``..., round-robin over namespaces,
    as one multi-document YAML."""
    import yaml

    out = []
    for i in range(n):
        copy = json.loads(json.dumps(doc))
        copy["metadata"] = {"name": f"{doc['metadata']['name']}-{i:04d}",
                            "namespace": namespaces[i % len(namespaces)]}  # fmt: skip
        out.append(yaml.safe_dump(copy, sort_keys=False))
    return "---\n".join(out)


@dataclass
class Result:
    targets: int
    all_deployed_s: float
    all_ready_s: float
    deployed_p50_s: float
    deployed_p95_s: float
    deployed_p99_s: float
    reconciled_twice: int  # targets whose engine Deployment was written more than once
    handled_twice: int  # targets whose creation handlers kopf ran more than once
    rss_mib: float
    cpu_pct: float
    reads_per_s: float
    steady_writes: int
    promql_per_tick: float
    inner_evals_per_tick: float
    apply_start: float  # epoch s, as the per-target times
    apply_s: float
    steady_s: float
    loop_interval_s: float
    live: bool = False  # --live: every engine pod exported vLLM's metrics
    observed_targets: int = 0  # targets whose status showed observed figures at the end
    replica_counts: dict[str, int] = field(default_factory=dict)  # replicas -> targets
    broken_scrapes: int = 0  # answers Prometheus stopped reading (its scrape timeout)
    burst_cpu_s: dict[str, float] = field(default_factory=dict)
    burst_requests: dict[str, int] = field(default_factory=dict)
    steady_requests: dict[str, int] = field(default_factory=dict)
    per_target: dict[str, dict[str, float]] = field(default_factory=dict)
    # --baseline: the same N on a fresh control plane with no operator (``no_operator``)
    apply_alone_s: float = math.nan  # the targets' apply
    children_alone_s: float = math.nan  # then the children the operator would make
    ready_alone_s: float = math.nan  # from the first apply until every engine is ready


def table(results: Sequence[Result]) -> str:
    """The markdown table, one row per N."""
    head = ["targets", "all Deployed", "all Ready", "per target p50 / p95 / p99",
            "reconciled twice", "operator RSS", "operator CPU, steady",
            "API reads/s, steady", "API writes in steady window",
            "PromQL queries per tick", "engine metrics"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for r in results:
        cells = [
            str(r.targets), f"{r.all_deployed_s:.1f} s", f"{r.all_ready_s:.1f} s",
            f"{r.deployed_p50_s:.2f} / {r.deployed_p95_s:.2f} / {r.deployed_p99_s:.2f} s",
            _twice(r), f"{r.rss_mib:.0f} MiB",
            f"{r.cpu_pct:.1f} %", f"{r.reads_per_s:.2f}", str(r.steady_writes),
            f"{r.promql_per_tick:.1f}",
            f"live, {r.observed_targets} targets observed" if r.live else "none",
        ]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", *(_apply_line(r) for r in results)]
    return "\n".join(lines) + "\n"


def _apply_line(r: Result) -> str:
    """How long the apply itself took, and the same N with no operator (``--baseline``)."""
    line = f"N={r.targets}: the apply took {r.apply_s:.1f} s"
    if math.isnan(r.apply_alone_s):
        return line
    return (f"{line}; with no operator, the same apply took {r.apply_alone_s:.1f} s, "
            f"applying the children `rooftop render` makes for the targets "
            f"{r.children_alone_s:.1f} s more, and every engine was Ready "
            f"{r.ready_alone_s:.1f} s after the start")  # fmt: skip


def _twice(r: Result) -> str:
    text = f"{r.reconciled_twice} of {r.targets}"
    return text + (f" (creation handled twice: {r.handled_twice})" if r.handled_twice else "")


# ---------------------------------------------------------------- the cluster


@dataclass
class Bench:
    """One N's cluster, Prometheus and operator; ``stack`` tears them down."""

    work: Path
    stack: contextlib.ExitStack
    cp: ControlPlane | None = None
    cluster: ClusterHandle | None = None
    api: Any = None
    prometheus: PrometheusServer | None = None
    operator: Operator | None = None
    live: live_engines.LiveEngines | None = None

    @property
    def audit_log(self) -> Path:
        return self.work / "audit.log"


# Room for one Service per target at every N (a /24 holds 254: the 255th target's
# Service would be refused, its target ApplyRejected and retried, as on a real cluster).
SERVICE_CIDR = "10.0.0.0/16"


def start_cluster(b: Bench) -> None:
    cp = ControlPlane(state_dir=b.work / "controlplane", bin_dir=default_bin_dir(),
                      die_with_parent=True, audit_log=b.audit_log,
                      service_cidr=SERVICE_CIDR)  # fmt: skip
    b.stack.callback(cp.stop)
    cp.start()
    b.cp, b.cluster = cp, ClusterHandle(cp.kubeconfig, cp.bin_dir, b.work)
    b.api = b.cluster.api()
    b.stack.callback(b.api.close)


def planned_gpu(doc: Obj) -> Any:
    """The catalog GPU the planner puts ``doc`` on (its node labels and resource)."""
    from rooftop_api.spec import ServingTarget
    from rooftop_planner.catalog import load_catalog
    from rooftop_planner.search import plan_target

    catalog = load_catalog()
    result = plan_target(ServingTarget.model_validate(doc).spec, catalog=catalog)
    if not result.feasible or result.plan is None:
        raise RuntimeError(result.explain())
    return catalog.gpu(result.plan.gpu)


def add_gpu_nodes(b: Bench, gpu: Any, pods: int) -> None:
    """Fake nodes of the planned GPU with room for ``pods`` one-GPU pods, Ready."""
    from kubernetes import client

    core = client.CoreV1Api(b.api)
    memory_mib = int(gpu.hbm_bytes / 2**20)
    flavour = GpuType("bench", gpu.node_label_value, GPUS_PER_NODE, memory_mib, "bench",
                      (8, 0), "bench", "1000", "8Ti")  # fmt: skip
    names = []
    for i in range(math.ceil(pods / GPUS_PER_NODE)):
        node = gpu_node(flavour, i)
        for key in ("capacity", "allocatable"):
            node["status"][key]["pods"] = str(GPUS_PER_NODE + 20)
        core.create_node(node)  # type: ignore[arg-type]  # dicts are accepted
        names.append(node["metadata"]["name"])
    wait_until(lambda: all(_node_ready(core, n) for n in names), 120, "bench GPU nodes Ready")


def _node_ready(core: Any, name: str) -> bool:
    node = core.read_node(name)
    return any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or [])


def install(b: Bench) -> None:
    assert b.cluster is not None
    for ns in (SYSTEM_NS, *NAMESPACES):
        b.cluster.create_namespace(ns)
    b.cluster.helm("install", RELEASE, str(CHART), "--namespace", SYSTEM_NS,
                   "--set", "image.tag=bench")  # fmt: skip


def start_prometheus(b: Bench) -> None:
    """Prometheus scraping each engine pod as often as the operator's PodMonitor asks."""
    from rooftop_operator.builders import SCRAPE_INTERVAL

    b.prometheus = PrometheusServer(b.work / "prometheus", scrape_interval=SCRAPE_INTERVAL)
    b.stack.callback(b.prometheus.stop)
    b.prometheus.start()


def start_live_engines(b: Bench, tick_s: float) -> None:
    """Every engine pod's vLLM metrics from one exporter, scraped by the Prometheus the
    operator reads (``live_engines``)."""
    from kubernetes import client

    assert b.prometheus is not None
    core = client.CoreV1Api(b.api)

    def pods() -> list[Obj]:
        from rooftop_operator.builders import APP_NAME

        listed = core.list_pod_for_all_namespaces(
            label_selector=f"app.kubernetes.io/name={APP_NAME}"
        )
        return [{"metadata": {"namespace": p.metadata.namespace, "name": p.metadata.name,
                              "labels": p.metadata.labels}} for p in listed.items]  # fmt: skip

    b.live = live_engines.LiveEngines(pods, b.prometheus.set_targets, tick_s).start()
    b.stack.callback(b.live.stop)


def live_outcome(b: Bench) -> tuple[int, dict[str, int]]:
    """Targets whose status carries observed figures (the loop read their series), and
    how many targets run each replica count."""
    from kubernetes import client

    custom = client.CustomObjectsApi(b.api)
    statuses = [t.get("status") or {} for t in custom.list_cluster_custom_object(
        GROUP, VERSION, PLURAL)["items"]]  # fmt: skip
    observed = sum(1 for st in statuses if (st.get("observed") or {}).get("tpotMs") is not None)
    counts = Counter(str(st.get("replicas")) for st in statuses)
    return observed, dict(sorted(counts.items()))


def start_operator(b: Bench, interval_s: float, verbose: bool) -> None:
    assert b.cluster is not None and b.prometheus is not None
    kubeconfig = b.cluster.serviceaccount_kubeconfig(SYSTEM_NS, SERVICE_ACCOUNT)
    b.operator = Operator(kubeconfig, NAMESPACES[0], b.work / "operator.log", verbose=verbose)
    b.stack.callback(b.operator.stop)
    more = [arg for ns in NAMESPACES[1:] for arg in ("--namespace", ns)]
    b.operator.start(*more, ROOFTOP_PROMETHEUS_URL=b.prometheus.url,
                     ROOFTOP_LOOP_INTERVAL_S=f"{interval_s:g}")  # fmt: skip


# ---------------------------------------------------------------- the burst


@dataclass
class Seen:
    """When each target's Deployed and Ready conditions were first seen True (epoch s)."""

    deployed: dict[str, float] = field(default_factory=dict)
    ready: dict[str, float] = field(default_factory=dict)

    def note(self, obj: Obj, now: float) -> None:
        key = f"{obj['metadata']['namespace']}/{obj['metadata']['name']}"
        for cond in (obj.get("status") or {}).get("conditions") or []:
            if cond.get("status") != "True":
                continue
            if cond.get("type") == "Deployed":
                self.deployed.setdefault(key, now)
            elif cond.get("type") == "Ready":
                self.ready.setdefault(key, now)


def watch_targets(b: Bench, n: int, apply: Future[Any], deadline: float, rv: str) -> Seen:
    """Follow every ServingTarget from resourceVersion ``rv`` until ``n`` are Ready."""
    from kubernetes import client, watch

    custom, seen, last_report = client.CustomObjectsApi(b.api), Seen(), 0.0
    while len(seen.ready) < n:
        if time.time() > deadline:
            raise TimeoutError(f"{len(seen.ready)} of {n} Ready\n{_tail(b)}")
        if apply.done() and apply.exception() is not None:
            raise RuntimeError("kubectl apply failed") from apply.exception()
        if b.operator is not None and b.operator.proc is not None and b.operator.proc.poll():
            raise RuntimeError(f"the operator exited\n{_tail(b)}")
        w = watch.Watch()  # type: ignore[no-untyped-call]
        wait = int(max(1, min(30, deadline - time.time())))
        try:
            stream = w.stream(  # type: ignore[no-untyped-call]
                custom.list_cluster_custom_object, GROUP, VERSION, PLURAL,
                resource_version=rv, timeout_seconds=wait, _request_timeout=wait + 10,
            )  # fmt: skip
            for event in stream:
                obj = event["object"]
                rv = obj["metadata"]["resourceVersion"]
                seen.note(obj, time.time())
                last_report = _report(seen, n, last_report)
                if len(seen.ready) >= n:
                    w.stop()  # type: ignore[no-untyped-call]
        except client.ApiException as err:
            if err.status != 410:
                raise
            rv = _relist(custom, seen)
    return seen


def _relist(custom: Any, seen: Seen) -> str:
    """After a 410 (history compacted): note the current state, watch from now."""
    listed = custom.list_cluster_custom_object(GROUP, VERSION, PLURAL)
    for obj in listed["items"]:
        seen.note(obj, time.time())
    return str(listed["metadata"]["resourceVersion"])


def _report(seen: Seen, n: int, last: float) -> float:
    if time.monotonic() - last < 5:
        return last
    progress(f"  {len(seen.deployed)}/{n} Deployed, {len(seen.ready)}/{n} Ready")
    return time.monotonic()


def _tail(b: Bench) -> str:
    return b.operator.tail(20) if b.operator is not None else ""


@dataclass
class Burst:
    start: float
    apply_s: float
    seen: Seen
    cpu_s: dict[str, float]  # process -> CPU seconds it used from the apply to all Ready


def cluster_for(b: Bench, n: int) -> None:
    """A fresh control plane with GPU nodes for ``n`` engines and the chart installed."""
    start_cluster(b)
    add_gpu_nodes(b, planned_gpu(_example()), n)
    install(b)


def write_targets(b: Bench, n: int) -> Path:
    """The manifest of ``n`` targets the burst applies."""
    manifest = b.work / "targets.yaml"
    manifest.write_text(target_docs(_example(), n, NAMESPACES))
    return manifest


def burst(b: Bench, n: int, timeout_s: float) -> Burst:
    """Apply ``n`` targets at once; note when each turns Deployed and Ready."""
    from kubernetes import client

    assert b.cluster is not None
    manifest = write_targets(b, n)
    listed: Any = client.CustomObjectsApi(b.api).list_cluster_custom_object(GROUP, VERSION, PLURAL)
    pool, cpu = ThreadPoolExecutor(1), cpu_seconds(b)
    try:
        start = time.time()
        apply = pool.submit(b.cluster.kubectl, "apply", "--server-side", "-f", str(manifest),
                            timeout=max(timeout_s, 120))  # fmt: skip
        apply.add_done_callback(lambda _: progress(f"  applied in {time.time() - start:.1f} s"))
        seen = watch_targets(b, n, apply, start + timeout_s, listed["metadata"]["resourceVersion"])
        apply.result()
    finally:  # on error, not waiting: the teardown ends a kubectl still running
        pool.shutdown(wait=False, cancel_futures=True)
    used = {name: t - cpu[name] for name, t in cpu_seconds(b).items()}
    return Burst(start, _apply_seconds(b, start), seen, used)


def _apply_seconds(b: Bench, start: float) -> float:
    """When the apply's last create reached the API server, from its start."""
    created = creation_times(read_audit(b.audit_log), OPERATOR_USER)
    return max(created.values(), default=start) - start


def _example() -> Obj:
    import yaml

    doc: Obj = yaml.safe_load(EXAMPLE.read_text())
    return doc


# ---------------------------------------------------------------- steady state


@dataclass(frozen=True)
class Sample:
    wall: float
    mono: float
    cpu_ticks: int
    promql: float
    inner_evals: float


def sample(b: Bench) -> Sample:
    assert b.operator is not None and b.operator.proc is not None
    assert b.prometheus is not None
    stat = Path(f"/proc/{b.operator.proc.pid}/stat").read_text()
    with urllib.request.urlopen(b.prometheus.url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return Sample(time.time(), time.monotonic(), cpu_ticks(stat), metric_sum(text, *PROMQL),
                  metric_sum(text, *INNER_EVALS))  # fmt: skip


def cpu_seconds(b: Bench) -> dict[str, float]:
    """CPU seconds used so far by the operator and each control-plane process."""
    assert b.operator is not None and b.operator.proc is not None and b.cp is not None
    pids = {"operator": b.operator.proc.pid, **b.cp.pids}
    tick = os.sysconf("SC_CLK_TCK")
    return {name: cpu_ticks(Path(f"/proc/{pid}/stat").read_text()) / tick
            for name, pid in pids.items()}  # fmt: skip


def operator_rss_mib(b: Bench) -> float:
    assert b.operator is not None and b.operator.proc is not None
    return rss_kib(Path(f"/proc/{b.operator.proc.pid}/status").read_text()) / 1024


# ---------------------------------------------------------------- one N


@dataclass(frozen=True)
class Baseline:
    """The same N on a fresh control plane with no operator (``no_operator``), s."""

    targets_s: float
    children_s: float
    ready_s: float


def no_operator(n: int, args: argparse.Namespace, work: Path) -> Baseline:
    """What Kubernetes alone takes for the objects of N targets: the same apply of the
    targets, then the children the operator would make for them (``rooftop render``,
    without owner references, ``CHILD_APPLIERS`` server-side applies at once), then
    until every engine Deployment is ready. Measured in the same run as the operator, on
    the same cores: "all Deployed" cannot beat the first two, nor "all Ready" the
    third."""
    with contextlib.ExitStack() as stack:
        b = Bench(work, stack)
        cluster_for(b, n)
        assert b.cluster is not None
        targets = write_targets(b, n)
        kids = []
        for i, chunk in enumerate(chunked(rendered_children(targets), CHILD_APPLIERS)):
            kids.append(b.work / f"children-{i}.json")
            kids[-1].write_text(json.dumps(chunk))
        limit = max(args.timeout_s, 120)
        start = time.time()
        b.cluster.kubectl("apply", "--server-side", "-f", str(targets), timeout=limit)
        applied = time.time()
        with ThreadPoolExecutor(len(kids)) as pool:  # one kubectl applies one at a time
            list(pool.map(lambda f: b.cluster.kubectl("apply", "--server-side", "-f", str(f),
                                                      timeout=limit), kids))  # fmt: skip
        children = time.time()
        wait_until(lambda: engines_ready(b) >= n, start + limit - time.time(),
                   "every engine ready")  # fmt: skip
        return Baseline(applied - start, children - applied, time.time() - start)
    raise AssertionError("unreachable")  # ExitStack may swallow exceptions for mypy


# kubectl applies the objects of a file one after the other; the children are applied by
# this many at once, as the operator's threads do (kopf's pool has 6 on 2 cores).
CHILD_APPLIERS = 8


def chunked(listed: Obj, k: int) -> list[Obj]:
    """A List's items dealt into ``k`` Lists (fewer when it has fewer items)."""
    items = listed["items"]
    return [{**listed, "items": items[i::k]} for i in range(min(k, len(items)))]


def rendered_children(targets: Path) -> Obj:
    """The objects ``rooftop render`` makes for the targets in ``targets``, as one List,
    without owner references (the targets' uids do not exist yet) and with the scrape
    annotations the operator uses where no Prometheus Operator is installed."""
    from rooftop_operator import render

    args = argparse.Namespace(targets=[str(targets)], namespace=None, catalog=None,
                              vllm_image=None, rocm_image=None, tpu_image=None,
                              self_image=None, no_pod_monitor=True)  # fmt: skip
    items = []
    for rendered in render.render_all(args):
        assert rendered.code == 0, rendered.note
        for obj in rendered.objects:
            obj["metadata"].pop("ownerReferences", None)
            items.append(obj)
    return {"apiVersion": "v1", "kind": "List", "items": items}


def engines_ready(b: Bench) -> int:
    """How many engine Deployments have every desired replica ready."""
    from kubernetes import client

    from rooftop_operator.builders import APP_NAME

    listed = client.AppsV1Api(b.api).list_deployment_for_all_namespaces(
        label_selector=f"app.kubernetes.io/name={APP_NAME}"
    )
    return sum(1 for d in listed.items
               if (d.status.ready_replicas or 0) >= (d.spec.replicas or 0))  # fmt: skip


def run_one(n: int, args: argparse.Namespace, work: Path) -> Result:
    with contextlib.ExitStack() as stack:
        b = Bench(work, stack)
        t = time.monotonic()
        cluster_for(b, n)
        start_prometheus(b)
        start_operator(b, args.loop_interval_s, args.verbose)
        progress(f"N={n}: cluster, chart, Prometheus and operator up in "
                 f"{time.monotonic() - t:.0f} s; applying {n} targets")  # fmt: skip
        result = burst(b, n, args.timeout_s)
        progress(f"N={n}: all Ready; CPU s used meanwhile: {_cpu_text(result.cpu_s)}")
        if args.live:
            start_live_engines(b, args.loop_interval_s)
            assert b.live is not None
            progress(f"N={n}: live metrics for {len(b.live.pods)} engine pods; "
                     f"{args.live_warmup_s:g} s for the loop to read them, then "
                     f"{args.steady_s:g} s steady")  # fmt: skip
            time.sleep(args.live_warmup_s)
        else:
            progress(f"N={n}: waiting one loop interval, then {args.steady_s:g} s steady")
            time.sleep(args.loop_interval_s)
        before = sample(b)
        time.sleep(args.steady_s)
        after, rss = sample(b), operator_rss_mib(b)
        time.sleep(2)  # the audit log answers last: let the window's requests land
        assert b.operator is not None
        passes = creation_passes(b.operator.log_path.read_text(errors="replace"))
        out = summarize(n, args, result, (before, after), rss, read_audit(b.audit_log), passes)
        if not args.live:
            return out
        observed, replicas = live_outcome(b)
        assert b.live is not None
        return replace(
            out,
            live=True,
            observed_targets=observed,
            replica_counts=replicas,
            broken_scrapes=b.live.broken_scrapes,
        )
    raise AssertionError("unreachable")  # ExitStack may swallow exceptions for mypy


def _cpu_text(cpu_s: Mapping[str, float]) -> str:
    return ", ".join(f"{name} {s:.1f}" for name, s in sorted(cpu_s.items(), key=lambda x: -x[1]))


def summarize(n: int, args: argparse.Namespace, burst: Burst, window: tuple[Sample, Sample],
              rss_mib: float, events: list[AuditEvent],
              passes: Counter[str]) -> Result:  # fmt: skip
    seen, (before, after) = burst.seen, window
    created = creation_times(events, OPERATOR_USER)
    done = max(seen.ready.values())
    writes = deployment_writes(events, OPERATOR_USER, burst.start, done)
    deployed = latencies(seen.deployed, created)
    steady = request_counts(events, OPERATOR_USER, before.wall, after.wall)
    elapsed = after.mono - before.mono
    ticks = elapsed / args.loop_interval_s
    return Result(
        targets=n,
        all_deployed_s=max(seen.deployed.values()) - burst.start,
        all_ready_s=done - burst.start,
        deployed_p50_s=percentile(deployed, 0.5),
        deployed_p95_s=percentile(deployed, 0.95),
        deployed_p99_s=percentile(deployed, 0.99),
        reconciled_twice=sum(1 for count in writes.values() if count > 1),
        handled_twice=sum(1 for count in passes.values() if count > 1),
        rss_mib=rss_mib,
        cpu_pct=100 * (after.cpu_ticks - before.cpu_ticks) / os.sysconf("SC_CLK_TCK") / elapsed,
        reads_per_s=steady.reads / elapsed,
        steady_writes=steady.writes,
        promql_per_tick=(after.promql - before.promql) / ticks,
        inner_evals_per_tick=(after.inner_evals - before.inner_evals) / ticks,
        apply_start=burst.start,
        apply_s=burst.apply_s,
        steady_s=elapsed,
        loop_interval_s=args.loop_interval_s,
        burst_cpu_s=burst.cpu_s,
        burst_requests=request_counts(events, OPERATOR_USER, burst.start, done).by_kind,
        steady_requests=steady.by_kind,
        per_target=_per_target(created, seen, writes, passes),
    )


def _per_target(created: Mapping[str, float], seen: Seen, writes: Mapping[str, int],
                passes: Mapping[str, int]) -> dict[str, dict[str, float]]:  # fmt: skip
    out = {}
    for key, t in sorted(created.items()):
        out[key] = {"created": t, "deployed": seen.deployed.get(key, math.nan),
                    "ready": seen.ready.get(key, math.nan),
                    "deployment_writes": float(writes.get(key, 0)),
                    "creation_passes": float(passes.get(key, 0))}  # fmt: skip
    return out


# ---------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--targets", default="100,300,1000", help="comma-separated N")
    ap.add_argument("--steady-s", type=float, default=60.0, help="steady-state window, s")
    ap.add_argument("--loop-interval-s", type=float, default=15.0,
                    help="ROOFTOP_LOOP_INTERVAL_S for the operator")  # fmt: skip
    ap.add_argument("--timeout-s", type=float, default=900.0, help="limit for all Ready, s")
    ap.add_argument("--json", type=Path, help="write the raw numbers here")
    ap.add_argument("--workdir", type=Path, help="default: a new temporary directory")
    ap.add_argument("--keep", action="store_true", help="keep the logs in the work directory")
    ap.add_argument("--verbose", action="store_true", help="run the operator with --verbose")
    ap.add_argument("--quick", action="store_true", help="--targets 20 --steady-s 30")
    ap.add_argument("--live", action="store_true",
                    help="every engine pod exports vLLM's metric families (one exporter, "
                         "benchmarks/live_engines.py), so the loop decides on data")  # fmt: skip
    ap.add_argument("--live-warmup-s", type=float, default=240.0,
                    help="with --live: from the first scrape to the steady window, s")  # fmt: skip
    ap.add_argument("--baseline", action="store_true",
                    help="first time the same N with no operator: the apply, the "
                         "children it would make, every engine ready")  # fmt: skip
    args = ap.parse_args(argv)
    if args.quick:
        args.targets, args.steady_s = "20", 30.0
    args.ns = [int(x) for x in args.targets.split(",") if x.strip()]
    return args


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM tears down like Ctrl-C does."""

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="bench-scale-"))
    results: list[Result] = []
    ok = False
    try:
        with sigterm_as_interrupt():
            for n in args.ns:
                base = Baseline(math.nan, math.nan, math.nan)
                if args.baseline:
                    base = no_operator(n, args, work / f"alone{n}")
                    progress(f"N={n}, no operator: the apply {base.targets_s:.1f} s, the "
                             f"children {base.children_s:.1f} s more, every engine ready "
                             f"{base.ready_s:.1f} s after the start")  # fmt: skip
                results.append(replace(run_one(n, args, work / f"n{n}"),
                                       apply_alone_s=base.targets_s,
                                       children_alone_s=base.children_s,
                                       ready_alone_s=base.ready_s))  # fmt: skip
                progress(f"N={n} done\n{table(results[-1:])}")
        ok = True
    except KeyboardInterrupt:
        progress("interrupted; everything started is stopped")
        return 130
    finally:
        if results:
            print(table(results))
        if args.json and results:
            args.json.write_text(json.dumps([asdict(r) for r in results], indent=1) + "\n")
        if args.keep or not ok:
            progress(f"logs kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
