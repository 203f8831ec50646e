"""Pure functions from (target, plan) to the Kubernetes objects that serve it.

Nothing here talks to the API server: each builder returns a plain dict ready for
server-side apply, so unit tests compare dicts and the handlers stay a few lines.
Children of ServingTarget ``NAME``: Deployment ``NAME-engine`` (a mixed fleet: one
Deployment ``NAME-engine-GPU`` per pool, its pods labelled ``rooftop.dev/pool=GPU``, all
behind the one Service), PodDisruptionBudget
``NAME-engine``, Service ``NAME`` (the endpoint clients use), ConfigMap ``NAME-engine``
(the drain middleware vLLM pods load: ``engine_drain``) and, where the Prometheus
Operator is installed, PodMonitor ``NAME-engine``. All carry an ownerReference to the
target, so Kubernetes' garbage collector deletes them with it and the operator needs no
finalizer.

The vLLM command line is ``vllm serve MODEL`` with flags of the vLLM release the chart
pins (``settings.VLLM_VERSION``); the contract tests parse and validate every plan shape
with that vLLM's own parser and config classes. ``ENGINE_FLAGS`` lists the flags the
builder itself emits.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.resources
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from rooftop_api.spec import (
    MODELS_MOUNT,
    POOL_LABEL,
    TARGET_LABEL,
    Mode,
    ServingTargetSpec,
    given_speculative_config,
    suffix_schedule_problem,
)
from rooftop_control import defaults
from rooftop_control.control import max_billed_replicas
from rooftop_operator import engine_security
from rooftop_operator.engine_security import PodSecurity
from rooftop_operator.errors import OperatorError
from rooftop_operator.specs import TargetRef
from rooftop_planner.catalog import simulated_model_problem
from rooftop_planner.drafters import planned_acceptance
from rooftop_planner.errors import PlannerError
from rooftop_planner.inventory import gpu_toleration
from rooftop_planner.lifecycle import Lifecycle
from rooftop_planner.plan import VLLM_FLAGS, Plan
from rooftop_planner.pricing import ReplicaPrice
from rooftop_planner.weights import ONLINE_FP8, VLLM_DTYPE, Weights, vllm_kv_cache_dtype

ENGINE_PORT: Final = 8000
PORT_NAME: Final = "http"
APP_NAME: Final = "rooftop-engine"
MANAGED_BY: Final = "rooftop"
CACHE_PATH: Final = engine_security.MODEL_CACHE_PATH
HEALTH_PATH: Final = "/health"
METRICS_PATH: Final = "/metrics"
# How often each engine PodMonitor has Prometheus scrape a pod: the loop's window (one
# minute by default) holds four samples, enough for rate() and deriv(), and the
# increase between two scrapes is the 15-s count burstiness is read from
# (``rooftop_planner.bursts.BURST_INTERVAL_S``; a unit test holds the two equal).
SCRAPE_INTERVAL: Final = "15s"
# Share of replicas a rollout may start on top of the fleet (Kubernetes' own default
# maxSurge), shared with the simulated cluster.
ROLLOUT_SURGE: Final = defaults.ROLLOUT_SURGE

# The engine container's command for mode "vllm"; the model is its first argument
# (``vllm serve MODEL``: vLLM deprecates ``--model`` there).
VLLM_COMMAND: Final = ("vllm", "serve")
# Flags the builder emits for mode "vllm".
ENGINE_FLAGS: Final = frozenset(
    {
        "--served-model-name",
        "--tensor-parallel-size",
        "--max-num-seqs",
        "--max-model-len",
        "--gpu-memory-utilization",
        "--max-num-batched-tokens",
        "--dtype",
        "--quantization",
        "--kv-cache-dtype",
        "--port",
        "--enable-chunked-prefill",
        "--shutdown-timeout",
        "--middleware",
        "--speculative-config",
    }
)
# Per GPU in the pod: CPU and host memory for tokenization, weight loading and the
# API server. Conservative floors, not tuned per model.
CPU_PER_GPU: Final = 2
MEMORY_GI_PER_GPU: Final = 16
# The drain middleware (engine_drain.py), as vLLM pods see it: a ConfigMap key mounted
# read-only on the engine's PYTHONPATH, loaded with vLLM's own --middleware flag and
# run by the preStop hook with the image's python3 (vllm/vllm-openai ships one).
DRAIN_MODULE: Final = "rooftop_drain"
DRAIN_MOUNT: Final = "/opt/rooftop"
DRAIN_VOLUME: Final = "rooftop-drain"
DRAIN_MIDDLEWARE: Final = f"{DRAIN_MODULE}.DrainMiddleware"
DRAIN_ANNOTATION: Final = "rooftop.dev/drain-module"


class UnsupportedPlan(OperatorError, ValueError):
    """The plan needs something the engine cannot do (e.g. an int8 KV cache in vLLM)."""


@dataclass(frozen=True)
class EngineInputs:
    """Everything the engine builders need, resolved by the caller.

    Attributes:
        served_model: what the engine loads (Hugging Face repo id for vLLM).
        node_label: (key, value) node label that selects the planned GPU type.
        gpu_resource: the extended resource one GPU is requested as.
        image: the container image (already resolved with ``children.resolve_engine_image``).
        pod_monitor: True when a PodMonitor scrapes the pods; False adds the
            ``prometheus.io/*`` annotations instead.
        pod_security: the Pod Security level the pods must pass (``engine_security``).
        pod_monitor_labels: extra labels on the PodMonitor, e.g. the ``release`` label
            a kube-prometheus-stack Prometheus selects PodMonitors by.
        weights: the checkpoint the plan's weight dtype loads (``weights.resolve_weights``);
            None derives it from ``served_model`` where that is possible (16-bit, fp8).
        lifecycle: how a pod starts and drains (``rooftop_planner.lifecycle``).
        host_arch: the GPU hosts' CPU architecture (``kubernetes.io/arch``).
        price: what its replicas cost (``pricing.replica_price``); None: each the
            plan's cost over its replicas.
        inventory_replicas: the most replicas of the plan's shape the cluster's free
            GPUs hold (with ``gpuInventory: nodes``); None: not counted.
        pool: a mixed fleet's pool (its GPU id): its Deployment's name and pod label;
            "" for a plan of one GPU type.
        pools: a mixed fleet's pools, one Deployment each (the inputs' own plan then
            only names the Service, PodDisruptionBudget and PodMonitor of them all).
        others: (pods, USD/h) of the fleet's other pools, which a pool's rollout surge
            leaves room for under maxReplicas and the budget.
    """

    ref: TargetRef
    spec: ServingTargetSpec
    plan: Plan
    served_model: str
    node_label: tuple[str, str]
    image: str
    lifecycle: Lifecycle
    gpu_resource: str = "nvidia.com/gpu"
    pod_monitor: bool = False
    pod_security: PodSecurity = PodSecurity.BASELINE
    pod_monitor_labels: Mapping[str, str] = field(default_factory=dict)
    weights: Weights | None = None
    host_arch: str = "amd64"
    price: ReplicaPrice | None = None
    inventory_replicas: int | None = None
    pool: str = ""
    pools: tuple[EngineInputs, ...] = ()
    others: tuple[int, float] = (0, 0.0)


APPLIED_ANNOTATION: Final = "rooftop.dev/applied"


def with_applied_hash(obj: Mapping[str, Any]) -> dict[str, Any]:
    """``obj`` with a digest of itself in the ``rooftop.dev/applied`` annotation.

    Why: the operator skips applying a child whose fields already hold its values
    (``reconcile.is_subset``), but a field it STOPPED setting (a nodeSelector entry
    removed from the spec, the scrape annotations once a PodMonitor exists) still sits
    there, and a subset check cannot see that. The digest changes whenever the desired
    object does, removals included, so such a change is applied, and server-side apply
    then drops the fields this manager no longer sets.
    """
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"))
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    meta = dict(obj.get("metadata") or {})
    meta["annotations"] = {**(meta.get("annotations") or {}), APPLIED_ANNOTATION: digest}
    return {**obj, "metadata": meta}


def deployment_name(name: str, pool: str = "") -> str:
    """``NAME-engine``, or a mixed fleet's pool Deployment ``NAME-engine-GPU``."""
    return f"{name}-engine-{pool}" if pool else f"{name}-engine"


def engine_deployment_names(name: str, pools: tuple[str, ...] = ()) -> list[str]:
    """The engine Deployments of a plan: ``NAME-engine``, or one per pool."""
    return [deployment_name(name, p) for p in pools] if pools else [deployment_name(name)]


def service_name(name: str) -> str:
    return name


def selector_labels(name: str) -> dict[str, str]:
    """The immutable Deployment selector; also what the Service and PodMonitor match."""
    return {"app.kubernetes.io/name": APP_NAME, TARGET_LABEL: name}


def labels(name: str) -> dict[str, str]:
    return {
        **selector_labels(name),
        "app.kubernetes.io/instance": name,
        "app.kubernetes.io/component": "engine",
        "app.kubernetes.io/managed-by": MANAGED_BY,
    }


def _metadata(ref: TargetRef, name: str) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": ref.namespace,
        "labels": labels(ref.name),
        "ownerReferences": [ref.owner_reference()],
    }


def _with_pool(metadata: dict[str, Any], inp: EngineInputs) -> dict[str, Any]:
    return {**metadata, "labels": {**metadata["labels"], **_pool_labels(inp)}}


def image_for_mode(spec: ServingTargetSpec, vllm_image: str, self_image: str) -> str:
    """spec.engine.image wins; otherwise the given vLLM image or, simulated, our own
    (``children.resolve_engine_image`` picks the vLLM image for the GPU)."""
    if spec.engine.image:
        return spec.engine.image
    return self_image if spec.mode is Mode.SIMULATED else vllm_image


def vllm_weights(inp: EngineInputs) -> Weights:
    """The checkpoint ``vllm serve`` loads, from the inputs alone: the resolved one
    (``inp.weights``, from ``children.resolve_plan_weights``), else the served model for
    the dtypes that need none (16-bit as is, fp8 quantized online).

    Raises:
        UnsupportedPlan: int8/int4/fp4 without a checkpoint in that format (vLLM cannot
            quantize to them at load; pointing it at 16-bit weights crash-loops).
    """
    if inp.weights is not None:
        return inp.weights
    dtype = inp.plan.weight_dtype
    if dtype in VLLM_DTYPE:
        return Weights(inp.served_model, dtype, None, "")
    if dtype == "fp8":
        return Weights(inp.served_model, dtype, ONLINE_FP8, "")
    raise UnsupportedPlan(
        f"weight dtype {dtype} needs a checkpoint in that format and none is named; "
        f"add one under spec.engine.checkpoints.{dtype}"
    )


def served_names(inp: EngineInputs) -> list[str]:
    """Names clients may call the model by: ``spec.model`` first (it labels vLLM's
    metrics), then the catalog's repo id where that differs."""
    names = [inp.spec.model]
    if inp.served_model != inp.spec.model and not inp.served_model.startswith("/"):
        names.append(inp.served_model)
    return names


def vllm_args(inp: EngineInputs) -> list[str]:
    """Arguments of ``vllm serve`` for a plan: the model, then the planned flags.

    ``--dtype`` pins 16-bit weights to the planned type (vLLM's ``auto`` would take
    the checkpoint's, e.g. fp16 for Llama-2); a quantized checkpoint keeps its own.
    """
    plan, spec = inp.plan, inp.spec
    try:
        kv_cache_dtype = vllm_kv_cache_dtype(plan.weight_dtype, plan.kv_dtype)
    except PlannerError as err:
        raise UnsupportedPlan(str(err)) from err
    weights = vllm_weights(inp)
    args = [weights.model, "--served-model-name", *served_names(inp)]
    # The plan fields vLLM takes as they are. Among them the prefill chunk
    # (--max-num-batched-tokens), which the plan times prompts in: vLLM's own default
    # depends on the GPU (2,048 on A100s and on cards under 70 GiB, 16,384 from 160 GiB),
    # so the engine is told the planner's.
    for name, flag in VLLM_FLAGS.items():
        if value := getattr(plan, name):
            args += [flag, f"{value:g}" if isinstance(value, float) else str(value)]
    # Said, not assumed: without chunked prefill vLLM refuses any context above that
    # budget (its scheduler config check), and the plan's prefill timing assumes chunks.
    args += ["--enable-chunked-prefill"]
    if plan.weight_dtype in VLLM_DTYPE:
        args += ["--dtype", VLLM_DTYPE[plan.weight_dtype]]
    if weights.quantization:
        args += ["--quantization", weights.quantization]
    args += ["--kv-cache-dtype", kv_cache_dtype, "--port", str(ENGINE_PORT)]
    # On SIGTERM vLLM stops taking requests and finishes those it holds for this long;
    # its default, 0, aborts every in-flight stream on each scale-down and rollout.
    args += ["--shutdown-timeout", str(inp.lifecycle.shutdown_timeout_s)]
    # A ClusterIP keeps kept-alive connections on a pod that is draining, where vLLM
    # aborts new requests: this middleware tells clients to reconnect first.
    args += ["--middleware", DRAIN_MIDDLEWARE]
    extra = list(spec.engine.extra_args or [])
    given = given_speculative_config(extra)
    if given is not None and (problem := suffix_schedule_problem(given)) is not None:
        raise UnsupportedPlan(problem)
    return args + extra


def sim_command(inp: EngineInputs) -> list[str]:
    """``rooftop engine-sim`` with the plan's engine shape: the simulator answers like
    vLLM would with that GPU, TP, dtypes and batch limit, without a GPU."""
    plan, spec = inp.plan, inp.spec
    if (problem := simulated_model_problem(spec.model)) is not None:
        raise UnsupportedPlan(problem)
    command = [
        "rooftop",
        "engine-sim",
        "--host",
        "0.0.0.0",  # reachable through the Service, not just loopback
        "--port",
        str(ENGINE_PORT),
        "--model-name",
        spec.model,
        "--model",
        spec.model,
        "--gpu",
        plan.gpu,
        "--tp",
        str(plan.tp),
        "--max-num-seqs",
        str(plan.max_num_seqs),
        "--weight-dtype",
        plan.weight_dtype,
        "--kv-dtype",
        plan.kv_dtype,
        "--gpu-memory-utilization",
        f"{plan.gpu_memory_utilization:g}",
        "--max-num-batched-tokens",
        str(plan.max_num_batched_tokens),
        "--shutdown-timeout",
        str(inp.lifecycle.shutdown_timeout_s),
    ]
    if plan.max_model_len:
        command += ["--max-model-len", str(plan.max_model_len)]
    if plan.speculative_config:
        command += ["--speculative-config", plan.speculative_config]
        method = json.loads(plan.speculative_config)["method"]
        if (acceptance := planned_acceptance(spec, method)) is not None:
            command += ["--acceptance-rate", f"{acceptance:g}"]
        command += _named_drafter(inp)
    return command


def _named_drafter(inp: EngineInputs) -> list[str]:
    """engine-sim's flags for the shape of ``spec.engine.drafter``, where the plan
    drafts with it (the drafter catalog lists the others)."""
    named = inp.spec.engine.drafter
    if named is None or json.loads(inp.plan.speculative_config).get("model") != named.model:
        return []
    if named.catalog_model:
        return ["--draft-catalog-model", named.catalog_model]
    return [
        "--draft-layers",
        str(named.layers),
        "--draft-vocab-size",
        str(named.draft_vocab_size or 0),
    ]


def _probe(period_s: int, failures: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": HEALTH_PATH, "port": PORT_NAME},
        "periodSeconds": period_s,
        "failureThreshold": failures,
        "timeoutSeconds": 5,
    }


STARTUP_PROBE_PERIOD_S: Final = 10


def _probes(lifecycle: Lifecycle) -> dict[str, Any]:
    """The startup probe allows as long as the Deployment's progress deadline: a large
    checkpoint downloads and loads for a long time, and liveness must not kill it
    meanwhile. Readiness gates Service traffic."""
    failures = math.ceil(lifecycle.progress_deadline_s / STARTUP_PROBE_PERIOD_S)
    return {
        "startupProbe": _probe(STARTUP_PROBE_PERIOD_S, failures),
        "readinessProbe": _probe(5, 3),
        "livenessProbe": _probe(10, 6),
    }


def _resources(inp: EngineInputs) -> dict[str, Any]:
    """GPUs as requests = limits (extended resources must be equal). The node's disk is
    requested for what the pod writes: the checkpoint when each pod downloads it, plus
    scratch, so the scheduler does not place a 140 GB download on a node without room
    and the kubelet does not evict it half-way. A simulated engine asks for CPU and
    memory only: it runs on any node (the README's try-it path on a cluster without
    GPUs)."""
    storage = str(inp.lifecycle.ephemeral_bytes)
    if inp.spec.mode is Mode.SIMULATED:
        sim = {"cpu": "100m", "memory": "256Mi", "ephemeral-storage": storage}
        return {"requests": sim, "limits": {"memory": "512Mi"}}
    tp = inp.plan.tp
    requests: dict[str, Any] = {inp.gpu_resource: str(tp)}
    requests |= {"cpu": str(CPU_PER_GPU * tp), "memory": f"{MEMORY_GI_PER_GPU * tp}Gi"}
    requests |= {"ephemeral-storage": storage}
    return {"requests": requests, "limits": {inp.gpu_resource: str(tp)}}


def _env(inp: EngineInputs) -> list[dict[str, Any]]:
    """The operator's engine variables (``engine_security.vllm_env``), then the
    target's ``spec.engine.env``, then HF_TOKEN and VLLM_API_KEY from their Secrets. A
    later entry of the same name replaces an earlier one: what the user wrote wins over
    our defaults, and
    the list holds each name once, as server-side apply requires (env is a map keyed
    by name there; a duplicate fails the whole apply)."""
    spec = inp.spec
    env: list[dict[str, Any]] = []
    if spec.mode is not Mode.SIMULATED:
        env += engine_security.vllm_env(inp.pod_security)
    env += [{"name": e.name, "value": e.value} for e in spec.engine.env or []]
    if spec.mode is not Mode.SIMULATED:
        env.append(_drain_pythonpath(spec))
    secrets = (
        ("HF_TOKEN", spec.engine.hf_token_secret_ref),
        ("VLLM_API_KEY", spec.engine.api_key_secret_ref),
    )
    for name, ref in secrets:
        if ref is not None:
            secret = {"secretKeyRef": {"name": ref.name, "key": ref.key}}
            env.append({"name": name, "valueFrom": secret})
    return list({e["name"]: e for e in env}.values())


def _drain_pythonpath(spec: ServingTargetSpec) -> dict[str, str]:
    """PYTHONPATH with the drain module's directory first, then the target's own."""
    own = next((e.value for e in spec.engine.env or [] if e.name == "PYTHONPATH"), "")
    return {"name": "PYTHONPATH", "value": ":".join(p for p in (DRAIN_MOUNT, own) if p)}


@functools.cache  # read once: every deploy renders it twice (ConfigMap, pod digest)
def drain_source() -> str:
    """The drain middleware's source, shipped to vLLM pods in their ConfigMap."""
    return importlib.resources.files("rooftop_operator").joinpath("engine_drain.py").read_text()


def build_config_map(ref: TargetRef) -> dict[str, Any]:
    """ConfigMap ``NAME-engine``: ``rooftop_drain.py`` for the vLLM pods (``engine_drain``)."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(ref, deployment_name(ref.name)),
        "data": {f"{DRAIN_MODULE}.py": drain_source()},
    }


def _drain_volume(ref: TargetRef) -> tuple[dict[str, Any], dict[str, Any]]:
    config_map = {"name": deployment_name(ref.name), "defaultMode": 0o444}
    volume = {"name": DRAIN_VOLUME, "configMap": config_map}
    return volume, {"name": DRAIN_VOLUME, "mountPath": DRAIN_MOUNT, "readOnly": True}


def _volumes(inp: EngineInputs) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(volumes, mounts): the model cache, and /dev/shm in RAM for every vLLM engine:
    tensor-parallel workers exchange tensors through shared memory (NCCL), vLLM's
    engine core and API server pass messages through it even at TP 1 (its CPU build
    refuses to start with "Insufficient space in /dev/shm", 160 MiB needed), and the
    container runtime's default is 64 MiB."""
    cache = inp.spec.engine.model_cache
    if cache is not None and cache.pvc_name:
        source: dict[str, Any] = {"persistentVolumeClaim": {"claimName": cache.pvc_name}}
    elif cache is not None and cache.size_gi:
        source = {"emptyDir": {"sizeLimit": f"{cache.size_gi}Gi"}}
    else:
        source = {"emptyDir": {}}
    volumes = [{"name": "model-cache", **source}]
    mounts: list[dict[str, Any]] = [{"name": "model-cache", "mountPath": CACHE_PATH}]
    model_volume = inp.spec.engine.model_volume
    if model_volume is not None:  # the model's files, never written by the engine
        claim: dict[str, Any] = {"claimName": model_volume.claim_name, "readOnly": True}
        volumes.append({"name": "model-files", "persistentVolumeClaim": claim})
        mounts.append({"name": "model-files", "mountPath": MODELS_MOUNT, "readOnly": True})
    if inp.spec.mode is not Mode.SIMULATED:
        volumes.append({"name": "dshm", "emptyDir": {"medium": "Memory"}})
        mounts.append({"name": "dshm", "mountPath": "/dev/shm"})
        drain_volume, drain_mount = _drain_volume(inp.ref)
        volumes.append(drain_volume)
        mounts.append(drain_mount)
    if inp.spec.mode is not Mode.SIMULATED:  # the simulator writes nothing
        extra_volumes, extra_mounts = engine_security.writable_volumes(inp.pod_security)
        volumes += extra_volumes
        mounts += extra_mounts
    return volumes, mounts


def _pre_stop(inp: EngineInputs) -> dict[str, Any]:
    """vLLM: wait until endpoints drop the pod and kept-alive clients have moved on
    (``engine_drain``). The simulator keeps answering on kept-alive connections while
    it drains and closes each after its response (aiohttp's shutdown), so its preStop
    only waits for the endpoints."""
    life = inp.lifecycle
    if inp.spec.mode is Mode.SIMULATED:
        return {"sleep": {"seconds": life.prestop_s}}
    script = f"{DRAIN_MOUNT}/{DRAIN_MODULE}.py"
    command = [
        "python3",
        script,
        "--port",
        str(ENGINE_PORT),
        "--min-s",
        str(life.prestop_s),
        "--max-s",
        str(life.prestop_max_s),
    ]
    return {"exec": {"command": command}}


def _container(inp: EngineInputs, mounts: list[dict[str, Any]]) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "engine", "image": inp.image}
    if inp.spec.mode is Mode.SIMULATED:
        container["command"] = sim_command(inp)
    else:
        container["command"] = list(VLLM_COMMAND)
        container["args"] = vllm_args(inp)
    env = _env(inp)
    if env:
        container["env"] = env
    return {
        **container,
        "ports": [{"name": PORT_NAME, "containerPort": ENGINE_PORT, "protocol": "TCP"}],
        "resources": _resources(inp),
        "volumeMounts": mounts,
        "securityContext": engine_security.container_security_context(inp.pod_security),
        "lifecycle": {"preStop": _pre_stop(inp)},
        **_probes(inp.lifecycle),
    }


def _tolerations(inp: EngineInputs) -> list[dict[str, Any]]:
    """The GPU taint's toleration (shared with the inventory, which must count the
    nodes these pods may land on), plus whatever the target asks for. A simulated
    engine needs no GPU node, so it tolerates only what the target asks for."""
    simulated = inp.spec.mode is Mode.SIMULATED
    own: list[dict[str, Any]] = [] if simulated else [gpu_toleration(inp.gpu_resource)]
    extra = [
        t.model_dump(by_alias=True, exclude_none=True)
        for t in inp.spec.constraints.tolerations or []
    ]
    return own + [t for t in extra if t not in own]


def _node_selector(inp: EngineInputs) -> dict[str, str]:
    """The planned GPU's label wins over a user selector on the same key: the plan's
    memory and speed math only holds on that GPU. A simulated engine runs on any node
    the target's own selector allows."""
    own = dict(inp.spec.constraints.node_selector or {})
    if inp.spec.mode is Mode.SIMULATED:
        return own
    key, value = inp.node_label
    if inp.host_arch != "amd64":  # an image that also runs on amd64 must not land there
        own["kubernetes.io/arch"] = inp.host_arch
    return {**own, key: value}


def _pod_annotations(inp: EngineInputs) -> dict[str, str]:
    if inp.pod_monitor:
        return {}
    return {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(ENGINE_PORT),
        "prometheus.io/path": METRICS_PATH,
    }


def _pool_labels(inp: EngineInputs) -> dict[str, str]:
    """A mixed fleet's pool label: part of its Deployment's selector, so two pools'
    Deployments never claim each other's pods."""
    return {POOL_LABEL: inp.pool} if inp.pool else {}


def pod_template(inp: EngineInputs) -> dict[str, Any]:
    volumes, mounts = _volumes(inp)
    metadata: dict[str, Any] = {"labels": {**labels(inp.ref.name), **_pool_labels(inp)}}
    annotations = _pod_annotations(inp)
    if inp.spec.mode is not Mode.SIMULATED:
        # a running engine imported the middleware when it started: pods roll when the
        # operator ships a different one, as when any other part of the template changes
        digest = hashlib.sha256(drain_source().encode()).hexdigest()[:16]
        annotations[DRAIN_ANNOTATION] = digest
    if annotations:
        metadata["annotations"] = annotations
    spec: dict[str, Any] = {
        "containers": [_container(inp, mounts)],
        "volumes": volumes,
        "nodeSelector": _node_selector(inp),
        "tolerations": _tolerations(inp),
        "securityContext": engine_security.pod_security_context(
            inp.pod_security, vllm=inp.spec.mode is not Mode.SIMULATED
        ),
        # preStop wait, then the engine's drain, then its exit: a shorter grace period
        # would SIGKILL requests the drain was finishing.
        "terminationGracePeriodSeconds": inp.lifecycle.grace_s,
        # Kubernetes injects <SERVICE>_PORT=tcp://... for every Service in the namespace;
        # vLLM reads VLLM_PORT as an integer and refuses to start when a Service named
        # `vllm` exists (the target's own Service, for a target named vllm).
        "enableServiceLinks": False,
        # The engine never calls the API server; a mounted token is only a liability.
        "automountServiceAccountToken": False,
    }
    pull_secrets = inp.spec.engine.image_pull_secrets
    if pull_secrets:  # an air-gapped cluster's mirror of the engine image
        spec["imagePullSecrets"] = [{"name": s.name} for s in pull_secrets]
    return {"metadata": metadata, "spec": spec}


def rollout_strategy(replicas: int, ceiling: int) -> dict[str, Any]:
    """How a rollout (a new batch cap restarts every pod) replaces the engine pods.

    New pods start before old ones go (``maxUnavailable`` 0), so the fleet never drops
    below the capacity the SLO was planned on; at most ``ROLLOUT_SURGE`` of the
    replicas (rounded up) at once. Surge pods are billed too, so never more pods than
    ``ceiling`` (``control.max_billed_replicas``: budget and maxReplicas; and the free
    GPUs, where counted: a surge pod with no GPU to take stays Pending, and the rollout
    waits for it forever): with no room under it, one pod at a time goes first
    (``maxSurge`` 0, ``maxUnavailable`` 1).
    Kubernetes' default (25 % / 25 %) would both take capacity away and spend above the
    budget.
    """
    surge = min(max(1, math.ceil(ROLLOUT_SURGE * replicas)), ceiling - replicas)
    if surge <= 0:
        return {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}
    return {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": surge, "maxUnavailable": 0}}


def build_deployment(inp: EngineInputs) -> dict[str, Any]:
    """The engine Deployment: ``plan.replicas`` pods of one engine each (a mixed fleet's
    pool: ``NAME-engine-GPU``, selecting its pool's pods only)."""
    replicas = inp.plan.replicas
    price = inp.price or ReplicaPrice.flat(inp.plan.usd_per_replica_hour)
    other_pods, other_usd = inp.others
    ceiling = max_billed_replicas(
        inp.spec.constraints.max_replicas - other_pods,
        inp.spec.budget.usd_per_hour - other_usd,
        price,
    )
    if inp.inventory_replicas is not None:  # a surge pod beyond the free GPUs would wait
        ceiling = min(ceiling, inp.inventory_replicas)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _with_pool(_metadata(inp.ref, deployment_name(inp.ref.name, inp.pool)), inp),
        "spec": {
            "replicas": replicas,
            # A checkpoint that downloads and loads for 20 minutes is progress, not a
            # failed rollout (Kubernetes' default deadline is 10 minutes).
            "progressDeadlineSeconds": inp.lifecycle.progress_deadline_s,
            "strategy": rollout_strategy(replicas, ceiling),
            "revisionHistoryLimit": 3,
            "selector": {"matchLabels": {**selector_labels(inp.ref.name), **_pool_labels(inp)}},
            "template": pod_template(inp),
        },
    }


# How long kube-proxy keeps a client IP on its pod after its last connection, s: longer
# than a chat's pause between turns, shorter than Kubernetes' default of three hours, so
# a replica added by the loop gets returning clients within the hour.
AFFINITY_TIMEOUT_S: Final = 3600


def build_service(ref: TargetRef, session_affinity: str = "") -> dict[str, Any]:
    """ClusterIP Service ``NAME``: the OpenAI-compatible endpoint on port 8000.

    ``session_affinity`` "ClientIP" (the plan's choice, where each session has its own
    client IP) keeps a client's connections on one pod, whose prefix cache holds its
    session's history; "" leaves it out, and server-side apply then removes any earlier.
    """
    spec: dict[str, Any] = {
        "type": "ClusterIP",
        "selector": selector_labels(ref.name),
        "ports": [
            {"name": PORT_NAME, "port": ENGINE_PORT, "targetPort": PORT_NAME, "protocol": "TCP"}
        ],
    }
    if session_affinity:
        spec["sessionAffinity"] = session_affinity
        spec["sessionAffinityConfig"] = {"clientIP": {"timeoutSeconds": AFFINITY_TIMEOUT_S}}
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(ref, service_name(ref.name)),
        "spec": spec,
    }


def build_pod_disruption_budget(ref: TargetRef) -> dict[str, Any]:
    """PodDisruptionBudget ``NAME-engine``: voluntary evictions (``kubectl drain``, node
    upgrades, cluster-autoscaler scale-down) take at most one engine pod at a time.

    Why ``maxUnavailable: 1`` and not a ``minAvailable``: it lets a drain proceed at
    any replica count (a single-replica target is not pinned to its node forever, which
    platform teams would have to override), yet a fleet sized for its SLO never loses
    more than one replica's capacity to maintenance at once. ``AlwaysAllow`` lets a
    drain evict pods that are not ready (still loading the model, crash-looping):
    they serve nothing, so keeping them only blocks the node.
    """
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _metadata(ref, deployment_name(ref.name)),
        "spec": {
            "maxUnavailable": 1,
            "selector": {"matchLabels": selector_labels(ref.name)},
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }


# prometheus_client (which vLLM uses) may serve "vllm_*" instead of "vllm:*" when a
# Prometheus 2.x scrape negotiates OpenMetrics (prometheus/client_python#1177); map the
# names back so queries and dashboards see vLLM's documented names either way.
VLLM_NAME_FIX: list[dict[str, Any]] = [
    {
        "sourceLabels": ["__name__"],
        "regex": "vllm_(.*)",
        "targetLabel": "__name__",
        "replacement": "vllm:$1",
        "action": "replace",
    }
]


def build_pod_monitor(
    ref: TargetRef, extra_labels: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """PodMonitor for the engine pods. The relabelings put ``namespace`` and
    ``servingtarget`` on every series, which the feedback loop and dashboards group by,
    and a mixed fleet's ``pool``.

    ``extra_labels`` go on the PodMonitor itself, for a Prometheus that selects
    PodMonitors by label (kube-prometheus-stack: ``release: <its release>``). Our own
    labels win a clash: ``kubectl get podmonitor -l rooftop.dev/servingtarget=NAME``
    and the managed-by label must keep finding what the operator made (the settings
    refuse such keys at startup; this is the builder's own guarantee).
    """
    relabel = [
        {"sourceLabels": ["__meta_kubernetes_namespace"], "targetLabel": "namespace"},
        {
            "sourceLabels": ["__meta_kubernetes_pod_label_rooftop_dev_servingtarget"],
            "targetLabel": "servingtarget",
        },
        # a mixed fleet's pool (GPU id), so a query can split by it; absent on one type
        {"sourceLabels": ["__meta_kubernetes_pod_label_rooftop_dev_pool"], "targetLabel": "pool"},
    ]
    metadata = _metadata(ref, deployment_name(ref.name))
    metadata["labels"] = {**(extra_labels or {}), **metadata["labels"]}
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": metadata,
        "spec": {
            "selector": {"matchLabels": selector_labels(ref.name)},
            "podMetricsEndpoints": [
                {
                    "port": PORT_NAME,
                    "path": METRICS_PATH,
                    "interval": SCRAPE_INTERVAL,
                    "relabelings": relabel,
                    "metricRelabelings": VLLM_NAME_FIX,
                }
            ],
        },
    }
