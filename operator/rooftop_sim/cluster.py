"""A discrete-event cluster: pods running ``engine_sim.core`` engines, in simulated time.

Events, in time order (ties: engine steps, then arrivals, then scrapes):

- arrival: the balancer sends the request to a ready pod (never a draining one) as
  ``ClusterConfig.routing`` says: the one with the fewest outstanding requests (running
  + waiting), as a least-outstanding-requests gateway does (the default); one at random,
  as a Kubernetes Service's kube-proxy picks an endpoint per connection (one connection
  per request); the pod its session went to first, as a Service with
  ``sessionAffinity: ClientIP`` does when each session is one client, re-pinned at random
  when that pod leaves; or the pod whose prefix cache holds the longest prefix of its
  prompt, ties to the fewest outstanding, where that is more than half the prompt, else
  the fewest outstanding (a prefix-aware router, ``CACHE_THRESHOLD``). A trace that names its
  prompts' blocks (Mooncake) gives each request the engine's block hashes, so its pod's
  prefix cache finds what the pod served before;
- step end: the pod's engine starts its next iteration at once (an engine loop never
  sleeps while it has work). ``core.EngineCore.step`` advances request state immediately
  and stamps token times with the iteration's end, so there are no per-token events:
  the cost of a simulated hour is one Python call per engine iteration plus the
  engine's own per-request work;
- pod ready: ``startup_s`` after creation (image pull, weight load, CUDA graphs);
- a mixed fleet: ``ClusterConfig.fixed_pools`` are pods of other GPU types, ready from
  the start and never scaled; the balancer spreads over them and the policy's pods alike;
- scrape: every ``scrape_s``, metrics of the last ``window_s`` become an
  ``Observation``; the policy answers with (replicas, batch cap); the cluster
  reconciles like a Deployment (pending pods are deleted first when scaling in, ready
  ones drain: no new requests, deleted when empty; a new batch cap rolls out with 25 %
  surge, an old pod draining whenever a new one is ready).

Cost: every pod is billed from creation until deletion (start-up and draining included),
clipped to the trace's horizon.
"""

from __future__ import annotations

import heapq
import math
import random
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import numpy.typing as npt

from rooftop_control import defaults
from rooftop_control.readings import Observation
from rooftop_planner.drafters import Drafter
from rooftop_planner.plan import Plan
from rooftop_planner.pricing import PodsPrice, ReplicaPrice
from rooftop_sim.engine.core import EngineConfig, EngineCore, Request, Speculation
from rooftop_sim.engine.server import speculation_from
from rooftop_sim.engine.truth import TruthModel
from rooftop_sim.policies import RooftopPolicy
from rooftop_sim.traces import PrefixBlocks
from rooftop_sim.window import Gauges, MetricsWindow

# The batches a schedule without ranges drafts its one length at: any the loop may cap.
MAX_SCHEDULE_BATCH = 1 << 16

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

_STEP, _READY = 0, 1
_PENDING, _SERVING, _DRAINING, _GONE = "pending", "ready", "draining", "gone"

# How the balancer picks a pod for a request (see the module docstring)
ROUTINGS = ("least-outstanding", "random", "session", "prefix-aware")
BLOCK_SIZE = 16  # tokens per KV block: vLLM's default on GPUs


@dataclass(frozen=True)
class RequestStream:
    """Requests to replay: arrival times (s from 0, sorted) and token counts; optionally
    each prompt's blocks and each request's session key, from the trace (None: the
    prompts share nothing, and every request is a session of its own)."""

    arrival_s: FloatArray
    prompt_tokens: IntArray
    output_tokens: IntArray
    name: str = "trace"
    prefix: PrefixBlocks | None = None
    session: IntArray | None = None

    @property
    def horizon_s(self) -> float:
        """End of the trace, s (the last arrival)."""
        return float(self.arrival_s[-1]) if len(self.arrival_s) else 0.0


@dataclass(frozen=True)
class Replica:
    """One replica's deployment (what the plan chose), for the truth model and engine."""

    model: str
    gpu: str
    tp: int
    weight_dtype: str
    kv_dtype: str
    usd_per_replica_hour: float
    gpu_memory_utilization: float = 0.9
    max_model_len: int = 8192
    max_num_batched_tokens: int = 8192
    enable_prefix_caching: bool = True  # vLLM V1's default
    # vLLM's --speculative-config ("": none) and the acceptance the drafts truly meet
    speculative_config: str = ""
    acceptance: float = 0.7
    drafter: Drafter | None = None  # spec.engine.drafter, where the catalog lists none

    @classmethod
    def of(
        cls, model: str, plan: Plan, acceptance: float | None = None, drafter: Drafter | None = None
    ) -> Replica:
        """What one pod of ``plan`` runs, billed at the plan's cost per replica; its
        drafts (if it speculates) accepted at ``acceptance`` (None: engine-sim's
        default)."""
        return cls(
            model=model,
            gpu=plan.gpu,
            tp=plan.tp,
            weight_dtype=plan.weight_dtype,
            kv_dtype=plan.kv_dtype,
            usd_per_replica_hour=plan.usd_per_replica_hour,
            gpu_memory_utilization=plan.gpu_memory_utilization,
            max_model_len=plan.max_model_len,
            max_num_batched_tokens=plan.max_num_batched_tokens,
            speculative_config=plan.speculative_config,
            acceptance=cls.acceptance if acceptance is None else acceptance,
            drafter=drafter,
        )

    def running(self, plan: Plan) -> Replica:
        """This replica's model and drafts' truth running ``plan``'s engine."""
        return Replica.of(self.model, plan, self.acceptance, self.drafter)


@dataclass(frozen=True)
class FixedPool:
    """Pods of another GPU type beside the policy's, at a fixed count: a mixed fleet's
    other pool (``fleet.MixedFleet``), ready at time 0, billed at its replica's price."""

    replica: Replica
    pods: int
    cap: int
    # what its pods cost together (owned GPUs first); None: each at its replica's price
    price: ReplicaPrice | None = None


@dataclass(frozen=True)
class ClusterConfig:
    """How the cluster behaves; times in seconds.

    Attributes:
        replica: what each pod runs.
        reality_factor: truth step times x this (the planner does not know it).
        noise: lognormal sigma of per-iteration step-time noise.
        seed: base seed (pod i uses seed + i).
        startup_s: pod creation to ready.
        scrape_s: scrape and decision interval.
        window_s: range of rate/quantile queries.
        tpot_quantile / ttft_quantile: the SLO percentiles, 0..1.
        tpot_slo_ms: the TPOT bound, ms (metrics report the share within it).
        outages: [start, end) intervals during which every metric is missing.
        surge: rolling-update surge, fraction of replicas (Deployment maxSurge).
        max_pods: never more billed pods (starting, serving, draining) than this
            (the budget's limit); a rollout then replaces pods one at a time.
        routing: how a request finds its pod, one of ``ROUTINGS`` (module docstring).
        fixed_pools: pods of other GPU types beside the policy's (a mixed fleet).
        spill: a mixed fleet scaled as one (the operator's loop on it): the policy's pod
            count split into its own pool's and each fixed pool's, in order
            (``fleet.FleetPrice.split``); None: the fixed pools keep their size.
        price: what the policy's pods cost together at each moment (owned GPUs first,
            ``pricing.ReplicaPrice``); None: each at ``replica.usd_per_replica_hour``.
    """

    replica: Replica
    reality_factor: float = 1.0
    noise: float = 0.05
    seed: int = 0
    startup_s: float = defaults.STARTUP_S
    scrape_s: float = defaults.TICK_S
    window_s: float = defaults.METRICS_WINDOW_S
    tpot_quantile: float = 0.9
    ttft_quantile: float = 0.9
    tpot_slo_ms: float = math.inf
    outages: tuple[tuple[float, float], ...] = ()
    surge: float = defaults.ROLLOUT_SURGE
    max_pods: int | None = None
    routing: str = "least-outstanding"
    fixed_pools: tuple[FixedPool, ...] = ()
    price: ReplicaPrice | None = None
    spill: Callable[[int], Sequence[int]] | None = None

    def __post_init__(self) -> None:
        if self.routing not in ROUTINGS:
            raise ValueError(f"routing {self.routing!r}: choose from {', '.join(ROUTINGS)}")


class Policy(Protocol):
    """A scaling policy: initial size, then one answer per scrape."""

    name: str

    def start(self) -> tuple[int, int]:
        """(replicas, batch cap) at time 0; those pods are ready at once."""
        ...

    def decide(self, now_s: float, obs: Observation) -> tuple[int, int]:
        """(replicas, batch cap) wanted after a scrape at ``now_s``."""
        ...


@dataclass
class Pod:
    """One engine pod and its lifecycle."""

    index: int
    engine: EngineCore
    cap: int
    created_s: float
    state: str = _PENDING
    gone_s: float | None = None
    busy: bool = False
    prefilling: list[Request] = field(default_factory=list)
    pool: FixedPool | None = None  # a mixed fleet's fixed pool; None: the policy's
    template: int = 0  # the policy's pod template it was started from (``Cluster.templates``)


@dataclass(frozen=True)
class Tick:
    """The timeline at one scrape."""

    t_s: float
    rate: float  # arrivals/s over the window
    tpot_ms: float  # observed SLO percentile (NaN when none)
    ttft_ms: float
    replicas: int  # desired
    alive: int  # pods created and not deleted (billed)
    ready: int
    cap: int
    running: float
    waiting: float


@dataclass
class SimResult:
    """Per-request outcomes and the timeline of one run. Times in s, NaN = never."""

    policy: str
    workload: RequestStream
    first_token_s: FloatArray
    finished_s: FloatArray
    tpot_s: FloatArray
    rejected: int
    pod_seconds: float
    usd_per_pod_hour: float
    gpus_per_pod: int
    timeline: list[Tick]
    wall_s: float = 0.0
    notes: list[str] = field(default_factory=list)
    # why requests were refused -> how many (``rejected`` is their sum)
    rejected_by_reason: dict[str, int] = field(default_factory=dict)
    # prompt tokens looked up in the pods' prefix caches, and found there (vLLM's counts)
    prefix_queries: int = 0
    prefix_hits: int = 0
    # a mixed fleet's fixed pools: their pod-seconds, GPU-hours and USD over the horizon
    fixed_pod_seconds: float = 0.0
    fixed_gpu_hours: float = 0.0
    fixed_usd: float = 0.0
    # the policy's pods' USD where they are priced together (``ClusterConfig.price``), and
    # their GPU-hours where they ran several engines (the loop re-planned them)
    policy_usd: float | None = None
    policy_gpu_hours: float | None = None


class Cluster:
    """The simulated target. ``run(policy)`` replays the workload once."""

    def __init__(
        self, workload: RequestStream, config: ClusterConfig, startup_s: float | None = None
    ):
        self.w = workload
        self.cfg = config
        self.startup_s = config.startup_s if startup_s is None else startup_s
        n = len(workload.arrival_s)
        self.first = np.full(n, math.nan)
        self.fin = np.full(n, math.nan)
        self.tpot = np.full(n, math.nan)
        self.routed = np.full(n, -1, dtype=np.int64)  # the pod each request went to
        self.rejected = 0
        self.rejections: Counter[str] = Counter()
        self.pods: list[Pod] = []
        self.serving: list[Pod] = []  # the balancer's targets, refreshed on changes
        self.heap: list[tuple[float, int, int, int]] = []
        self.seq = 0
        self.desired = 0
        self.cap = 1
        self.window = MetricsWindow(
            config.window_s, config.tpot_quantile, config.ttft_quantile, config.tpot_slo_ms
        )
        # What the policy's pods ran and what they cost, the newest last: a loop that
        # changes the pods' drafts or plan (``policies.Reshape``) adds one.
        self.templates: list[tuple[Replica, PodsPrice | None]] = [(config.replica, config.price)]
        self.max_pods = config.max_pods
        self.kv_tokens = _kv_tokens(config.replica)
        self.rng = random.Random(config.seed)  # the balancer's picks
        self.pins: dict[int, Pod] = {}  # session key -> its pod

    # ---- pods -------------------------------------------------------------------
    def _new_pod(self, now: float, ready: bool, pool: FixedPool | None = None) -> Pod:
        r, i = (self.replica if pool is None else pool.replica), len(self.pods)
        template = len(self.templates) - 1 if pool is None else 0
        truth = TruthModel.for_deployment(
            r.model,
            r.gpu,
            r.tp,
            r.weight_dtype,
            r.kv_dtype,
            self.cfg.reality_factor,
            self.cfg.noise,
            self.cfg.seed + i,
        )
        speculation = _speculating(truth, r, self.cfg.seed + i)
        ecfg = EngineConfig(
            self.kv_tokens if pool is None else _kv_tokens(r),
            self.cap if pool is None else pool.cap,
            r.max_num_batched_tokens,
            r.max_model_len,
            BLOCK_SIZE,
            r.enable_prefix_caching,
            speculation,
        )
        engine = EngineCore(ecfg, truth)
        pod = Pod(i, engine, ecfg.max_num_seqs, now, pool=pool, template=template)
        self.pods.append(pod)
        if ready or self.startup_s <= 0:
            pod.state = _SERVING
        else:
            self._push(now + self.startup_s, _READY, i)
        return pod

    def _push(self, t: float, kind: int, pod: int) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, kind, pod))

    def _remove(self, pod: Pod, now: float) -> None:
        if pod.state == _PENDING or not (pod.busy or pod.engine.has_work()):
            pod.state, pod.gone_s = _GONE, now
        else:
            pod.state = _DRAINING

    def reconcile(self, now: float) -> None:
        """Move the pods toward ``desired`` pods of batch cap ``cap`` (Deployment-like)."""
        alive = [p for p in self.pods if p.state in (_PENDING, _SERVING) and p.pool is None]
        new = [p for p in alive if self._current(p)]
        old = [p for p in alive if not self._current(p)]
        # scale in: pending pods first (nothing to drain), newest first
        excess = len(new) - self.desired
        for pod in sorted(new, key=lambda p: (p.state != _PENDING, -p.created_s))[: max(excess, 0)]:
            self._remove(pod, now)
            new.remove(pod)
        # rolling update: an old pod goes when a ready new one can take its place
        ready_new = sum(p.state == _SERVING for p in new)
        for pod in sorted(old, key=lambda p: (p.state != _PENDING, _load(p))):
            if pod.state == _PENDING or ready_new + len(old) > self.desired:
                self._remove(pod, now)
                old.remove(pod)
        surge = max(1, math.ceil(self.cfg.surge * self.desired)) if old else 0
        room = self._room()
        if (
            old
            and room <= 0
            and ready_new + len(old) >= self.desired
            and not any(p.state == _PENDING for p in new)
        ):
            # no budget to surge: maxUnavailable 1, an old pod goes before a new one
            victim = min(old, key=_load)
            self._remove(victim, now)
            old.remove(victim)
            room = self._room()
        while len(new) < self.desired and len(new) + len(old) < self.desired + surge:
            if room <= 0:
                break
            new.append(self._new_pod(now, ready=False))
            room -= 1
        self.serving = [p for p in self.pods if p.state == _SERVING]

    @property
    def replica(self) -> Replica:
        """What the policy's new pods run."""
        return self.templates[-1][0]

    def _current(self, pod: Pod) -> bool:
        """Whether ``pod`` runs the policy's pod template: its batch cap and engine."""
        return pod.cap == self.cap and pod.template == len(self.templates) - 1

    def _reshape(self, policy: Policy) -> None:
        """Take what the policy's pods run from now on, where its loop changed it: the
        pods started from then on run it, at its price; the others roll over."""
        if not isinstance(policy, RooftopPolicy) or policy.reshape is None:
            return
        reshape = policy.reshape
        replica = self.replica.running(reshape.plan)
        if (replica, reshape.price) == self.templates[-1]:
            return
        self.templates.append((replica, reshape.price))
        self.kv_tokens = _kv_tokens(replica)
        self.max_pods = reshape.max_pods

    def _split(self, wanted: int) -> list[int]:
        """The policy's pods, then each fixed pool's: ``spill``'s split of ``wanted``, or
        ``wanted`` beside the pools at their fixed size."""
        if self.cfg.spill is None:
            return [wanted, *(pool.pods for pool in self.cfg.fixed_pools)]
        return list(self.cfg.spill(wanted))

    def _scale_pool(self, pool: FixedPool, size: int, now: float) -> None:
        """Move a mixed fleet's pool to ``size`` pods: new ones start, or the pending
        ones go first and then the newest (draining their requests)."""
        alive = [p for p in self.pods if p.pool is pool and p.state in (_PENDING, _SERVING)]
        for _ in range(size - len(alive)):
            self._new_pod(now, ready=False, pool=pool)
        going = sorted(alive, key=lambda p: (p.state != _PENDING, -p.created_s))
        for pod in going[: max(len(alive) - size, 0)]:
            self._remove(pod, now)

    def _room(self) -> int:
        """Pods that may still be created under ``max_pods``."""
        if self.max_pods is None:
            return 1 << 30
        billed = sum(p.state != _GONE and p.pool is None for p in self.pods)
        return self.max_pods - billed

    # ---- the event loop -----------------------------------------------------------
    def run(self, policy: Policy, progress: Callable[[float], None] | None = None) -> SimResult:
        """Replay the workload under ``policy``; returns outcomes and the timeline.
        ``progress``: called with the simulated time at each scrape."""
        started = time.perf_counter()
        wanted, self.cap = policy.start()
        self.desired, *sizes = self._split(wanted)
        for _ in range(self.desired):
            self._new_pod(0.0, ready=True)
        for pool, size in zip(self.cfg.fixed_pools, sizes, strict=True):
            for _ in range(size):
                self._new_pod(0.0, ready=True, pool=pool)
        self.serving = list(self.pods)
        timeline = self._loop(policy, progress)
        horizon = self.w.horizon_s

        def billed_s(pod: Pod) -> float:
            end = pod.gone_s if pod.gone_s is not None else horizon
            return max(min(end, horizon) - pod.created_s, 0.0)

        pod_s = sum(billed_s(p) for p in self.pods if p.pool is None)
        policy_usd, policy_gpu_hours = self._policy_bill(billed_s)
        fixed = [(billed_s(p), p.pool) for p in self.pods if p.pool is not None]
        fixed_usd = 0.0
        for pool in self.cfg.fixed_pools:
            if pool.price is None:  # each pod at its replica's price
                fixed_usd += (
                    sum(s for s, q in fixed if q is pool)
                    * pool.replica.usd_per_replica_hour
                    / 3600.0
                )
            else:
                mine = [
                    (p.created_s, p.created_s + billed_s(p)) for p in self.pods if p.pool is pool
                ]
                fixed_usd += _billed(mine, pool.price)
        r = self.cfg.replica
        return SimResult(
            policy=policy.name,
            workload=self.w,
            first_token_s=self.first,
            finished_s=self.fin,
            tpot_s=self.tpot,
            rejected=self.rejected,
            pod_seconds=pod_s,
            usd_per_pod_hour=r.usd_per_replica_hour,
            gpus_per_pod=r.tp,
            timeline=timeline,
            wall_s=time.perf_counter() - started,
            rejected_by_reason=dict(self.rejections),
            prefix_queries=sum(p.engine.counters.prefix_queries for p in self.pods),
            prefix_hits=sum(p.engine.counters.prefix_hits for p in self.pods),
            fixed_pod_seconds=sum(seconds for seconds, _ in fixed),
            fixed_gpu_hours=sum(sec * pool.replica.tp for sec, pool in fixed) / 3600.0,
            fixed_usd=fixed_usd,
            policy_usd=policy_usd,
            policy_gpu_hours=policy_gpu_hours,
        )

    def _policy_bill(self, billed_s: Callable[[Pod], float]) -> tuple[float | None, float | None]:
        """(USD, GPU-hours) of the policy's pods, each template's priced together (owned
        GPUs first); (None, None) where one template at each pod's price is the bill
        (``SimResult.usd_per_pod_hour``, ``gpus_per_pod``)."""
        if len(self.templates) == 1 and self.cfg.price is None:
            return None, None
        usd = gpu_hours = 0.0
        for index, (replica, price) in enumerate(self.templates):
            mine = [p for p in self.pods if p.pool is None and p.template == index]
            spans = [(p.created_s, p.created_s + billed_s(p)) for p in mine]
            usd += _billed(spans, price or ReplicaPrice.flat(replica.usd_per_replica_hour))
            gpu_hours += sum(billed_s(p) for p in mine) * replica.tp / 3600.0
        return usd, (gpu_hours if len(self.templates) > 1 else None)

    def _reject(self, reason: str) -> None:
        self.rejected += 1
        self.rejections[reason] += 1

    def _too_long(self, req: Request, pod: Pod) -> str:
        """Why ``pod``'s engine refused a request: vLLM answers 400 to one longer than
        its --max-model-len, and cannot serve one longer than its whole KV cache."""
        replica = self.templates[pod.template][0] if pod.pool is None else pod.pool.replica
        limit = replica.max_model_len
        if req.prompt_tokens + req.max_tokens > limit:
            return f"prompt + output longer than max-model-len {limit} (spec.engine.maxModelLen)"
        return "longer than the engine's whole KV cache"

    def _loop(self, policy: Policy, progress: Callable[[float], None] | None) -> list[Tick]:
        arr = self.w.arrival_s.tolist()
        n, i = len(arr), 0
        horizon, scrape = self.w.horizon_s, self.cfg.scrape_s
        next_tick = scrape
        timeline: list[Tick] = []
        heap = self.heap
        while True:
            t_heap = heap[0][0] if heap else math.inf
            t_arr = arr[i] if i < n else math.inf
            t_tick = next_tick if next_tick <= horizon else math.inf
            if t_heap <= t_arr and t_heap <= t_tick:
                if t_heap == math.inf:
                    break
                t, _, kind, idx = heapq.heappop(heap)
                if kind == _STEP:
                    self._step(self.pods[idx], t)
                else:
                    self._ready(self.pods[idx], t)
            elif t_arr <= t_tick:
                self._arrive(i, t_arr)
                i += 1
            else:
                timeline.append(self._tick(policy, t_tick, arr))
                next_tick += scrape
                if progress is not None:
                    progress(t_tick)
        return timeline

    def _arrive(self, i: int, now: float) -> None:
        prompt = int(self.w.prompt_tokens[i])
        hashes = () if self.w.prefix is None else self.w.prefix.engine_hashes(i, prompt, BLOCK_SIZE)
        req = Request(str(i), prompt, int(self.w.output_tokens[i]), now, block_hashes=hashes)
        best = self._route(i, req)
        if best is None:
            self._reject("no engine pod was ready (the Service answers 503)")
            return
        try:
            best.engine.add_request(req)
        except ValueError:
            self._reject(self._too_long(req, best))
            return
        self.routed[i] = best.index
        if not best.busy:
            self._step(best, now)

    def _route(self, i: int, req: Request) -> Pod | None:
        """The ready pod request ``i`` goes to (None when none is ready)."""
        pods = self.serving
        if not pods:
            return None
        routing = self.cfg.routing
        if routing == "random":
            return self.rng.choice(pods)
        if routing == "session":
            return self._session_pod(i, pods)
        if routing == "prefix-aware" and (pod := _best_prefix(pods, req)) is not None:
            return pod
        best, best_load = pods[0], 1 << 60
        for pod in pods:  # least outstanding, inlined: one call per request
            eng = pod.engine
            load = len(eng.running) + len(eng.waiting)
            if load < best_load:
                best, best_load = pod, load
        return best

    def _session_pod(self, i: int, pods: list[Pod]) -> Pod:
        """The pod request ``i``'s session is pinned to while it serves; a new session,
        or one whose pod left, is pinned to a ready pod at random (kube-proxy's
        ClientIP affinity). Without session keys every request is a session of its own."""
        if self.w.session is None:
            return self.rng.choice(pods)
        key = int(self.w.session[i])
        pod = self.pins.get(key)
        if pod is None or pod.state != _SERVING:
            pod = self.pins[key] = self.rng.choice(pods)
        return pod

    def _step(self, pod: Pod, now: float) -> None:
        """Start the pod's next iteration at ``now`` (or idle / delete it)."""
        res = pod.engine.step(now)
        if res is None:
            pod.busy = False
            if pod.state == _DRAINING:
                pod.state, pod.gone_s = _GONE, now
            return
        pod.busy = True
        self._push(res.end_s, _STEP, pod.index)
        drafts = (res.drafts, res.draft_tokens, res.accepted)
        self.window.add_step(res.duration_s, res.decode_tokens, res.end_s, drafts)
        if res.admitted or pod.prefilling:
            self._first_tokens(pod, res.admitted)
        for req in res.finished:
            self._finished(req)

    def _first_tokens(self, pod: Pod, admitted: Sequence[Request]) -> None:
        still = []
        for req in (*pod.prefilling, *admitted):
            if req.first_token_s is None:
                still.append(req)
            elif math.isnan(self.first[int(req.request_id)]):
                self.first[int(req.request_id)] = req.first_token_s
                self.window.ttft.append((req.first_token_s, req.first_token_s - req.arrival_s))
        pod.prefilling = still

    def _finished(self, req: Request) -> None:
        j = int(req.request_id)
        self.fin[j] = req.finished_s
        tpot = req.tpot_s
        self.tpot[j] = math.nan if tpot is None else tpot
        if math.isnan(self.first[j]) and req.first_token_s is not None:
            self.first[j] = req.first_token_s
            self.window.ttft.append((req.first_token_s, req.first_token_s - req.arrival_s))
        assert req.finished_s is not None
        cached = req.cached_tokens  # None: never looked up (the cache is off)
        self.window.add_finished(
            req.finished_s,
            self.tpot[j],
            req.prompt_tokens,
            req.out,
            0 if cached is None else req.prompt_tokens,
            cached or 0,
        )

    def _ready(self, pod: Pod, now: float) -> None:
        if pod.state == _PENDING:
            pod.state = _SERVING
            self.reconcile(now)

    def _tick(self, policy: Policy, now: float, arr: list[float]) -> Tick:
        lo = np.searchsorted(self.w.arrival_s, now - self.cfg.window_s, side="right")
        hi = np.searchsorted(self.w.arrival_s, now, side="right")
        gauges = self._gauges()
        outage = any(a <= now < b for a, b in self.cfg.outages)
        # rate() over a range reaching back before the first sample uses what exists
        span = min(self.cfg.window_s, now)
        obs = self.window.observe(now, (hi - lo) / span, gauges, outage)
        wanted, self.cap = policy.decide(now, obs)
        self._reshape(policy)
        self.desired, *sizes = self._split(wanted)
        for pool, size in zip(self.cfg.fixed_pools, sizes, strict=True):
            self._scale_pool(pool, size, now)
        self.reconcile(now)
        alive = sum(p.state in (_PENDING, _SERVING) for p in self.pods)
        return Tick(
            t_s=now,
            rate=(hi - lo) / span,
            tpot_ms=obs.tpot_ms.value,
            ttft_ms=obs.ttft_ms.value,
            replicas=wanted,
            alive=alive,
            ready=gauges.ready,
            cap=self.cap,
            running=gauges.running,
            waiting=gauges.waiting,
        )

    def _gauges(self) -> Gauges:
        ready = [p.engine for p in self.pods if p.state == _SERVING]
        pending = sum(p.state == _PENDING for p in self.pods)
        # a rollout's pods: the policy's own (a mixed fleet's other pools keep their caps)
        outdated = sum(
            p.state in (_PENDING, _SERVING) and p.pool is None and not self._current(p)
            for p in self.pods
        )
        if not ready:
            return Gauges(
                running=0.0,
                waiting=0.0,
                kv_usage_ratio=0.0,
                ready=0,
                pending=pending,
                outdated=outdated,
            )
        kv = sum(e.kv_usage for e in ready) / len(ready)
        running = float(sum(e.num_running for e in ready))
        waiting = float(sum(e.num_waiting for e in ready))
        return Gauges(
            running=running,
            waiting=waiting,
            kv_usage_ratio=kv,
            ready=len(ready),
            pending=pending,
            outdated=outdated,
        )


# A prefix-aware router follows the cache only where it holds more than this share of
# the prompt (SGLang's router: --cache-threshold 0.5), and balances load otherwise: a
# prefix every prompt shares (a system prompt) would send every request to one pod.
CACHE_THRESHOLD = 0.5


def _best_prefix(pods: list[Pod], req: Request) -> Pod | None:
    """The pod caching the longest prefix of ``req``'s prompt, ties to the fewest
    outstanding; None when no pod holds more than ``CACHE_THRESHOLD`` of it."""
    hashes, n = req.block_hashes, len(req.block_hashes)
    if not n:
        return None
    pod = max(pods, key=lambda p: (p.engine.cache.longest_hit(hashes, n)[0], -_load(p)))
    found = pod.engine.cache.longest_hit(hashes, n)[0] * pod.engine.config.block_size
    return pod if found > CACHE_THRESHOLD * req.prompt_tokens else None


def _load(pod: Pod) -> int:
    return pod.engine.num_running + pod.engine.num_waiting


def _billed(spans: Sequence[tuple[float, float]], price: PodsPrice) -> float:
    """USD of pods alive over ``spans`` ([created, gone) s), priced together: while n pods
    are alive the fleet costs ``price.usd_per_hour(n)``, so owned GPUs go to whichever
    pods run, and only the pods beyond them pay on demand. ∫ price(n(t)) dt / 3600."""
    events = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    usd, alive, last = 0.0, 0, 0.0
    for t, step in events:
        usd += price.usd_per_hour(alive) * (t - last) / 3600.0
        alive, last = alive + step, t
    return usd


def _kv_tokens(r: Replica) -> int:
    truth = TruthModel.for_deployment(r.model, r.gpu, r.tp, r.weight_dtype, r.kv_dtype)
    _speculating(truth, r, 0)
    return truth.kv_capacity_tokens(r.gpu_memory_utilization)


def _speculating(truth: TruthModel, r: Replica, seed: int) -> Speculation | None:
    """The pod's speculation from its replica's --speculative-config (its drafter added
    to ``truth``), drawing acceptances around the replica's true one; None without."""
    if not r.speculative_config:
        return None
    speculation, drafter = speculation_from(
        r.speculative_config,
        r.acceptance,
        seed,
        MAX_SCHEDULE_BATCH,
        truth.dep.model,
        r.drafter,
        truth.dep.weight_dtype,
    )
    if drafter is not None:
        truth.with_drafter(*drafter)
    elif speculation.lookup:
        truth.with_lookup(speculation.lookup)
    return speculation
