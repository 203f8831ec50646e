"""A real, local Kubernetes control plane with fake GPU nodes, for tests and users.

Why not kind/k3d/envtest: no Docker here, and envtest has no scheduler, controller
manager or nodes, while Rooftop's behaviour depends on real scheduling of GPU requests
and on Deployments turning into Pods. So we run etcd, kube-apiserver,
kube-controller-manager, kube-scheduler and kwok (which fakes the kubelets) as plain
processes on 127.0.0.1, built from source by tests/cluster/build-bins.sh.

Every process gets its own session (process group) so `stop()` can kill whatever it
forks, and the pids go to a state file so `python -m tests.cluster down` can stop a
cluster started by another process. Readiness is polled, never slept on.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tests.cluster import kubeconfig as kc
from tests.cluster import nodes as fake_nodes
from tests.cluster import pki as pki_mod

K8S_VERSION = "1.34.3"
REQUIRED = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
TOOLS = ("kubectl", "helm")
START_ORDER = REQUIRED
# kwok's fake pod IPs: in the loopback range, so a test can bind a pod's process (an
# engine, the operator's metrics) to the pod's own IP and port on this machine, and a
# Prometheus that discovers the pod through the API server scrapes that process, as it
# would scrape the container. EndpointSlices refuse loopback addresses: kwok pods back
# no Service, which no test of kwok pods needs (the real node's pods do).
KWOK_POD_CIDR = "127.244.0.1/16"
KWOK_NODE_IP = "127.243.0.1"  # outside the pods' range: no pod shares it

# ControlPlane(audit_log=...)'s default policy: one line per request (at ResponseComplete,
# and ResponseStarted for watches), Metadata level, without the periodic noise (health
# probes, leases, events other than ServiceAccounts'; an operator's events stay).
AUDIT_POLICY = """\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: None
  nonResourceURLs: [/healthz*, /readyz*, /livez*, /metrics, /version, /openapi*]
- level: None
  resources: [{group: coordination.k8s.io, resources: [leases]}]
- level: Metadata
  userGroups: ["system:serviceaccounts"]
  resources: [{group: "", resources: [events]}, {group: events.k8s.io, resources: [events]}]
- level: None
  resources: [{group: "", resources: [events]}, {group: events.k8s.io, resources: [events]}]
- level: Metadata
"""


def cache_dir() -> Path:
    return Path(os.environ.get("ROOFTOP_CACHE", Path.home() / ".cache" / "rooftop"))


def cache_bin_dir() -> Path:
    """Where tests/cluster/build-bins.sh puts its binaries."""
    return cache_dir() / f"k8s-v{K8S_VERSION}" / "bin"


def default_state_dir() -> Path:
    return cache_dir() / "cluster"


def default_bin_dir() -> Path:
    """KUBEBUILDER_ASSETS when it holds kube-apiserver and etcd (setup-envtest users), else
    the build-bins.sh cache. Binaries missing there (kwok...) fall back to the cache."""
    assets = os.environ.get("KUBEBUILDER_ASSETS")
    if assets and all((Path(assets) / b).is_file() for b in ("kube-apiserver", "etcd")):
        return Path(assets)
    return cache_bin_dir()


def find_binary(name: str, bin_dir: Path | None = None) -> Path | None:
    """bin_dir, then the build cache, then PATH."""
    for d in (bin_dir or default_bin_dir(), cache_bin_dir()):
        if (d / name).is_file() and os.access(d / name, os.X_OK):
            return d / name
    found = shutil.which(name)
    return Path(found) if found else None


def missing_binaries(bin_dir: Path | None = None, names: tuple[str, ...] = REQUIRED) -> list[str]:
    return [n for n in names if find_binary(n, bin_dir) is None]


def free_port() -> int:
    """A port that was free a moment ago (tiny race, acceptable on a test machine)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class Ports:
    etcd: int
    etcd_peer: int
    apiserver: int
    controller_manager: int
    scheduler: int
    kwok: int

    @classmethod
    def free(cls) -> Ports:
        return cls(*(free_port() for _ in range(6)))


class StartupError(RuntimeError):
    """A component died or never became ready; the message ends with its log tail."""


@dataclass
class ControlPlane:
    """etcd + kube-apiserver + kube-controller-manager + kube-scheduler + kwok.

    Use as a context manager, or `start()` / `stop()`. `kubeconfig` is an admin
    (system:masters) kubeconfig; `serviceaccount_kubeconfig()` gives RBAC-bound ones.
    """

    state_dir: Path = field(default_factory=default_state_dir)
    bin_dir: Path = field(default_factory=default_bin_dir)
    ports: Ports = field(default_factory=Ports.free)
    pids: dict[str, int] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    die_with_parent: bool = False  # fixture use: a killed pytest takes the cluster with it
    # API server audit log (JSON lines) at this path, with `audit_policy` or, without one,
    # AUDIT_POLICY (Metadata level); None: no auditing, as the e2e tests run.
    audit_log: Path | None = None
    audit_policy: Path | None = None
    # Service IPs: a /24 holds 254 Services, one per ServingTarget (the scale benchmark's
    # 1,000 targets need a wider range).
    service_cidr: str = "10.0.0.0/24"
    _procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict, init=False, repr=False)

    @property
    def kubeconfig(self) -> Path:
        return self.state_dir / "kubeconfig"

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports.apiserver}"

    @property
    def pki(self) -> pki_mod.Pki:
        return pki_mod.Pki(self.state_dir / "pki")

    @property
    def state_file(self) -> Path:
        return self.state_dir / "state.json"

    def log_path(self, component: str) -> Path:
        return self.state_dir / "logs" / f"{component}.log"

    # ---------------------------------------------------------------- lifecycle

    def start(self, timeout: float = 180.0, attempts: int = 2) -> ControlPlane:
        """Start everything and create the fake nodes; on any failure stop what started.

        A failed start is retried on fresh ports: they are picked free but only bound
        later, so a parallel test run can take one in between."""
        missing = missing_binaries(self.bin_dir)
        if missing:
            raise StartupError(f"missing binaries {missing}: run `make tools`")
        for attempt in range(1, attempts + 1):
            try:
                return self._start_once(timeout)
            except StartupError as e:
                if attempt == attempts:
                    raise
                log(f"start failed, retrying on new ports: {str(e).splitlines()[0]}")
                self.ports = Ports.free()
        raise AssertionError("unreachable")

    def _start_once(self, timeout: float) -> ControlPlane:
        t0 = time.monotonic()
        try:
            self._prepare_dirs()
            for name in START_ORDER:
                self._start_component(name, t0 + timeout)
            self._create_nodes(t0 + timeout)
        except BaseException:
            self.stop()
            raise
        self.timings["total"] = time.monotonic() - t0
        return self

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM each process group (reverse start order), SIGKILL what outlives grace."""
        alive = [n for n in reversed(START_ORDER) if n in self.pids]
        for name in alive:
            _signal_group(self.pids[name], name, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for name in alive:
            if not self._wait_exit(name, deadline):
                _signal_group(self.pids[name], name, signal.SIGKILL)
                self._wait_exit(name, time.monotonic() + 5)
        self.pids.clear()
        self._procs.clear()

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def running(self) -> dict[str, bool]:
        return {n: _alive(pid, n) for n, pid in self.pids.items()}

    def serviceaccount_kubeconfig(self, namespace: str, name: str) -> Path:
        """Kubeconfig authenticating as ServiceAccount namespace/name (TokenRequest API)."""
        out_dir = self.state_dir / "sa-kubeconfigs"
        return kc.serviceaccount_kubeconfig(self.kubeconfig, namespace, name, out_dir)

    # ---------------------------------------------------------------- state file

    def save_state(self) -> Path:
        """Record pids and ports so another process can find and stop this cluster."""
        state = {
            "state_dir": str(self.state_dir),
            "bin_dir": str(self.bin_dir),
            "ports": asdict(self.ports),
            "pids": self.pids,
            "kubeconfig": str(self.kubeconfig),
            "server": self.server,
            "timings": self.timings,
        }
        self.state_file.write_text(json.dumps(state, indent=2))
        return self.state_file

    @classmethod
    def load_state(cls, state_dir: Path | None = None) -> ControlPlane | None:
        path = (state_dir or default_state_dir()) / "state.json"
        if not path.is_file():
            return None
        state = json.loads(path.read_text())
        return cls(
            state_dir=Path(state["state_dir"]),
            bin_dir=Path(state["bin_dir"]),
            ports=Ports(**state["ports"]),
            pids={k: int(v) for k, v in state["pids"].items()},
            timings=state.get("timings", {}),
        )

    # ---------------------------------------------------------------- internals

    def _prepare_dirs(self) -> None:
        """Fresh etcd data and PKI every start: a test cluster never carries state over."""
        for sub in ("etcd", "pki", "logs", "sa-kubeconfigs"):
            shutil.rmtree(self.state_dir / sub, ignore_errors=True)
        (self.state_dir / "logs").mkdir(parents=True)
        pki_mod.generate(self.state_dir / "pki")
        kc.write_admin(self.kubeconfig, self.server, self.pki)
        # Own kwok config so a user's ~/.kwok/kwok.yaml cannot change the defaults.
        (self.state_dir / "kwok.yaml").write_text(
            "apiVersion: config.kwok.x-k8s.io/v1alpha1\nkind: KwokConfiguration\noptions: {}\n"
        )
        if self.audit_log is not None:
            self.audit_log.unlink(missing_ok=True)  # a retried start begins a fresh log
            if self.audit_policy is None:
                self.audit_policy = self.state_dir / "audit-policy.yaml"
                self.audit_policy.write_text(AUDIT_POLICY)

    def _start_component(self, name: str, deadline: float) -> None:
        t = time.monotonic()
        argv = [str(find_binary(name, self.bin_dir)), *self._flags(name)]
        with self.log_path(name).open("ab") as log:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.state_dir,
                start_new_session=True,  # own process group: stop() kills children too
                preexec_fn=parent_death_signal if self.die_with_parent else None,
            )
        self._procs[name] = proc
        self.pids[name] = proc.pid
        self._wait(name, self._ready_check(name), deadline)
        self.timings[name] = time.monotonic() - t

    def _wait(self, name: str, ready: Callable[[], bool], deadline: float) -> None:
        """Poll `ready` with a short backoff; fail fast if the process exits."""
        delay = 0.05
        while not ready():
            proc = self._procs.get(name)
            if proc is not None and proc.poll() is not None:
                raise StartupError(f"{name} exited with {proc.returncode}\n{self._tail(name)}")
            if time.monotonic() > deadline:
                raise StartupError(f"{name} not ready in time\n{self._tail(name)}")
            time.sleep(delay)
            delay = min(delay * 1.5, 0.5)

    def _tail(self, name: str, lines: int = 30) -> str:
        path = self.log_path(name)
        if not path.is_file():
            return ""
        text = path.read_text(errors="replace").splitlines()[-lines:]
        return f"--- {path} (last {lines} lines) ---\n" + "\n".join(text)

    def _wait_exit(self, name: str, deadline: float) -> bool:
        proc = self._procs.get(name)
        while time.monotonic() < deadline:
            if proc is not None:
                if proc.poll() is not None:
                    return True
            elif not _alive(self.pids[name], name):
                return True
            time.sleep(0.05)
        return False

    # ---- flags (each component's command-line reference in the Kubernetes docs)

    def _flags(self, name: str) -> list[str]:
        return {
            "etcd": self._etcd_flags,
            "kube-apiserver": self._apiserver_flags,
            "kube-controller-manager": self._kcm_flags,
            "kube-scheduler": self._scheduler_flags,
            "kwok": self._kwok_flags,
        }[name]()

    def _etcd_flags(self) -> list[str]:
        client = f"http://127.0.0.1:{self.ports.etcd}"
        peer = f"http://127.0.0.1:{self.ports.etcd_peer}"
        return [
            "--name=node0",
            f"--data-dir={self.state_dir / 'etcd'}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=node0={peer}",
            "--unsafe-no-fsync=true",  # test data: durability is not needed, speed is
            "--log-level=warn",
        ]

    def _apiserver_flags(self) -> list[str]:
        p = self.pki
        return [
            f"--etcd-servers=http://127.0.0.1:{self.ports.etcd}",
            "--advertise-address=127.0.0.1",
            "--bind-address=127.0.0.1",
            f"--secure-port={self.ports.apiserver}",
            f"--cert-dir={self.state_dir / 'pki'}",
            f"--tls-cert-file={p.apiserver_crt}",
            f"--tls-private-key-file={p.apiserver_key}",
            f"--client-ca-file={p.ca_crt}",
            "--authorization-mode=RBAC",  # real RBAC: the chart's rules are exercised
            f"--service-cluster-ip-range={self.service_cidr}",
            f"--service-account-issuer={self.server}/",
            f"--service-account-key-file={p.sa_pub}",
            f"--service-account-signing-key-file={p.sa_key}",
            "--allow-privileged=true",
            # A real node (tests/cluster/realnode.py) is reached at its InternalIP for
            # logs and exec; the default tries its Hostname first, which would send a DNS
            # query off this machine.
            "--kubelet-preferred-address-types=InternalIP,Hostname",
            # The `kubernetes` Service cannot point at 127.0.0.1 (loopback is invalid in
            # Endpoints); nothing runs in-cluster, so skip that reconciler.
            "--endpoint-reconciler-type=none",
            # ServiceAccount admission stays ON: the controller manager creates SAs.
            "--enable-priority-and-fairness=false",
            "--max-requests-inflight=0",
            "--max-mutating-requests-inflight=0",
            "--profiling=false",
            *self._audit_flags(),
        ]

    def _audit_flags(self) -> list[str]:
        if self.audit_log is None:
            return []
        return [
            f"--audit-policy-file={self.audit_policy}",
            f"--audit-log-path={self.audit_log}",
            "--audit-log-format=json",
            "--audit-log-mode=blocking",  # every request is in the file when it answers
            "--audit-log-maxsize=100000",  # MB: never rotate mid-run (the default is 100)
        ]

    def _component_common(self, port: int) -> list[str]:
        # No --authentication/--authorization-kubeconfig: only the always-allowed health
        # and metrics paths are served, and the requestheader CA lookup they trigger
        # logs an error every 10 s on a cluster without a front proxy.
        return [
            f"--kubeconfig={self.kubeconfig}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
            "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics",
        ]

    def _kcm_flags(self) -> list[str]:
        return [
            *self._component_common(self.ports.controller_manager),
            f"--root-ca-file={self.pki.ca_crt}",
            f"--service-account-private-key-file={self.pki.sa_key}",
            "--use-service-account-credentials=false",
            "--kube-api-qps=100",
            "--kube-api-burst=200",
        ]

    def _scheduler_flags(self) -> list[str]:
        return self._component_common(self.ports.scheduler)

    def _kwok_flags(self) -> list[str]:
        return [
            f"--kubeconfig={self.kubeconfig}",
            f"--config={self.state_dir / 'kwok.yaml'}",
            "--manage-all-nodes=false",
            f"--manage-nodes-with-annotation-selector={fake_nodes.KWOK_ANNOTATION}=fake",
            f"--cidr={KWOK_POD_CIDR}",
            f"--node-ip={KWOK_NODE_IP}",
            "--node-lease-duration-seconds=40",
            f"--server-address=127.0.0.1:{self.ports.kwok}",
        ]

    # ---- readiness

    def _ready_check(self, name: str) -> Callable[[], bool]:
        if name == "etcd":
            return lambda: _http_ok(f"http://127.0.0.1:{self.ports.etcd}/health")
        if name == "kube-apiserver":
            ctx = ssl.create_default_context(cafile=str(self.pki.ca_crt))
            ctx.load_cert_chain(str(self.pki.admin_crt), str(self.pki.admin_key))
            return lambda: _http_ok(f"{self.server}/readyz", ctx)
        if name == "kwok":
            return lambda: _http_ok(f"http://127.0.0.1:{self.ports.kwok}/healthz")
        port = getattr(self.ports, "controller_manager" if "controller" in name else "scheduler")
        return lambda: _http_ok(f"https://127.0.0.1:{port}/healthz", _insecure())

    def _create_nodes(self, deadline: float) -> None:
        """Create the fake fleet, then wait until kwok reports every node Ready and the
        controller manager has created the `default` ServiceAccount (pods need it)."""
        from kubernetes import client, config

        t = time.monotonic()
        api = config.new_client_from_config(config_file=str(self.kubeconfig))  # type: ignore[no-untyped-call]
        try:
            core = client.CoreV1Api(api)
            wanted = fake_nodes.default_nodes()
            for node in wanted:
                core.create_node(node)  # type: ignore[arg-type]  # dicts are accepted
            names = {n["metadata"]["name"] for n in wanted}
            self._wait("kwok", lambda: _nodes_ready(core, names), deadline)
            self._wait("kube-controller-manager", lambda: _default_sa(core), deadline)
        finally:
            api.close()
        self.timings["nodes"] = time.monotonic() - t


def _nodes_ready(core: Any, names: set[str]) -> bool:
    ready = set()
    for node in core.list_node().items:
        conds = {c.type: c.status for c in node.status.conditions or []}
        if conds.get("Ready") == "True":
            ready.add(node.metadata.name)
    return names <= ready


def _default_sa(core: Any) -> bool:
    accounts = core.list_namespaced_service_account("default").items
    return any(sa.metadata.name == "default" for sa in accounts)


def _http_ok(url: str, ctx: ssl.SSLContext | None = None) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2, context=ctx) as resp:
            return int(resp.status) == 200
    except (OSError, ValueError):
        return False


def _insecure() -> ssl.SSLContext:
    """Component health endpoints use self-signed certs; they only listen on loopback."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def _alive(pid: int, name: str) -> bool:
    """True if pid exists and, where /proc allows checking, still runs `name` (pid reuse)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False
    cmdline = Path(f"/proc/{pid}/cmdline")
    if cmdline.exists():
        try:
            argv0 = cmdline.read_bytes().split(b"\0", 1)[0].decode(errors="replace")
        except OSError:
            return False
        return Path(argv0).name == name
    return True


def _signal_group(pid: int, name: str, sig: signal.Signals) -> None:
    if not _alive(pid, name):
        return
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)
    except ProcessLookupError:
        pass


def parent_death_signal() -> None:
    """Child-side hook: get SIGTERM when the parent dies (Linux only; no-op elsewhere).
    Keeps a SIGKILLed test run (CI timeout) from leaving a control plane behind."""
    if sys.platform != "linux":
        return
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


def log(msg: str) -> None:
    print(f"rooftop-cluster: {msg}", file=sys.stderr, flush=True)
