"""One exporter serving vLLM's metric families for every engine pod of many targets.

``bench_scale.py --live`` uses it: the kwok pods run nothing, so without it every
target's loop holds on missing data and the steady state it measures is the idle one.
Here each engine pod the API server lists gets its own ``VllmMetrics`` registry (the
engine simulator's, with vLLM's names, types, labels and buckets) behind
``/metrics/<namespace>/<pod>``, and Prometheus scrapes one target per pod through its
file discovery (``__metrics_path__`` and the ``namespace``/``servingtarget``/``pod``
labels a PodMonitor's relabelings would give).

Each scrape of a pod first serves the pod's share of its target's traffic since the
last scrape, then answers: a Poisson count of finished requests whose prompt and output
lengths, TPOT, TTFT and prefix-cache hits are drawn around figures that differ per
target (``Profile.of``), so counts move, and lengths and hit rates vary from target to
target. The figures are synthetic on purpose: what this measures is the operator's cost
per target with live series, not what it decides. Requests finish as time passes, not on
a clock of the exporter's own, because a real engine's counters grow between any two
scrapes: a 60-s rate over 15-s lumps on another clock counts two, three or four lumps as
the clocks drift, and swings by half with the traffic steady. Every ``tick_s`` the
exporter follows the pods, and a pod's share follows its target's count.
"""

from __future__ import annotations

import random
import threading
import time
import zlib
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import generate_latest

from rooftop_sim.engine.vllm_metrics import VllmMetrics

TARGET_LABEL = "rooftop.dev/servingtarget"
MAX_MODEL_LEN = 131_072
CACHE_INFO = {"block_size": "16", "cache_dtype": "auto", "num_gpu_blocks": "30000"}

PodKey = tuple[str, str]  # (namespace, pod)
# Inter-token gaps observed per request: a fixed sample, with one step observed per
# ``running / GAPS`` requests (counted, not drawn: vLLM observes every step, so its
# gaps per step, the loop's decode batch, carry no sampling noise), so gaps per step
# is the running batch as in vLLM.
GAPS = 4
# A step slows with the batch it decodes (t = t₀ · (1 + B / BATCH_SLOWDOWN)), so a pod's
# TPOT falls when its target gets another pod, as an engine's would.
BATCH_SLOWDOWN = 32.0


@dataclass(frozen=True)
class Profile:
    """One target's traffic: requests/s over all its pods, mean lengths (tokens), the
    TPOT of a lone request and the TTFT (s), and the share of prompt tokens cached."""

    rate: float
    prompt: float
    output: float
    tpot_s: float
    ttft_s: float
    hit_ratio: float

    @classmethod
    def of(cls, target: str) -> Profile:
        """Figures spread over targets by a hash of the name, stable across runs."""
        r = random.Random(target)
        return cls(
            rate=r.uniform(2.0, 6.0),
            prompt=r.uniform(600.0, 1600.0),
            output=r.uniform(120.0, 360.0),
            tpot_s=r.uniform(0.007, 0.012),
            ttft_s=r.uniform(0.05, 0.4),
            hit_ratio=r.uniform(0.0, 0.6),
        )


class PodEngine:
    """One pod's registry and the requests it finished by its last scrape."""

    def __init__(self, target: str, seed: int) -> None:
        self.target = target
        self.profile = Profile.of(target)
        self.metrics = VllmMetrics("llama-3.1-8b", MAX_MODEL_LEN, CACHE_INFO)
        self.rng = random.Random(seed)
        self.steps_owed = 0.0  # steps observed per request: GAPS / running, carried over
        self.pods = 1  # the target's pods, as the exporter last listed them
        self.clock = time.monotonic  # s
        self.served_at = self.clock()
        self._lock = threading.Lock()  # one scrape at a time advances the counters

    def scrape(self) -> bytes:
        """The exposition after serving the requests finished since the last scrape."""
        with self._lock:
            now = self.clock()
            self.serve(now - self.served_at, self.pods)
            self.served_at = now
            return generate_latest(self.metrics.registry)

    def serve(self, dt_s: float, pods: int) -> None:
        """Finish a Poisson number of requests: this pod's share of the target's rate."""
        p, rng, m = self.profile, self.rng, self.metrics
        mean = p.rate / max(pods, 1) * dt_s
        running = p.rate / max(pods, 1) * (p.ttft_s + p.output * p.tpot_s)  # Little's law
        for _ in range(_poisson(rng, mean)):
            prompt = max(1, round(rng.expovariate(1.0 / p.prompt)))
            output = max(1, round(rng.expovariate(1.0 / p.output)))
            tpot = rng.lognormvariate(0.0, 0.2) * p.tpot_s * (1.0 + running / BATCH_SLOWDOWN)
            ttft = rng.lognormvariate(0.0, 0.3) * p.ttft_s
            _finish(m, prompt, output, tpot, ttft, p.hit_ratio)
            # steps: GAPS inter-token gaps per request, each step decodes `running`
            self.steps_owed += GAPS / max(running, 1.0)
            while self.steps_owed >= 1.0:
                m.iteration_tokens.observe(max(1, round(running)))
                self.steps_owed -= 1.0
        m.running.set(running)
        m.waiting.set(0)
        m.kv_usage.set(min(running * (p.prompt + p.output) / 480_000.0, 1.0))


def _finish(
    m: VllmMetrics, prompt: int, output: int, tpot: float, ttft: float, hits: float
) -> None:
    """The observations vLLM makes for one finished request (per step ones summed)."""
    m.prompt_tokens.inc(prompt)
    m.generation_tokens.inc(output)
    m.prefix_cache_queries.inc(prompt)
    m.prefix_cache_hits.inc(round(prompt * hits))
    m.ttft.observe(ttft)
    m.tpot.observe(tpot)
    for _ in range(GAPS):  # a sample of the gaps (all of them would cost too much)
        m.itl.observe(tpot)
    m.e2e.observe(ttft + tpot * (output - 1))
    m.req_prompt.observe(prompt)
    m.req_gen.observe(output)
    m.req_max_tokens.observe(output)
    m.count_finished("length")


def _poisson(rng: random.Random, mean: float) -> int:
    """Knuth's count of exponential gaps within ``mean`` (small means only)."""
    count, total = 0, rng.expovariate(1.0)
    while total < mean:
        count += 1
        total += rng.expovariate(1.0)
    return count


class LiveEngines:
    """The exporter: pods from ``list_pods``, one registry each, served over HTTP, and
    the scrape targets handed to ``set_targets`` (``PrometheusServer.set_targets``)."""

    def __init__(
        self,
        list_pods: Callable[[], Iterable[Mapping[str, Any]]],
        set_targets: Callable[[list[tuple[str, dict[str, str]]]], None],
        tick_s: float = 5.0,
    ) -> None:
        self.list_pods = list_pods
        self.set_targets = set_targets
        self.tick_s = tick_s
        self.pods: dict[PodKey, PodEngine] = {}
        self.broken_scrapes = 0  # answers Prometheus stopped reading: it timed out
        self._stop = threading.Event()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._threads = [
            threading.Thread(target=self._server.serve_forever, daemon=True),
            threading.Thread(target=self._run, daemon=True),
        ]

    @property
    def address(self) -> str:
        host, port = self._server.server_address[:2]
        return f"{host!s}:{port}"

    def start(self) -> LiveEngines:
        self.refresh()
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._threads[0].is_alive():  # shutdown() waits for serve_forever to return
            self._server.shutdown()
        self._server.server_close()

    def refresh(self) -> None:
        """Follow the pods: new ones get a registry, gone ones lose theirs, each serves its
        target's rate split over the target's pods, and the scrape targets are rewritten
        when the set changed."""
        seen: dict[PodKey, str] = {}
        for pod in self.list_pods():
            meta = pod["metadata"]
            target = (meta.get("labels") or {}).get(TARGET_LABEL)
            if target:
                seen[(meta["namespace"], meta["name"])] = target
        if seen.keys() == self.pods.keys():
            return
        self.pods = {
            key: self.pods.get(key) or PodEngine(target, zlib.crc32("/".join(key).encode()))
            for key, target in seen.items()
        }
        per_target = Counter((ns, target) for (ns, _), target in seen.items())
        for (ns, _), eng in self.pods.items():
            eng.pods = per_target[(ns, eng.target)]
        self.set_targets([self._target(key, eng.target) for key, eng in self.pods.items()])

    def _target(self, key: PodKey, target: str) -> tuple[str, dict[str, str]]:
        ns, pod = key
        labels = {"__metrics_path__": f"/metrics/{ns}/{pod}", "namespace": ns, "pod": pod}
        return self.address, labels | {"servingtarget": target}

    def _run(self) -> None:
        while not self._stop.wait(self.tick_s):
            self.refresh()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        live = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                parts = self.path.strip("/").split("/")
                eng = live.pods.get((parts[1], parts[2])) if len(parts) == 3 else None
                if eng is None:
                    self.send_error(404)
                    return
                body = eng.scrape()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                try:
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    live.broken_scrapes += 1  # Prometheus gave up waiting (its timeout)

            def log_message(self, *args: Any) -> None:
                pass

        return Handler
