"""One REAL node for the local control plane: containerd + runc + CNI + kubelet + kube-proxy.

Why: kwok nodes (tests/cluster/nodes.py) run no containers, so nothing about images,
container commands, probes, signals or Service routing is exercised by them. This node
runs pods for real, in containers built from local images (tests/cluster/build-images.sh),
and kube-proxy programs real ClusterIP rules, so a request sent from this host to a
Service reaches a pod through the same path as in a cluster. The scheduler sees it as a
GPU node: it carries the GPU Feature Discovery labels the kwok GPU nodes carry and
`nvidia.com/gpu` capacity (a status patch, as a device plugin would advertise), so an
engine pod planned for that GPU lands on it, and runs on the CPU.

Binaries come from tests/cluster/build-node.sh; images from build-images.sh; the
control plane's CA signs the kubelet's (system:node:<name>) and kube-proxy's
(system:kube-proxy) client certificates, so it must be our local control plane
(`RealNode.for_kubeconfig` finds its PKI beside its kubeconfig).

Networking never leaves the machine: pods sit on a bridge (`rooftop0`, POD_CIDR) with
no masquerading and no default route (only the bridge's subnet and the Service CIDR are
routed, back onto the bridge); the host routes the Service CIDR onto the bridge too, so
an unproxied Service IP stays local; an nftables table drops anything forwarded between
the bridge and any other interface. kubelet and CRI streaming listen on the bridge's
address or loopback only.

Needs root, cgroups (v1 with the cgroupfs driver is what this was built on) and one
node per machine: the bridge, routes and state paths are fixed so that a crashed run
is cleaned up by the next one (`start()` first undoes whatever the state file and the
fixed names show is left). A lock file keeps two RealNodes from sharing them.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import fcntl
import ipaddress
import json
import os
import resource
import shlex
import shutil
import signal
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from rooftop_operator.settings import VLLM_VERSION
from tests.cluster import kubeconfig as kc
from tests.cluster import nodes as fake_nodes
from tests.cluster.controlplane import (
    ControlPlane,
    StartupError,
    cache_dir,
    find_binary,
    free_port,
    log,
    parent_death_signal,
)
from tests.cluster.oci import Store, ensure_imported
from tests.cluster.pki import Pki

# The images build-images.sh makes (same references there).
PAUSE_IMAGE = "localhost/rooftop/pause:3.10.1"
OPERATOR_IMAGE = "localhost/rooftop:dev"
ENGINE_IMAGE = f"localhost/rooftop/vllm-cpu:{VLLM_VERSION}"

# Pod network: not the control plane's Service CIDR (10.0.0.0/24) nor kwok's fake pod
# IPs (controlplane.KWOK_POD_CIDR). The bridge's address is also the node's InternalIP:
# kubelet refuses loopback, and this address exists only on this machine.
POD_CIDR = "10.89.0.0/24"
BRIDGE = "rooftop0"
NETWORK = "rooftop"
GUARD_TABLE = "rooftop-node"  # nftables table (inet) that keeps forwarding local
CGROUP_PARENT = "rooftop-node"  # kubelet's cgroupRoot: every pod's cgroup is below it
DEFAULT_NAME = "real-0"
REAL_NODE_LABEL = "rooftop.dev/real-node"
# Kernel settings this node changes: kubelet sets the first four (it always does,
# unless protectKernelDefaults makes it refuse to start); forwarding lets a pod reach a
# Service backed by another pod. All are restored on stop.
SYSCTLS = (
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
    "net/ipv4/ip_forward",
)
COMPONENTS = ("containerd", "kubelet", "kube-proxy")
NODE_BINARIES = ("containerd", "containerd-shim-runc-v2", "ctr", "runc", "kubelet", "kube-proxy")
CNI_PLUGINS = ("bridge", "host-local", "loopback", "portmap")
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
NOFILE = 1 << 20  # open-file limit of the node's processes (and so of its containers)

# Taints the node lifecycle controller keeps on a node that is not (yet) Ready.
LIFECYCLE_TAINTS = frozenset({"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"})


def node_cache() -> Path:
    """build-node.sh's output: bin/ (links to every binary) and cni-bin/."""
    return cache_dir() / "node"


def images_dir() -> Path:
    """build-images.sh's blob store."""
    return cache_dir() / "images"


def default_state_dir() -> Path:
    """Fixed, so a crashed run's leftovers are found by the next start."""
    return cache_dir() / "realnode"


def missing_node_binaries() -> list[str]:
    """What build-node.sh has not provided yet (empty: ready)."""
    bin_dir, cni = node_cache() / "bin", node_cache() / "cni-bin"
    missing = [b for b in NODE_BINARIES if not os.access(bin_dir / b, os.X_OK)]
    return missing + [f"cni/{p}" for p in CNI_PLUGINS if not os.access(cni / p, os.X_OK)]


def missing_images(refs: Iterable[str]) -> list[str]:
    """Those of `refs` build-images.sh has not built (empty: ready)."""
    if not (images_dir() / "images.json").is_file():
        return list(refs)
    store = Store(images_dir())
    return [r for r in refs if store.image(r) is None]


@dataclass
class RealNode:
    """A real kubelet node joined to a running local control plane.

    Use as a context manager, or `start()` / `stop()`. `gpu` sets the GPU Feature
    Discovery labels (tests.cluster.nodes' GPU types) and `gpus` the advertised
    `nvidia.com/gpu` count (default: the type's count); `taints` are registered with the
    node (the kwok GPU nodes carry none). `images` are imported into containerd on start
    (only those it does not already hold).
    """

    kubeconfig: Path  # admin kubeconfig of the control plane
    pki: Pki  # that control plane's CA (ca.crt + ca.key)
    name: str = DEFAULT_NAME
    gpu: fake_nodes.GpuType = fake_nodes.H100
    gpus: int | None = None
    taints: tuple[Mapping[str, str], ...] = ()
    images: tuple[str, ...] = (PAUSE_IMAGE,)
    state_dir: Path = field(default_factory=default_state_dir)
    bin_dir: Path = field(default_factory=lambda: node_cache() / "bin")
    cni_bin_dir: Path = field(default_factory=lambda: node_cache() / "cni-bin")
    die_with_parent: bool = False  # fixture use: a killed pytest takes the node with it
    timings: dict[str, float] = field(default_factory=dict)
    _procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict, init=False)
    _lock: IO[str] | None = field(default=None, init=False, repr=False)
    _service_cidr: str = field(default="", init=False)
    _ports: dict[str, int] = field(default_factory=dict, init=False)
    _killed: set[str] = field(default_factory=set, init=False)  # container IDs ctr removed

    @classmethod
    def for_controlplane(cls, cp: ControlPlane, **kwargs: Any) -> RealNode:
        return cls(kubeconfig=cp.kubeconfig, pki=cp.pki, **kwargs)

    @classmethod
    def for_kubeconfig(cls, kubeconfig: Path, **kwargs: Any) -> RealNode:
        """For the control plane whose admin kubeconfig this is: ControlPlane writes it
        beside its PKI (state_dir/kubeconfig, state_dir/pki). A cluster without its CA key
        there (ROOFTOP_KUBECONFIG) cannot take this node: FileNotFoundError."""
        pki = Pki(kubeconfig.parent / "pki")
        if not (pki.ca_crt.is_file() and pki.ca_key.is_file()):
            raise FileNotFoundError(f"no CA key beside {kubeconfig}: not a local control plane")
        return cls(kubeconfig=kubeconfig, pki=pki, **kwargs)

    # ---------------------------------------------------------------- paths

    @property
    def gateway(self) -> str:
        """The bridge's address: the pods' gateway and the node's InternalIP."""
        return str(next(ipaddress.ip_network(POD_CIDR).hosts()))

    @property
    def containerd_socket(self) -> Path:
        return self.state_dir / "containerd" / "state" / "containerd.sock"

    @property
    def kubelet_dir(self) -> Path:
        return self.state_dir / "kubelet"

    @property
    def state_file(self) -> Path:
        return self.state_dir / "state.json"

    def log_path(self, component: str) -> Path:
        return self.state_dir / "logs" / f"{component}.log"

    def ctr(self) -> list[str]:
        """`ctr` against this node's containerd (add `-n k8s.io ...`)."""
        return [str(self.bin_dir / "ctr"), "--address", str(self.containerd_socket)]

    # ---------------------------------------------------------------- lifecycle

    def start(self, timeout: float = 180.0) -> RealNode:
        """Clean up any leftovers, then start containerd, import images, start kubelet and
        kube-proxy, and wait until the node is Ready with its GPUs allocatable."""
        missing = missing_node_binaries()
        if missing:
            raise StartupError(f"missing node binaries {missing}: run tests/cluster/build-node.sh")
        unbuilt = missing_images(self.images)
        if unbuilt:
            raise StartupError(f"images not built {unbuilt}: run tests/cluster/build-images.sh")
        self._take_lock()
        t0 = time.monotonic()
        deadline = t0 + timeout
        try:
            self._service_cidr = self._read_service_cidr()
            self._cleanup_leftovers()
            self.timings["cleanup"] = time.monotonic() - t0
            self._prepare()
            self._start_containerd(deadline)
            t = time.monotonic()
            self.import_images(*self.images)
            self.timings["import"] = time.monotonic() - t
            self._start_kubelet(deadline)
            self._start_kube_proxy(deadline)
        except BaseException:
            self.stop()
            raise
        self.timings["total"] = time.monotonic() - t0
        return self

    def stop(self) -> None:
        """Delete this node's pods, stop kubelet, kill every container, stop kube-proxy
        and containerd, unmount, remove the bridge, routes, rules and the Node object,
        restore kernel settings. Idempotent, and each step runs even if an earlier one
        failed. A node another process holds (its lock) is left alone; a leftover of a
        crashed run is cleaned up."""
        if self._lock is None:
            try:
                self._take_lock()
            except StartupError as err:
                log(f"real node: not stopping, {err}")
                return
        steps: list[tuple[str, Callable[[], None]]] = [
            ("drain pods", self._drain_pods),
            ("stop kubelet", lambda: self._stop_component("kubelet")),
            ("stop kube-proxy", lambda: self._stop_component("kube-proxy")),
            ("kill containers", self._kill_containers),
            ("stop containerd", lambda: self._stop_component("containerd")),
            ("kill strays", self._kill_strays),
            ("tear down the host", self._teardown_host),
            ("delete the Node", self._delete_node),
        ]
        for what, step in steps:
            try:
                step()
            except Exception as err:  # the next steps still run
                log(f"real node stop: {what} failed: {err}")
        self._procs.clear()
        self._release_lock()

    def _kill_strays(self) -> None:
        """Whatever else runs from this state directory (a component started by hand,
        or by a crashed run)."""
        for pid in _pids_mentioning(str(self.state_dir), COMPONENTS):
            _kill_pid(pid, None)

    def import_images(self, *refs: str) -> list[str]:
        """Import built images (build-images.sh) containerd does not hold yet, e.g. one
        built after start(); return those imported."""
        t = time.monotonic()
        imported = ensure_imported(Store(images_dir()), refs, self.ctr())
        if imported:
            log(f"imported {imported} in {time.monotonic() - t:.0f}s")
        return imported

    def __enter__(self) -> RealNode:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---------------------------------------------------------------- state + lock

    def _take_lock(self) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        lock = (self.state_dir / "lock").open("w")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            raise StartupError(f"another RealNode holds {self.state_dir / 'lock'}") from None
        self._lock = lock

    def _release_lock(self) -> None:
        if self._lock is not None:
            fcntl.flock(self._lock, fcntl.LOCK_UN)
            self._lock.close()
            self._lock = None

    def _load_state(self) -> dict[str, Any]:
        try:
            state: dict[str, Any] = json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            return {}
        return state

    def _save_state(self, **changes: Any) -> None:
        state = self._load_state() | changes
        self.state_file.write_text(json.dumps(state, indent=2))

    # ---------------------------------------------------------------- cleanup

    def _cleanup_leftovers(self) -> None:
        """Undo a previous run that did not stop: its processes (by recorded pid, and by
        command line naming this state directory), its containers (containerd restarts
        on the same state directory and reconnects to their shims, so they are killed
        through it), mounts, network and cgroups."""
        state = self._load_state()
        for name, pid in (state.get("pids") or {}).items():
            _kill_pid(int(pid), name)
        self._kill_strays()
        # A clean stop removes containerd's state directory; a crash leaves its tasks there.
        tasks = self.state_dir / "containerd" / "state" / "io.containerd.runtime.v2.task"
        config = self.state_dir / "containerd" / "config.toml"
        if config.is_file() and tasks.is_dir() and any(tasks.rglob("config.json")):
            with contextlib.suppress(StartupError, OSError):
                self._start_containerd(time.monotonic() + 30, fresh=False)
                self._kill_containers()
            self._stop_component("containerd")
        self._teardown_host(sysctls=state.get("sysctls") or {})
        self._procs.clear()

    def _drain_pods(self, timeout: float = 10.0) -> None:
        """Delete the pods bound to this node (no grace) and give kubelet time to stop
        them through CRI, which also releases their network (CNI DEL)."""
        if "kubelet" not in self._procs or self._procs["kubelet"].poll() is not None:
            return
        selector = f"spec.nodeName={self.name}"
        self._kubectl(
            "delete", "pods", "--all-namespaces", "--field-selector", selector,
            "--grace-period=0", "--force", "--wait=false", "--request-timeout=10s",
            check=False,
        )  # fmt: skip
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self._tasks():
                return
            time.sleep(0.5)

    def _tasks(self) -> list[str]:
        try:
            out = subprocess.run(
                [*self.ctr(), "-n", "k8s.io", "tasks", "ls", "-q"],
                capture_output=True, text=True, timeout=10,
            )  # fmt: skip
        except (OSError, subprocess.TimeoutExpired):
            return []
        return out.stdout.split() if out.returncode == 0 else []

    def _kill_containers(self) -> None:
        """SIGKILL every task in containerd's k8s.io namespace, then delete tasks and
        containers (what kubelet did not get to)."""
        if not self.containerd_socket.exists():
            return
        ctr = [*self.ctr(), "-n", "k8s.io"]
        tasks = self._tasks()
        for task in tasks:
            _run([*ctr, "tasks", "kill", "-a", "-s", "SIGKILL", task])
        for task in tasks:
            _run([*ctr, "tasks", "delete", "-f", task])
        containers = _run([*ctr, "containers", "ls", "-q"]).split()
        if containers:
            _run([*ctr, "containers", "delete", *containers])
        self._killed.update(containers)

    def _teardown_host(self, sysctls: Mapping[str, str] | None = None) -> None:
        """Everything outside the processes: stray processes in our cgroups, mounts,
        network namespaces, the bridge, routes, nftables/iptables rules, cgroups,
        kernel settings, and the run's directories (containerd's image store stays)."""
        _kill_cgroup_processes(CGROUP_PARENT)
        for pid in _pids_mentioning(str(self.containerd_socket), ("containerd-shim-runc-v2",)):
            _kill_pid(pid, None)
        ephemeral = [self.kubelet_dir, self.state_dir / "containerd" / "state"]
        for path in ephemeral:
            _unmount_below(path)
        _unmount_below(self.state_dir / "containerd" / "root")  # overlay rootfs, if any
        self._remove_container_log_links()
        self._teardown_network()
        _remove_cgroups(CGROUP_PARENT)
        saved = sysctls if sysctls is not None else self._load_state().get("sysctls") or {}
        for key, value in saved.items():
            _write_sysctl(key, value)
        for path in [*ephemeral, self.state_dir / "cni", self.state_dir / "pki"]:
            shutil.rmtree(path, ignore_errors=True)
        self._save_state(pids={}, sysctls={})

    def _teardown_network(self) -> None:
        kube_proxy = self.bin_dir / "kube-proxy"
        if kube_proxy.exists():  # removes its iptables, ipvs and nftables rules
            _run([str(kube_proxy), "--cleanup", "--v=0"], timeout=60)
        _run(["nft", "delete", "table", "inet", GUARD_TABLE])
        # kubelet's canary and firewall chains (KUBE-*) and portmap's (CNI-*)
        for table in ("nat", "filter", "mangle"):
            _delete_iptables_chains(table, prefixes=("KUBE-", "CNI-"))
        _run(["ip", "link", "delete", BRIDGE])
        service_cidr = self._service_cidr or self._load_state().get("service_cidr")
        if service_cidr:
            _run(["ip", "route", "delete", service_cidr, "dev", BRIDGE])
        # libcni's cache of results (a fixed directory): our network's, and the loopback
        # results of the sandboxes killed without CNI DEL.
        results = Path("/var/lib/cni/results")
        for path in results.glob(f"{NETWORK}-*"):
            path.unlink(missing_ok=True)
        for sandbox in self._killed:
            (results / f"cni-loopback-{sandbox}-lo").unlink(missing_ok=True)
        _set_hosts_entry(None)
        _remove_empty_run_containerd()
        _remove_empty_dirs(results, results.parent, Path("/var/log/containers"))
        # kubelet's device plugin socket lives at a fixed path, whatever its root dir.
        if not _pids_mentioning("", ("kubelet",)):
            plugins = Path("/var/lib/kubelet/device-plugins")
            (plugins / "kubelet.sock").unlink(missing_ok=True)
            _remove_empty_dirs(plugins, plugins.parent)

    def _remove_container_log_links(self) -> None:
        """kubelet links /var/log/containers/* to the pod logs it keeps (a fixed path)."""
        logs = Path("/var/log/containers")
        if not logs.is_dir():
            return
        pod_logs = str(self.state_dir / "pod-logs")
        for link in logs.iterdir():
            with contextlib.suppress(OSError):
                if link.is_symlink() and os.readlink(link).startswith(pod_logs):
                    link.unlink()

    def _delete_node(self) -> None:
        if self.kubeconfig.is_file():
            self._kubectl("delete", "node", self.name, "--ignore-not-found", "--wait=false",
                          "--request-timeout=10s", check=False, timeout=20)  # fmt: skip

    # ---------------------------------------------------------------- preparation

    def _prepare(self) -> None:
        """Directories, certificates, kubeconfigs, configs, the bridge and the routes."""
        for sub in ("logs", "pki", "cni/net.d", "cni/networks", "pod-logs", "kubelet",
                    "containerd/root", "containerd/state", "volume-plugins"):  # fmt: skip
            (self.state_dir / sub).mkdir(parents=True, exist_ok=True)
        for component in COMPONENTS:
            self.log_path(component).unlink(missing_ok=True)
        shutil.rmtree(self.state_dir / "pod-logs", ignore_errors=True)  # the last run's
        (self.state_dir / "pod-logs").mkdir()
        self._save_state(
            sysctls={k: v for k in SYSCTLS if (v := _read_sysctl(k)) is not None},
            service_cidr=self._service_cidr,
        )
        self._ports = {
            "kubelet": free_port(),
            "kubelet-healthz": free_port(),
            "proxy-healthz": free_port(),
            "proxy-metrics": free_port(),
        }
        self._write_credentials()
        self._write_cni_config()
        self._write_containerd_config()
        self._setup_network()
        _make_cgroups(CGROUP_PARENT)

    def _read_service_cidr(self) -> str:
        """The API server's Service CIDR (the default ServiceCIDR object, GA in 1.33)."""
        out = self._kubectl(
            "get", "servicecidr", "kubernetes", "-o", "jsonpath={.spec.cidrs[0]}", check=False
        )
        cidr = out.strip()
        return cidr or "10.0.0.0/24"

    def _write_credentials(self) -> None:
        """Client certificates signed by the control plane's CA: the kubelet as
        system:node:<name> (group system:nodes), kube-proxy as system:kube-proxy. The
        API server authorizes with RBAC only (no Node authorizer), so the kubelet's user
        is bound to the built-in system:node ClusterRole; system:kube-proxy is bound to
        system:node-proxier by Kubernetes itself."""
        pki_dir = self.state_dir / "pki"
        server = kc.current_cluster(self.kubeconfig)["server"]
        ca_data = _b64(self.pki.ca_crt.read_bytes())
        users = {
            "kubelet": (f"system:node:{self.name}", "system:nodes"),
            "kube-proxy": ("system:kube-proxy", None),
        }
        for component, (user, group) in users.items():
            crt, key = _issue_client_cert(self.pki, user, group)
            cluster = {"server": server, "certificate-authority-data": ca_data}
            creds = {"client-certificate-data": _b64(crt), "client-key-data": _b64(key)}
            config = {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "local", "cluster": cluster}],
                "users": [{"name": user, "user": creds}],
                "contexts": [{"name": "local", "context": {"cluster": "local", "user": user}}],
                "current-context": "local",
            }
            path = pki_dir / f"{component}.kubeconfig"
            path.write_text(yaml.safe_dump(config, sort_keys=False))
            path.chmod(0o600)
        binding = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": f"rooftop-real-node:{self.name}"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": "system:node"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                          "name": f"system:node:{self.name}"}],
        }  # fmt: skip
        self._kubectl("apply", "-f", "-", stdin=json.dumps(binding))

    def _write_cni_config(self) -> None:
        """bridge (no masquerade; routes: the Service CIDR only, via the bridge) +
        host-local IPAM + portmap. containerd runs the loopback plugin itself."""
        conflist = {
            "cniVersion": "1.0.0",
            "name": NETWORK,
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": BRIDGE,
                    "isGateway": True,
                    "isDefaultGateway": False,
                    "ipMasq": False,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": POD_CIDR, "gateway": self.gateway}]],
                        "routes": [{"dst": self._service_cidr}],
                        "dataDir": str(self.state_dir / "cni" / "networks"),
                    },
                },
                {"type": "portmap", "capabilities": {"portMappings": True}, "snat": False},
            ],
        }
        path = self.state_dir / "cni" / "net.d" / f"10-{NETWORK}.conflist"
        path.write_text(json.dumps(conflist, indent=2))

    def _write_containerd_config(self) -> None:
        root = self.state_dir / "containerd"
        cri = 'plugins."io.containerd.grpc.v1.cri"'
        config = f"""\
# Written by tests/cluster/realnode.py; containerd 1.6 (config version 2).
version = 2
root = "{root / "root"}"
state = "{root / "state"}"
disabled_plugins = [
  "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing",
]

[grpc]
  address = "{self.containerd_socket}"

[plugins."io.containerd.internal.v1.opt"]
  path = "{root / "opt"}"

[{cri}]
  sandbox_image = "{PAUSE_IMAGE}"
  # pod network namespaces under our state directory, not /var/run/netns
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  disable_tcp_service = true
  enable_selinux = false
  disable_apparmor = true
  tolerate_missing_hugetlb_controller = true
  disable_hugetlb_controller = true
  # Pods ask for OOM score adjustments below containerd's own (the pause container's
  # -998); lowering it needs CAP_SYS_RESOURCE, which a sandboxed CI machine may not
  # grant (runc then fails with "can't get final child's PID from pipe: EOF").
  restrict_oom_score_adj = true

[{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"

[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[{cri}.containerd.runtimes.runc.options]
  BinaryName = "{self.bin_dir / "runc"}"
  Root = "{root / "state" / "runc"}"
  SystemdCgroup = false

[{cri}.cni]
  bin_dir = "{self.cni_bin_dir}"
  conf_dir = "{self.state_dir / "cni" / "net.d"}"
  max_conf_num = 1

[{cri}.registry]
  config_path = ""
"""
        (root / "config.toml").write_text(config)

    def _setup_network(self) -> None:
        """The bridge with the gateway address (before kubelet: it is the node IP),
        the host route that keeps Service IPs local, and the forwarding guard."""
        gw = f"{self.gateway}/{ipaddress.ip_network(POD_CIDR).prefixlen}"
        _run(["ip", "link", "add", BRIDGE, "type", "bridge"], check=True)
        _run(["ip", "addr", "add", gw, "dev", BRIDGE], check=True)
        _run(["ip", "link", "set", BRIDGE, "up"], check=True)
        _run(["ip", "route", "add", self._service_cidr, "dev", BRIDGE, "src", self.gateway],
             check=True)  # fmt: skip
        guard = f"""\
table inet {GUARD_TABLE} {{
  chain forward {{
    type filter hook forward priority -200; policy accept;
    iifname "{BRIDGE}" oifname != "{BRIDGE}" drop
    oifname "{BRIDGE}" iifname != "{BRIDGE}" drop
  }}
}}
"""
        subprocess.run(["nft", "-f", "-"], input=guard, text=True, check=True)
        _write_sysctl("net/ipv4/ip_forward", "1")
        # The API server reaches kubelet (logs, exec) at the node's InternalIP
        # (controlplane.py: --kubelet-preferred-address-types); the /etc/hosts line for
        # the node name stays as a guard for a control plane started without that flag.
        _set_hosts_entry(f"{self.gateway} {self.name}")

    # ---------------------------------------------------------------- components

    def _start_component(self, name: str, argv: list[str]) -> None:
        env = {"PATH": f"{self.bin_dir}:{SYSTEM_PATH}"}
        die_with_parent = self.die_with_parent

        def setup() -> None:
            # Containers inherit containerd's open-file limit; vLLM wants far more than
            # a shell's usual 1024 (so does any server a cluster node runs).
            # Up to NOFILE, or the hard limit where raising it is not permitted.
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, NOFILE))
            except (OSError, ValueError):
                hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
                resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            if die_with_parent:
                parent_death_signal()

        with self.log_path(name).open("ab") as out:
            proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                cwd=self.state_dir, env=env, start_new_session=True, preexec_fn=setup,
            )  # fmt: skip
        self._procs[name] = proc
        pids = self._load_state().get("pids") or {}
        self._save_state(pids=pids | {name: proc.pid})

    def _stop_component(self, name: str, grace: float = 10.0) -> None:
        proc = self._procs.pop(name, None)
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)

    def _wait(self, name: str, ready: Callable[[], bool], deadline: float) -> None:
        delay = 0.05
        while not ready():
            proc = self._procs.get(name)
            if proc is not None and proc.poll() is not None:
                raise StartupError(f"{name} exited with {proc.returncode}\n{self.tail(name)}")
            if time.monotonic() > deadline:
                raise StartupError(f"{name} not ready in time\n{self.tail(name)}")
            time.sleep(delay)
            delay = min(delay * 1.5, 0.5)

    def tail(self, name: str, lines: int = 40) -> str:
        path = self.log_path(name)
        if not path.is_file():
            return ""
        text = path.read_text(errors="replace").splitlines()[-lines:]
        return f"--- {path} (last {lines} lines) ---\n" + "\n".join(text)

    def _start_containerd(self, deadline: float, fresh: bool = True) -> None:
        t = time.monotonic()
        config = self.state_dir / "containerd" / "config.toml"
        argv = [str(self.bin_dir / "containerd"), "--config", str(config), "--log-level", "warn"]
        self._start_component("containerd", argv)

        def ready() -> bool:
            done = subprocess.run([*self.ctr(), "version"], capture_output=True, timeout=10)
            return done.returncode == 0

        self._wait("containerd", ready, deadline)
        if fresh:
            self.timings["containerd"] = time.monotonic() - t

    def _start_kubelet(self, deadline: float) -> None:
        t = time.monotonic()
        pki_dir = self.state_dir / "pki"
        config = self.state_dir / "kubelet-config.yaml"
        config.write_text(yaml.safe_dump(self._kubelet_config(), sort_keys=False))
        labels = self._labels()
        argv = [
            str(self.bin_dir / "kubelet"),
            f"--config={config}",
            f"--kubeconfig={pki_dir / 'kubelet.kubeconfig'}",
            f"--root-dir={self.kubelet_dir}",
            f"--cert-dir={pki_dir / 'kubelet-serving'}",
            f"--hostname-override={self.name}",
            f"--node-ip={self.gateway}",
            "--node-labels=" + ",".join(f"{k}={v}" for k, v in sorted(labels.items())),
            "--v=1",
        ]
        self._start_component("kubelet", argv)
        self._wait("kubelet", self._node_ready, deadline)
        self.timings["kubelet"] = time.monotonic() - t
        self._advertise_gpus()
        self._wait("kubelet", self._gpus_allocatable, deadline)
        self.timings["gpus"] = time.monotonic() - t - self.timings["kubelet"]

    def _kubelet_config(self) -> dict[str, Any]:
        """KubeletConfiguration (kubelet.config.k8s.io/v1beta1, checked against v1.34)."""
        resolv = self.state_dir / "resolv.conf"
        resolv.write_text("# no DNS: nothing may leave this machine\n")
        return {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "containerRuntimeEndpoint": f"unix://{self.containerd_socket}",
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": f"/{CGROUP_PARENT}",
            "failCgroupV1": False,  # this machine has cgroup v1; 1.35 refuses it without
            "failSwapOn": False,
            # Served on the bridge address only; the API server reaches it there for
            # logs and exec, anonymously (it has no kubelet client certificate).
            "address": self.gateway,
            "port": self._ports["kubelet"],
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": self._ports["kubelet-healthz"],
            "authentication": {
                "anonymous": {"enabled": True},
                "webhook": {"enabled": False},
                "x509": {"clientCAFile": str(self.pki.ca_crt)},
            },
            "authorization": {"mode": "AlwaysAllow"},
            "registerNode": True,
            "registerWithTaints": [dict(t) for t in self.taints],
            "maxPods": 16,
            "podCIDR": POD_CIDR,
            "podLogsDir": str(self.state_dir / "pod-logs"),
            "volumePluginDir": str(self.state_dir / "volume-plugins"),
            "resolvConf": str(resolv),
            "clusterDomain": "cluster.local",
            # A shared test disk: never evict over disk; images are never collected.
            "evictionHard": {
                "memory.available": "100Mi",
                "nodefs.available": "1%",
                "nodefs.inodesFree": "1%",
                "imagefs.available": "1%",
            },
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "serializeImagePulls": False,
            "nodeStatusUpdateFrequency": "5s",
            "syncFrequency": "10s",
            "shutdownGracePeriod": "0s",
            "containerLogMaxSize": "50Mi",
        }

    def _labels(self) -> dict[str, str]:
        """The kwok GPU nodes' GPU Feature Discovery labels for `gpu`, with this node's
        GPU count, plus a label saying the node is real."""
        kwok = fake_nodes.gpu_node(self.gpu, 0)["metadata"]["labels"]
        keep = {k: v for k, v in kwok.items() if k.startswith("nvidia.com/")}
        keep["node.kubernetes.io/instance-type"] = kwok["node.kubernetes.io/instance-type"]
        keep["nvidia.com/gpu.count"] = str(self.gpu_count)
        return keep | {REAL_NODE_LABEL: "true"}

    @property
    def gpu_count(self) -> int:
        return self.gpu.gpus if self.gpus is None else self.gpus

    def _advertise_gpus(self) -> None:
        """What a device plugin would advertise: `nvidia.com/gpu` capacity and
        allocatable, through the node's status subresource (kubelet keeps extended
        resources it does not manage)."""
        gpus = {"nvidia.com/gpu": str(self.gpu_count)}
        patch = {"status": {"capacity": gpus, "allocatable": gpus}}
        self._kubectl(
            "patch", "node", self.name, "--subresource=status", "--type=merge",
            "-p", json.dumps(patch),
        )  # fmt: skip

    def _node(self) -> dict[str, Any] | None:
        out = self._kubectl("get", "node", self.name, "-o", "json", check=False)
        if not out:
            return None
        node: dict[str, Any] = json.loads(out)
        return node

    def _node_ready(self) -> bool:
        """Ready, and the node lifecycle controller has lifted its not-ready taint: it
        does so on its next pass (every 5 s) after the kubelet reports Ready, and until
        then new pods without a toleration do not schedule here."""
        node = self._node()
        if node is None:
            return False
        conditions = node.get("status", {}).get("conditions") or []
        ready = any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
        taints = {t.get("key") for t in node.get("spec", {}).get("taints") or []}
        return ready and not taints & LIFECYCLE_TAINTS

    def _gpus_allocatable(self) -> bool:
        node = self._node() or {}
        allocatable = node.get("status", {}).get("allocatable") or {}
        return str(allocatable.get("nvidia.com/gpu")) == str(self.gpu_count)

    def _start_kube_proxy(self, deadline: float) -> None:
        t = time.monotonic()
        config = self.state_dir / "kube-proxy-config.yaml"
        config.write_text(yaml.safe_dump(self._kube_proxy_config(), sort_keys=False))
        argv = [str(self.bin_dir / "kube-proxy"), f"--config={config}", "--v=1"]
        self._start_component("kube-proxy", argv)
        url = f"http://127.0.0.1:{self._ports['proxy-healthz']}/healthz"
        self._wait("kube-proxy", lambda: _http_ok(url), deadline)
        self.timings["kube-proxy"] = time.monotonic() - t

    def _kube_proxy_config(self) -> dict[str, Any]:
        """KubeProxyConfiguration (kubeproxy.config.k8s.io/v1alpha1), nftables mode.
        conntrack values of 0 leave the kernel's settings alone."""
        return {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "mode": "nftables",
            "clientConnection": {
                "kubeconfig": str(self.state_dir / "pki" / "kube-proxy.kubeconfig")
            },
            "hostnameOverride": self.name,
            "clusterCIDR": POD_CIDR,
            "detectLocalMode": "ClusterCIDR",
            "healthzBindAddress": f"127.0.0.1:{self._ports['proxy-healthz']}",
            "metricsBindAddress": f"127.0.0.1:{self._ports['proxy-metrics']}",
            "nodePortAddresses": [f"{self.gateway}/32"],
            "oomScoreAdj": 0,  # the default, -999, needs CAP_SYS_RESOURCE
            "conntrack": {
                "maxPerCore": 0,
                "min": 0,
                "tcpEstablishedTimeout": "0s",
                "tcpCloseWaitTimeout": "0s",
            },
        }

    # ---------------------------------------------------------------- helpers

    def _kubectl(
        self, *args: str, check: bool = True, stdin: str | None = None, timeout: float = 60
    ) -> str:
        kubectl = _find_kubectl()
        done = subprocess.run(
            [str(kubectl), f"--kubeconfig={self.kubeconfig}", *args],
            input=stdin, capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip
        if check and done.returncode != 0:
            raise StartupError(f"kubectl {' '.join(args)}: {done.stderr.strip()}")
        return done.stdout if done.returncode == 0 else ""


# ---------------------------------------------------------------- module helpers


def _find_kubectl() -> Path:
    found = find_binary("kubectl")
    if found is None:
        raise StartupError("kubectl not found: run `make tools`")
    return found


def _issue_client_cert(pki: Pki, user: str, group: str | None) -> tuple[bytes, bytes]:
    """A client certificate (PEM) and its key for `user` (CN) in `group` (O)."""
    ca_cert = x509.load_pem_x509_certificate(pki.ca_crt.read_bytes())
    ca_key = serialization.load_pem_private_key(pki.ca_key.read_bytes(), password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise TypeError("the control plane's CA key is not the ECDSA key pki.py writes")
    key = ec.generate_private_key(ec.SECP256R1())
    attributes = [x509.NameAttribute(NameOID.COMMON_NAME, user)]
    if group:
        attributes.insert(0, x509.NameAttribute(NameOID.ORGANIZATION_NAME, group))
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name(attributes))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=30))
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _run(argv: list[str], check: bool = False, timeout: float = 30) -> str:
    """Run a cleanup/setup command; its stdout ('' when it fails and check is False)."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as err:
        if check:
            raise StartupError(f"{' '.join(argv)}: {err}") from err
        return ""
    if check and done.returncode != 0:
        raise StartupError(f"{' '.join(argv)} -> exit {done.returncode}: {done.stderr.strip()}")
    return done.stdout if done.returncode == 0 else ""


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return int(resp.status) == 200
    except (OSError, ValueError):
        return False


def _pids_mentioning(text: str, names: tuple[str, ...]) -> list[int]:
    """Pids of processes named one of `names` whose command line contains `text`."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if not argv or not argv[0]:
            continue
        name = Path(argv[0].decode(errors="replace")).name
        if name in names and text.encode() in b" ".join(argv):
            found.append(int(proc.name))
    return found


def _kill_pid(pid: int, name: str | None) -> None:
    """SIGKILL pid if it still runs `name` (any name when None: the caller matched it)."""
    if pid <= 1 or pid == os.getpid():
        return
    if name is not None:
        try:
            argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0", 1)[0]
        except OSError:
            return
        if Path(argv0.decode(errors="replace")).name != name:
            return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGKILL)
    for _ in range(50):
        if not Path(f"/proc/{pid}").exists():
            return
        time.sleep(0.02)


def _cgroup_mounts() -> list[Path]:
    """Each mounted cgroup v1 hierarchy (or the v2 root)."""
    mounts = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        if len(fields) > 2 and fields[2] in ("cgroup", "cgroup2"):
            mounts.append(Path(fields[1]))
    return mounts


def _make_cgroups(parent: str) -> None:
    """kubelet's cgroupRoot must exist in every hierarchy before it starts."""
    for mount in _cgroup_mounts():
        (mount / parent).mkdir(exist_ok=True)


def _kill_cgroup_processes(parent: str) -> None:
    """SIGKILL whatever still runs in a cgroup below `parent` (containers whose shim
    died with a crashed run keep running otherwise)."""
    for mount in _cgroup_mounts():
        root = mount / parent
        if not root.is_dir():
            continue
        for procs in root.rglob("cgroup.procs"):
            with contextlib.suppress(OSError, ValueError):
                for pid in procs.read_text().split():
                    _kill_pid(int(pid), None)


def _remove_cgroups(parent: str) -> None:
    """rmdir the cgroup tree below `parent`, deepest first (cgroupfs only removes empty
    cgroup directories with rmdir)."""
    for mount in _cgroup_mounts():
        root = mount / parent
        if not root.is_dir():
            continue
        dirs = sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts))
        for path in [*dirs, root]:
            with contextlib.suppress(OSError):
                path.rmdir()


def _unmount_below(path: Path) -> None:
    """Unmount every mount point at or below `path`, deepest first (lazily: a process
    that still holds one must not block the teardown)."""
    prefix = str(path.resolve()) if path.exists() else str(path)
    points = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        point = line.split()[1].replace("\\040", " ")
        if point == prefix or point.startswith(prefix + "/"):
            points.append(point)
    for point in sorted(set(points), key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True)


def _delete_iptables_chains(table: str, prefixes: tuple[str, ...]) -> None:
    """Flush and delete (after unlinking the jumps to them) chains named with one of
    `prefixes` in `table`, for iptables and ip6tables."""
    for tool in ("iptables", "ip6tables"):
        rules = _run([tool, "-t", table, "-S"])
        chains = [
            line.split()[1]
            for line in rules.splitlines()
            if line.startswith("-N ") and line.split()[1].startswith(prefixes)
        ]
        for line in rules.splitlines():
            parts = shlex.split(line)  # comments are quoted
            if parts[:1] == ["-A"] and "-j" in parts and parts[parts.index("-j") + 1] in chains:
                _run([tool, "-t", table, "-D", *parts[1:]])
        for chain in chains:
            _run([tool, "-t", table, "-F", chain])
        for chain in chains:
            _run([tool, "-t", table, "-X", chain])
        # A table left with nothing but empty built-in chains was created for us (the
        # iptables-nft tables did not exist before kubelet): remove it too.
        left = _run([tool, "-t", table, "-S"]).splitlines()
        if left and all(line.startswith("-P ") and line.endswith(" ACCEPT") for line in left):
            family = "ip" if tool == "iptables" else "ip6"
            _run(["nft", "delete", "table", family, table])


HOSTS_MARK = "# rooftop-real-node"


def _set_hosts_entry(entry: str | None) -> None:
    """Replace this module's line in /etc/hosts with `entry` (None: remove it). Written
    in place: /etc/hosts is often a bind mount that a rename would not update."""
    hosts = Path("/etc/hosts")
    try:
        lines = hosts.read_text().splitlines()
    except OSError:
        return
    kept = [line for line in lines if not line.endswith(HOSTS_MARK)]
    if entry is not None:
        kept.append(f"{entry}  {HOSTS_MARK}")
    if kept != lines:
        with hosts.open("r+") as f:
            f.write("\n".join(kept) + "\n")
            f.truncate()


def _remove_empty_dirs(*paths: Path) -> None:
    """rmdir each path that is an empty directory (in order: children first)."""
    for path in paths:
        with contextlib.suppress(OSError):
            path.rmdir()


def _remove_empty_run_containerd() -> None:
    """containerd 1.6 keeps shim sockets and FIFOs under /run/containerd whatever its
    state directory: remove what it left there, empty, unless a system containerd runs."""
    run = Path("/run/containerd")
    if not run.is_dir() or (run / "containerd.sock").exists():
        return
    for path in sorted(run.rglob("*"), key=lambda p: -len(p.parts)):
        with contextlib.suppress(OSError):
            path.rmdir()
    with contextlib.suppress(OSError):
        run.rmdir()


def _read_sysctl(key: str) -> str | None:
    try:
        return (Path("/proc/sys") / key).read_text().strip()
    except OSError:
        return None


def _write_sysctl(key: str, value: str) -> None:
    with contextlib.suppress(OSError):
        (Path("/proc/sys") / key).write_text(value)
