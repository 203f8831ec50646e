"""How long an engine pod takes to start and to drain, from the plan and the workload.

A pod that goes away (scale-down, batch-cap rollout, drain, edit) must finish the
requests it holds; a pod that comes up must be given time to fetch and load its
checkpoint before anything calls it stuck. Both follow from numbers the planner has:

- **Drain.** A request lasts TTFT + OSL · TPOT. The fleet is kept within the SLO, so
  the SLO's bounds are what a request can take; at the workload's p99 output length

      d_99 = TTFT_slo + OSL_99 · TPOT_slo                                   [s]

  vLLM's ``--shutdown-timeout`` (seconds it keeps serving in-flight requests after
  SIGTERM, refusing new ones; its default, 0, aborts them) is ``DRAIN_MARGIN · d_99``,
  between ``MIN_SHUTDOWN_S`` and ``MAX_SHUTDOWN_S``. Before SIGTERM the ``preStop`` hook
  waits at least ``PRESTOP_S``, so the endpoint controllers and every proxy drop the
  pod, and then until no kept-alive connection could still bring a request (each
  response tells its client to reconnect: rooftop_operator/engine_drain.py), at most
  ``PRESTOP_S`` plus the shutdown timeout, since a connection is busy for at most one
  request. So no new request reaches an engine that would refuse it. The grace period
  covers the longest hook and then the drain:

      grace = (PRESTOP_S + shutdown) + shutdown + GRACE_MARGIN_S             [s]
- **Start.** One pod is ready after it downloads the checkpoint (unless a persistent
  cache or model volume already holds it), reads it into GPU memory and warms up
  (compilation, CUDA graphs, KV profiling):

      t_start = [B / DOWNLOAD_BYTES_PER_S] + B / LOAD_BYTES_PER_S + ENGINE_INIT_S   [s]

  with B the checkpoint's bytes on disk (16-bit for online fp8). The feedback loop
  projects demand ``t_start`` ahead; the Deployment's progress deadline and the startup
  probe allow ``DEADLINE_FACTOR`` times that plus an image pull, so a slow but healthy
  load never reads as failed.

The rates are assumptions, not measurements of the user's cluster: stated here and in
docs/operating.md, and overridden cluster-wide by ``loop.startupSeconds``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

from rooftop_api.spec import Mode, ServingTargetSpec
from rooftop_planner.catalog import ModelSpec
from rooftop_planner.perf import weight_bytes
from rooftop_planner.plan import Plan
from rooftop_planner.weights import ONLINE_FP8, VLLM_DTYPE, Weights
from rooftop_planner.workload import from_spec

# Quantile of the output length a drain must cover, and the margin above it.
DRAIN_QUANTILE: Final = 0.99
DRAIN_MARGIN: Final = 1.5
# vLLM's own docs use 30 s as a drain example; an hour bounds a pod stuck draining.
MIN_SHUTDOWN_S: Final = 30
MAX_SHUTDOWN_S: Final = 3600
# Endpoint removal reaches kube-proxy in about a second; cloud load balancers and
# gateways that watch EndpointSlices take longer. 10 s covers them.
PRESTOP_S: Final = 10
# After the drain: the engine's workers exit and the container stops.
GRACE_MARGIN_S: Final = 15
# Assumed rates (bytes/s): a node pulling from the Hugging Face Hub, and safetensors
# read from local disk into GPU memory. ENGINE_INIT_S: vLLM's torch.compile, CUDA-graph
# capture and KV-cache profiling on a cold pod.
DOWNLOAD_BYTES_PER_S: Final = 200e6
LOAD_BYTES_PER_S: Final = 1e9
ENGINE_INIT_S: Final = 90.0
# The vLLM image (about 10 GB) is pulled once per node; only deadlines count it.
IMAGE_PULL_S: Final = 10e9 / DOWNLOAD_BYTES_PER_S
DEADLINE_FACTOR: Final = 2.0
MIN_PROGRESS_DEADLINE_S: Final = 600  # Kubernetes' own default
# Writable scratch besides the weights: logs, compile caches, tokenizer files.
SCRATCH_BYTES: Final = 4 * 2**30
# The simulated engine starts in about a second and downloads nothing.
SIMULATED_STARTUP_S: Final = 5.0


@dataclass(frozen=True)
class Lifecycle:
    """How one engine pod of a plan starts and stops.

    Attributes:
        checkpoint_bytes: the checkpoint's size on disk, bytes (0 when simulated).
        downloads: True when every new pod downloads the checkpoint (no persistent
            cache, no model volume).
        startup_s: expected time from pod start to Ready, s.
        progress_deadline_s: the Deployment's ``progressDeadlineSeconds``.
        request_p99_s: the p99 request duration the drain covers, s.
        shutdown_timeout_s: vLLM's ``--shutdown-timeout``, s.
        prestop_s: the least the ``preStop`` hook waits (endpoint removal), s.
        grace_s: ``terminationGracePeriodSeconds``.
        ephemeral_bytes: the pod's ``ephemeral-storage`` request, bytes.
    """

    checkpoint_bytes: float
    downloads: bool
    startup_s: float
    progress_deadline_s: int
    request_p99_s: float
    shutdown_timeout_s: int
    prestop_s: int
    grace_s: int
    ephemeral_bytes: int

    @property
    def prestop_max_s(self) -> int:
        """The most the ``preStop`` hook waits for kept-alive connections to close, s:
        a connection is busy for at most one request beyond the least wait."""
        return self.prestop_s + self.shutdown_timeout_s


def checkpoint_bytes(model: ModelSpec, weight_dtype: str, weights: Weights | None) -> float:
    """Bytes the engine reads from disk: online fp8 loads the 16-bit checkpoint."""
    online = weights is not None and weights.quantization == ONLINE_FP8
    if online or weight_dtype in VLLM_DTYPE:
        return weight_bytes(model, "bf16")
    return weight_bytes(model, weight_dtype)


def request_p99_s(spec: ServingTargetSpec, plan: Plan) -> float:
    """TTFT + OSL_99 · TPOT at the SLO's bounds (the plan's prediction where the SLO
    names no TTFT), s; the output length is capped by the context the engine allows."""
    osl = from_spec(spec.workload.output_tokens).quantile(DRAIN_QUANTILE)
    if plan.max_model_len:
        osl = min(osl, plan.max_model_len)
    ttft_ms = spec.slo.ttft_ms if spec.slo.ttft_ms is not None else plan.ttft_ms
    return (ttft_ms + osl * max(spec.slo.tpot_ms, plan.tpot_ms)) / 1000.0


def shutdown_timeout_s(request_s: float) -> int:
    """``DRAIN_MARGIN`` times the p99 request, within the bounds, whole seconds."""
    return min(MAX_SHUTDOWN_S, max(MIN_SHUTDOWN_S, math.ceil(DRAIN_MARGIN * request_s)))


def downloads(spec: ServingTargetSpec) -> bool:
    """Whether each new pod downloads the weights: true unless a PersistentVolumeClaim
    caches them or a model volume serves them (a simulated engine loads nothing)."""
    if spec.mode is Mode.SIMULATED or spec.engine.model_volume is not None:
        return False
    cache = spec.engine.model_cache
    return cache is None or not cache.pvc_name


def startup_s(size_bytes: float, download: bool) -> float:
    """Expected seconds from pod start to Ready (module docstring)."""
    fetch = size_bytes / DOWNLOAD_BYTES_PER_S if download else 0.0
    return fetch + size_bytes / LOAD_BYTES_PER_S + ENGINE_INIT_S


def lifecycle(
    spec: ServingTargetSpec, plan: Plan, model: ModelSpec, weights: Weights | None
) -> Lifecycle:
    """The start-up and drain figures of one engine pod of ``plan``."""
    request_s = request_p99_s(spec, plan)
    drain = shutdown_timeout_s(request_s)
    grace = PRESTOP_S + drain + drain + GRACE_MARGIN_S  # the longest preStop, then the drain
    if spec.mode is Mode.SIMULATED:
        return Lifecycle(
            checkpoint_bytes=0.0,
            downloads=False,
            startup_s=SIMULATED_STARTUP_S,
            progress_deadline_s=MIN_PROGRESS_DEADLINE_S,
            request_p99_s=request_s,
            shutdown_timeout_s=drain,
            prestop_s=PRESTOP_S,
            grace_s=grace,
            ephemeral_bytes=SCRATCH_BYTES,
        )
    size = checkpoint_bytes(model, plan.weight_dtype, weights)
    download = downloads(spec)
    start = startup_s(size, download)
    deadline = math.ceil(DEADLINE_FACTOR * (start + IMAGE_PULL_S))
    on_disk = size if download else 0.0
    return Lifecycle(
        checkpoint_bytes=size,
        downloads=download,
        startup_s=start,
        progress_deadline_s=max(MIN_PROGRESS_DEADLINE_S, deadline),
        request_p99_s=request_s,
        shutdown_timeout_s=drain,
        prestop_s=PRESTOP_S,
        grace_s=grace,
        ephemeral_bytes=math.ceil(on_disk * 1.1) + SCRATCH_BYTES,
    )
