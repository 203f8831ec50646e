"""Engine processes behind kwok pods, and a load driver, for closed-loop tests.

kwok marks pods Running but runs no containers, so nothing would answer requests or
export metrics. ``EngineFleet`` stands in for the kubelet: it watches one target's engine
pods and, for each Running pod, starts that pod's own command (the ``rooftop engine-sim``
line the operator put in the Deployment) as a local process on the pod's own IP and
container port (kwok's pod IPs are loopback addresses, ``controlplane.KWOK_POD_CIDR``),
and stops it when the pod goes away. A Prometheus that discovers the pods through the
API server (the Prometheus Operator's configuration, ``prometheus_operator``) scrapes
them there, with the selection and relabeling of the operator's PodMonitor.
``LoadDriver`` sends Poisson traffic at a rate the test changes, spread over the live
engines as a Service would spread it.
"""

from __future__ import annotations

import asyncio
import random
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import aiohttp
from kubernetes import client

from rooftop_api.spec import TARGET_LABEL
from rooftop_operator.builders import APP_NAME, PORT_NAME
from rooftop_sim.loadgen import LoadSpec, RequestResult, send_request


def pod_endpoint(pod: Mapping[str, Any], port_name: str) -> tuple[str, int]:
    """(pod IP, container port named ``port_name``): where the pod's container would
    listen, and where a Prometheus that discovers the pod scrapes it.

    Raises:
        ValueError: the pod has no IP yet, or no such port.
    """
    name, ip = pod["metadata"]["name"], (pod.get("status") or {}).get("podIP")
    if not ip:
        raise ValueError(f"pod {name} has no IP yet")
    for port in pod["spec"]["containers"][0].get("ports") or []:
        if port.get("name") == port_name:
            return str(ip), int(port["containerPort"])
    raise ValueError(f"pod {name} has no port named {port_name}")


def engine_argv(pod: Mapping[str, Any], host: str, port: int, extra: Sequence[str]) -> list[str]:
    """The pod's ``rooftop engine-sim`` command, bound to ``host``:``port`` here.

    Raises:
        ValueError: the pod does not run the engine simulator (a ``mode: vllm`` pod).
    """
    command = list(pod["spec"]["containers"][0].get("command") or [])
    if command[:2] != ["rooftop", "engine-sim"]:
        raise ValueError(f"pod {pod['metadata']['name']} does not run engine-sim: {command}")
    args = command[2:]
    for flag, value in (("--host", host), ("--port", str(port))):
        if flag in args:
            args[args.index(flag) + 1] = value
        else:
            args += [flag, value]
    script = Path(sys.executable).with_name("rooftop")
    launcher = [str(script)] if script.exists() else [sys.executable, "-m", "rooftop_cli.main"]
    return [*launcher, "engine-sim", *args, *extra]


@dataclass
class Engine:
    pod: str
    host: str
    port: int
    proc: subprocess.Popen[bytes]
    ready: bool = False

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.address}/health", timeout=1) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class PollingFleet:
    """What both engine fleets share: a thread that calls ``sync`` every ``poll_s``
    until stopped, errors kept for the test to read, and every engine stopped at the end.

    Subclasses are dataclasses that declare these attributes and define ``sync``.
    """

    thread_name = "engine-fleet"
    join_timeout_s = 15.0
    poll_s: float
    engines: dict[str, Any]
    errors: list[str]
    _stop: threading.Event
    _lock: threading.Lock
    _thread: threading.Thread | None

    def start(self) -> Self:
        self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.join_timeout_s)
        with self._lock:
            for engine in self.engines.values():
                engine.stop()
            self.engines.clear()

    def sync(self) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.sync()
            except Exception as err:  # keep serving; the test reads `errors`
                self.errors.append(f"{type(err).__name__}: {err}")
            self._stop.wait(self.poll_s)


@dataclass
class EngineFleet(PollingFleet):
    """One engine process per Running engine pod of ``target`` (see the module doc).

    Attributes:
        extra_args: appended to every engine's command (e.g. ``--reality-factor 1.2``:
            the simulated world, which the operator must not know).
    """

    api: Any
    namespace: str
    target: str
    log_dir: Path
    extra_args: Sequence[str] = ()
    poll_s: float = 0.5
    engines: dict[str, Engine] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _thread: threading.Thread | None = None

    def endpoints(self) -> list[str]:
        """Base URLs of the engines that answer /health (what a Service would route to)."""
        with self._lock:
            return [f"http://{e.address}" for e in self.engines.values() if e.ready]

    def sync(self) -> None:
        """One pass: start engines for new Running pods, stop those of gone pods."""
        selector = f"app.kubernetes.io/name={APP_NAME},{TARGET_LABEL}={self.target}"
        pods = client.CoreV1Api(self.api).list_namespaced_pod(
            self.namespace, label_selector=selector
        )
        running = {
            p.metadata.name: self.api.sanitize_for_serialization(p)
            for p in pods.items
            if p.status.phase == "Running"
            and p.status.pod_ip
            and p.metadata.deletion_timestamp is None
        }
        with self._lock:
            for name in [n for n in self.engines if n not in running]:
                self.engines.pop(name).stop()
            for name, pod in running.items():
                if name not in self.engines:
                    self.engines[name] = self._spawn(pod)
            for engine in self.engines.values():
                engine.ready = engine.ready or engine.healthy()

    def _spawn(self, pod: Mapping[str, Any]) -> Engine:
        name = pod["metadata"]["name"]
        host, port = pod_endpoint(pod, PORT_NAME)
        seed = ["--seed", str(random.Random(name).randrange(2**31))]
        argv = engine_argv(pod, host, port, [*self.extra_args, *seed])
        log = (self.log_dir / f"{name}.log").open("ab")
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        return Engine(name, host, port, proc)


@dataclass
class Sent:
    """One request of the driver: when it was sent (wall clock, s) and what came back."""

    at_s: float
    result: RequestResult


@dataclass
class LoadDriver:
    """Poisson arrivals at ``rate`` req/s (change it any time) over the fleet's engines."""

    fleet: EngineFleet
    model: str
    prompt_tokens: int
    output_tokens: int
    seed: int = 0
    rate: float = 0.0
    sent: list[Sent] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> LoadDriver:
        self._thread = threading.Thread(
            target=lambda: asyncio.run(self._main()), name="load-driver", daemon=True
        )
        self._thread.start()
        return self

    def stop(self, drain_s: float = 30.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=drain_s + 5)

    async def _main(self) -> None:
        rng = random.Random(self.seed)
        tasks: set[asyncio.Task[None]] = set()
        timeout = aiohttp.ClientTimeout(total=300)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while not self._stop.is_set():
                if self.rate <= 0:
                    await asyncio.sleep(0.1)
                    continue
                await asyncio.sleep(rng.expovariate(self.rate))
                endpoints = self.fleet.endpoints()
                if endpoints:
                    task = asyncio.create_task(self._one(session, rng.choice(endpoints)))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
            if tasks:
                await asyncio.wait(tasks, timeout=30)

    async def _one(self, session: aiohttp.ClientSession, url: str) -> None:
        spec = LoadSpec(url=url, model=self.model)
        at = time.time()
        result = await send_request(session, spec, self.prompt_tokens, self.output_tokens, 0.0)
        self.sent.append(Sent(at, result))
