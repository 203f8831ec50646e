"""The operator's own configuration, and how it tunes kopf.

``OperatorConfig`` is built once from the command line (``rooftop operator ...``) and
environment, then handed to every handler through kopf's ``memo``; nothing reads the
environment after startup, so handlers stay testable with a hand-made config.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import math
import os
import re
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, cast

import kopf
from pydantic import ValidationError

from rooftop_api.manifest import format_validation_error
from rooftop_api.spec import GROUP, Pricing
from rooftop_control import defaults
from rooftop_control.control import ControllerConfig
from rooftop_control.durations import parse_duration_s
from rooftop_operator import builders
from rooftop_operator.engine_security import PodSecurity, parse_pod_security
from rooftop_operator.metrics_client import PrometheusAuth, check_window
from rooftop_planner.catalog import CatalogError, load_catalog
from rooftop_planner.pricing import check_pricing

# The vLLM release Rooftop deploys and its tests run (tests/engine/install-vllm.sh installs
# the same version's CPU build; a unit test keeps the two, the chart and the packaged
# flag table in step).
VLLM_VERSION: Final = "0.32.0"
# Engine image for mode "vllm" on CUDA GPUs. ROCm and TPU need vLLM's builds for them
# (rocmImage/tpuImage): none is pinned, because none is tested here.
VLLM_IMAGE: Final = f"vllm/vllm-openai:v{VLLM_VERSION}"
# Image for mode "simulated": the operator's own image (it ships `rooftop engine-sim`).
DEFAULT_SELF_IMAGE: Final = "ghcr.io/rooftop-dev/rooftop:0.1.0"
ANNOTATION_PREFIX: Final = GROUP
# Seconds kopf waits for its own write to come back on the watch (see ``configure``).
CONSISTENCY_TIMEOUT_S: Final = 60.0
# Threads kopf runs the reconciles in. A reconcile spends most of its time waiting on the
# API server (a read and an apply per child, a status write), so under a burst of new
# targets the number in flight, not the operator's CPU, sets the pace; Python's default
# for the pool is the CPU count + 4 (6 on 2 cores). The API client keeps as many
# connections (``kube.CONNECTIONS``).
RECONCILE_THREADS: Final = 16
# How long a peered replica's keep-alive counts (kopf's default is 60 s). A standby takes
# over when the active replica's record expires, so this bounds the failover after a hard
# kill; kopf renews the record 5-10 s before it expires, hence at least 10 s.
PEERING_LIFETIME_S: Final = 20
MIN_PEERING_LIFETIME_S: Final = 10


@dataclass(frozen=True)
class LoopSettings:
    """The loop's knobs (``ROOFTOP_LOOP_*`` and ``ROOFTOP_PROMETHEUS_*``: ``SETTINGS``).

    Attributes:
        prometheus_url: Prometheus HTTP API base URL.
        interval_s: timer period (one decision per period), s.
        window: PromQL range of rate() / quantiles (>= 4 scrape intervals).
        stale_after_s: newest-sample age beyond which readings are stale, s.
        startup_s: one engine pod start-up for every target, s; None: each target's
            own (``rooftop_planner.lifecycle``: its checkpoint's size and cache).
        scale_down_window_s: how long a lower recommendation must hold, s (the
            controller's default, which the simulate benchmark measures).
        prometheus_auth: bearer token file, CA bundle and headers for Prometheus.
    """

    prometheus_url: str = "http://prometheus-operated.monitoring.svc:9090"
    interval_s: float = defaults.TICK_S
    window: str = defaults.METRICS_WINDOW
    stale_after_s: float = defaults.STALE_AFTER_S
    startup_s: float | None = None
    scale_down_window_s: float = ControllerConfig.scale_down_window_s
    prometheus_auth: PrometheusAuth = PrometheusAuth()

    @property
    def window_s(self) -> float:
        """``window`` in seconds, read as the PromQL range is ("1m30s" is 90 s)."""
        return parse_duration_s(self.window)


@dataclass(frozen=True)
class OperatorConfig:
    """What the operator was told at startup.

    Attributes:
        namespaces: namespaces to watch; empty with ``clusterwide`` means all.
        clusterwide: watch every namespace (needs the chart's cluster RBAC scope).
        peering: kopf peering object name; None runs standalone (one replica, no
            KopfPeering CRDs needed).
        peering_priority: this replica's kopf peering priority: the highest live one
            is active, the others stand by (``seniority_priority`` by default).
        peering_lifetime_s: how long this replica's peering keep-alive counts, s.
        vllm_image: engine image for ``mode: vllm`` on CUDA GPUs (a target's
            spec.engine.image wins).
        vllm_arm64_image: engine image for CUDA GPUs on arm64 hosts (GH200); empty: the
            ``vllm_image``, whose vllm/vllm-openai tags are multi-arch (x86_64 and
            aarch64) as vLLM publishes them.
        rocm_image / tpu_image: vLLM's image for ROCm GPUs / TPUs; empty: accelerators
            of that family are not planned (the plan says why).
        self_image: image for ``mode: simulated``; the chart passes the operator's own.
        liveness_endpoint: kopf's liveness URL, e.g. ``http://0.0.0.0:8080/healthz``.
        metrics_port: port of the operator's Prometheus endpoint; None disables it.
        server_timeout_s / client_timeout_s: watch-request timeouts (see ``configure``).
        fault_pause_after_apply_s: test hook: sleep this long after applying the
            Deployment and before the rest, so an e2e test can kill the operator
            mid-reconcile deterministically. Always 0 in production.
        gpu_inventory: plan only for GPU shapes the cluster's Nodes offer (reads Nodes:
            needs the chart's cluster RBAC). Off by default, because a cluster whose
            autoscaler adds GPU nodes on demand has none until a pod asks.
        nodes_retry_s: with ``gpu_inventory``, how often a target that only absent GPU
            nodes could serve is planned again, s.
        engine_pod_security: the Pod Security level engine pods are built to pass.
        pod_monitor_labels: extra labels on every engine PodMonitor (the label a
            Prometheus selects PodMonitors by).
        default_pricing: the cluster's prices and owned GPUs, for GPU types a target's
            own ``spec.pricing`` does not name (``pricing.with_default``); None: list
            prices.
        loop: the feedback loop's settings (Prometheus, period, windows).
    """

    namespaces: tuple[str, ...] = ()
    clusterwide: bool = False
    peering: str | None = None
    peering_priority: int = 0
    peering_lifetime_s: int = PEERING_LIFETIME_S
    vllm_image: str = VLLM_IMAGE
    vllm_arm64_image: str = ""
    rocm_image: str = ""
    tpu_image: str = ""
    self_image: str = DEFAULT_SELF_IMAGE
    liveness_endpoint: str | None = None
    metrics_port: int | None = None
    server_timeout_s: int = 300
    client_timeout_s: int = 330
    fault_pause_after_apply_s: float = 0.0
    gpu_inventory: bool = False
    nodes_retry_s: float = 60.0
    engine_pod_security: PodSecurity = PodSecurity.BASELINE
    pod_monitor_labels: Mapping[str, str] = field(default_factory=dict)
    default_pricing: Pricing | None = None
    loop: LoopSettings = field(default_factory=LoopSettings)

    def engine_images(self) -> dict[str, str]:
        """Accelerator family -> vLLM image, for the families that have one."""
        images = {"cuda": self.vllm_image, "rocm": self.rocm_image, "tpu": self.tpu_image}
        return {family: image for family, image in images.items() if image}


Parse = Callable[[str, str], object]  # (the variable or flag, its text) -> the value
INVENTORY_MODES: Final = {"nodes": True, "off": False}


@dataclass(frozen=True)
class Setting:
    """One operator setting, declared once.

    Attributes:
        field: where it lands in ``OperatorConfig``, dotted (``loop.window``,
            ``loop.prometheus_auth.headers``); its default is that field's default.
        env: the ``ROOFTOP_*`` variable that sets it (the chart passes it).
        parse: (name, text) -> value; a ValueError names the variable or flag and what
            it takes, at start-up.
        chart: the chart value that sets ``env`` (values.yaml, its schema and
            docs/operating.md name it); None for a test hook no chart value sets.
        flag: a command-line flag that overrides ``env``, if any.
        help: the flag's help.
        choices: the flag's words, when it takes one of a few.
    """

    field: str
    env: str
    parse: Parse
    chart: str | None
    flag: str | None = None
    help: str = ""
    choices: tuple[str, ...] = ()


def _text(name: str, text: str) -> str:
    return text


def seconds(name: str, text: str) -> float:
    """A duration in seconds, >= 0; a clear error naming ``name``."""
    return _seconds(name, text, positive=False)


def positive_seconds(name: str, text: str) -> float:
    """A duration in seconds, > 0; a clear error naming ``name``."""
    return _seconds(name, text, positive=True)


def _seconds(name: str, text: str, positive: bool) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and (value > 0 if positive else value >= 0)):
        bound = "> 0" if positive else ">= 0"
        raise ValueError(f"{name}={text!r}: give a number of seconds {bound}")
    return value


def _window(name: str, text: str) -> str:
    try:
        return check_window(text)
    except ValueError as err:
        raise ValueError(f"{name}: {err}") from None


def _headers(name: str, text: str) -> dict[str, str]:
    headers = _json_strings(text)
    if headers is None:
        raise ValueError(
            f'{name}={text!r}: give a JSON object of strings, e.g. {{"X-Scope-OrgID": "team-a"}}'
        )
    return headers


# Every setting the operator reads (tests/unit/operator/test_settings_declared.py holds the
# chart's template, values, schema and docs/operating.md to this table, and the code to
# reading no ROOFTOP_* variable outside it).
SETTINGS: Final = (
    Setting(
        field="self_image",
        env="ROOFTOP_SELF_IMAGE",
        parse=_text,
        chart="operator.simulatorImage",
        flag="--self-image",
        help="image for mode: simulated",
    ),
    Setting(
        field="vllm_image",
        env="ROOFTOP_VLLM_IMAGE",
        parse=_text,
        chart="operator.vllmImage",
        flag="--vllm-image",
        help="vLLM image for NVIDIA GPUs",
    ),
    Setting(
        field="vllm_arm64_image",
        env="ROOFTOP_VLLM_ARM64_IMAGE",
        parse=_text,
        chart="operator.vllmArm64Image",
        flag="--vllm-arm64-image",
        help="vLLM image for NVIDIA GPUs on arm64 hosts",
    ),
    Setting(
        field="rocm_image",
        env="ROOFTOP_VLLM_ROCM_IMAGE",
        parse=_text,
        chart="operator.rocmImage",
        flag="--rocm-image",
        help="vLLM image for AMD GPUs (empty: not planned)",
    ),
    Setting(
        field="tpu_image",
        env="ROOFTOP_VLLM_TPU_IMAGE",
        parse=_text,
        chart="operator.tpuImage",
        flag="--tpu-image",
        help="vLLM image for TPUs (empty: not planned)",
    ),
    Setting(
        field="gpu_inventory",
        env="ROOFTOP_GPU_INVENTORY",
        parse=lambda name, text: parse_inventory_mode(text),
        chart="operator.gpuInventory",
        flag="--gpu-inventory",
        help="nodes: plan only for GPU shapes the cluster's Nodes offer (default: off)",
        choices=tuple(sorted(INVENTORY_MODES)),
    ),
    Setting(
        field="nodes_retry_s",
        env="ROOFTOP_NODES_RETRY_S",
        parse=seconds,
        chart="operator.nodesRetrySeconds",
    ),
    Setting(
        field="engine_pod_security",
        env="ROOFTOP_ENGINE_POD_SECURITY",
        parse=lambda name, text: parse_pod_security(text),
        chart="engine.podSecurity",
    ),
    Setting(
        field="pod_monitor_labels",
        env="ROOFTOP_PODMONITOR_LABELS",
        parse=lambda name, text: parse_pod_monitor_labels(text),
        chart="engine.podMonitor.labels",
    ),
    Setting(
        field="default_pricing",
        env="ROOFTOP_DEFAULT_PRICING",
        parse=lambda name, text: parse_default_pricing(text),
        chart="operator.pricing",
    ),
    Setting(
        field="loop.prometheus_url",
        env="ROOFTOP_PROMETHEUS_URL",
        parse=_text,
        chart="loop.prometheusUrl",
    ),
    Setting(
        field="loop.interval_s",
        env="ROOFTOP_LOOP_INTERVAL_S",
        parse=positive_seconds,
        chart="loop.intervalSeconds",
    ),
    Setting(field="loop.window", env="ROOFTOP_LOOP_WINDOW", parse=_window, chart="loop.window"),
    Setting(
        field="loop.stale_after_s",
        env="ROOFTOP_LOOP_STALE_AFTER_S",
        parse=positive_seconds,
        chart="loop.staleAfterSeconds",
    ),
    Setting(
        field="loop.startup_s",
        env="ROOFTOP_LOOP_STARTUP_S",
        parse=seconds,
        chart="loop.startupSeconds",
    ),
    Setting(
        field="loop.scale_down_window_s",
        env="ROOFTOP_LOOP_SCALE_DOWN_WINDOW_S",
        parse=seconds,
        chart="loop.scaleDownWindowSeconds",
    ),
    Setting(
        field="loop.prometheus_auth.bearer_token_file",
        env="ROOFTOP_PROMETHEUS_BEARER_TOKEN_FILE",
        parse=_text,
        chart="loop.prometheusAuth.bearerTokenFile",
    ),
    Setting(
        field="loop.prometheus_auth.ca_file",
        env="ROOFTOP_PROMETHEUS_CA_FILE",
        parse=_text,
        chart="loop.prometheusAuth.caConfigMap",
    ),
    Setting(
        field="loop.prometheus_auth.headers",
        env="ROOFTOP_PROMETHEUS_HEADERS",
        parse=_headers,
        chart="loop.prometheusAuth.headers",
    ),
    # a test hook (see OperatorConfig.fault_pause_after_apply_s): no chart value sets it
    Setting(
        field="fault_pause_after_apply_s",
        env="ROOFTOP_FAULT_PAUSE_AFTER_APPLY_S",
        parse=seconds,
        chart=None,
    ),
)


def read_settings(
    environ: Mapping[str, str] | None = None, flags: Mapping[str, str | None] | None = None
) -> dict[str, object]:
    """The settings given, by ``Setting.field``: ``flags`` (by flag, e.g.
    ``{"--vllm-image": "..."}``) over the environment; an empty one is not given.

    Raises:
        ValueError: a value its setting refuses; the message names the variable or flag.
    """
    env = os.environ if environ is None else environ
    given = flags or {}
    values: dict[str, object] = {}
    for setting in SETTINGS:
        flag_text = given.get(setting.flag) if setting.flag else None
        if flag_text:
            values[setting.field] = setting.parse(str(setting.flag), flag_text)
        elif env.get(setting.env):
            values[setting.field] = setting.parse(setting.env, env[setting.env])
    return values


def add_setting_flags(
    parser: argparse.ArgumentParser, fields: Collection[str] | None = None
) -> None:
    """The ``flag`` of each setting (of ``fields``, else all) on an argparse parser, read
    back with ``setting_flags``."""
    for setting in SETTINGS:
        if setting.flag and (fields is None or setting.field in fields):
            choices = setting.choices or None
            parser.add_argument(setting.flag, default=None, choices=choices, help=setting.help)


def setting_flags(args: argparse.Namespace) -> dict[str, str | None]:
    """The setting flags an argparse namespace holds, by flag (for ``read_settings``)."""
    flags = [s.flag for s in SETTINGS if s.flag]
    return {flag: getattr(args, flag[2:].replace("-", "_"), None) for flag in flags}


def configured(values: Mapping[str, object], **startup: Any) -> OperatorConfig:
    """An ``OperatorConfig`` from ``read_settings``' values (each field not given keeps
    its default) and ``startup``'s fields (namespaces, peering, ...)."""
    top: dict[str, Any] = dict(startup)
    loop: dict[str, Any] = {}
    auth: dict[str, Any] = {}
    for dotted, value in values.items():
        parts = dotted.split(".")
        where = {1: top, 2: loop, 3: auth}[len(parts)]
        where[parts[-1]] = value
    loop_settings = LoopSettings(**loop, prometheus_auth=PrometheusAuth(**auth))
    return OperatorConfig(**top, loop=loop_settings)


# Kubernetes label syntax: an optional DNS-subdomain prefix and a name of at most 63
# characters; values of at most 63, alphanumeric at both ends (or empty).
_LABEL_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
LABEL_KEY: Final = re.compile(rf"([a-z0-9]([-a-z0-9.]{{0,251}}[a-z0-9])?/)?{_LABEL_NAME}")
LABEL_VALUE: Final = re.compile(rf"({_LABEL_NAME})?")


def parse_pod_monitor_labels(text: str) -> dict[str, str]:
    """ROOFTOP_PODMONITOR_LABELS: a JSON object of label names to values (the chart
    renders ``engine.podMonitor.labels`` so). Checked here, at startup, because a bad
    label would otherwise fail every target's PodMonitor apply, one error per target."""
    name = "ROOFTOP_PODMONITOR_LABELS"
    labels = _json_strings(text)
    if labels is None:
        raise ValueError(
            f'{name}={text!r}: give a JSON object of strings, e.g. {{"release": "kps"}}'
        )
    for key, value in labels.items():
        if not LABEL_KEY.fullmatch(key) or not LABEL_VALUE.fullmatch(value):
            raise ValueError(f"{name}: {key}={value!r} is not a valid Kubernetes label")
    taken = sorted(set(labels) & set(builders.labels("x")))
    if taken:
        raise ValueError(
            f"{name}: the operator sets {', '.join(taken)} itself, to name and find its own objects"
        )
    return labels


def parse_default_pricing(text: str) -> Pricing:
    """ROOFTOP_DEFAULT_PRICING: ``spec.pricing``'s fields as a JSON object (the chart
    renders ``operator.pricing`` so), checked against the catalog at startup: a typo
    would otherwise price every target at list prices without a word."""
    name = "ROOFTOP_DEFAULT_PRICING"
    try:
        pricing = Pricing.model_validate_json(text)
    except ValidationError as err:
        problems = format_validation_error(err).replace("\n", "; ")
        raise ValueError(f"{name}: {problems}") from None
    try:
        check_pricing(pricing, load_catalog(), name)
    except CatalogError as err:
        raise ValueError(str(err)) from None
    return pricing


def _json_strings(text: str) -> dict[str, str] | None:
    """``text`` as a JSON object whose values are strings, else None."""
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if isinstance(value, dict) and all(isinstance(v, str) for v in value.values()):
        return value
    return None


def seniority_priority(now_ns: int | None = None) -> int:
    """A peering priority that ranks replicas by age: minus the start time in µs.

    kopf runs the replica with the highest priority and pauses the others; equal
    priorities pause all of them. Minus the start time is distinct for every replica
    (unless two start in the same microsecond) and ranks the longest-running one
    highest, so a replica that starts later (a rollout's new pod, a restarted
    container) stands by instead of taking over from a healthy active one: one failure
    or rollout, at most one handover. Any explicit priority >= 0 outranks it (a
    developer's operator, for instance). Microseconds since 1970 stay below 2**53, so
    the number survives JSON readers that parse floats.
    """
    now = time.time_ns() if now_ns is None else now_ns
    return -(now // 1000)


def parse_inventory_mode(text: str) -> bool:
    """``nodes`` (plan for the Nodes' GPUs) or ``off`` (the whole catalog)."""
    try:
        return INVENTORY_MODES[text.strip().lower()]
    except KeyError:
        raise ValueError(
            f"GPU inventory mode {text!r} (ROOFTOP_GPU_INVENTORY or --gpu-inventory): "
            "use nodes or off"
        ) from None


def configure(settings: kopf.OperatorSettings, config: OperatorConfig) -> None:
    """Apply our choices to kopf's settings (called from the startup handler)."""
    # Without a server-side timeout, a watch can go silent forever when a proxy or the
    # API server drops the stream without closing it, and the operator stops seeing
    # events (nolar/kopf#585). A server timeout below the client one makes the server
    # end each watch cleanly and kopf reconnect; the client timeout is the safety net.
    settings.watching.server_timeout = config.server_timeout_s
    settings.watching.client_timeout = config.client_timeout_s
    settings.watching.connect_timeout = 30
    # One replica by default: peering needs the KopfPeering CRDs and extra RBAC.
    settings.peering.standalone = config.peering is None
    if config.peering is not None:
        settings.peering.name = config.peering
        settings.peering.clusterwide = config.clusterwide
        settings.peering.priority = config.peering_priority
        settings.peering.lifetime = config.peering_lifetime_s
    # Keep kopf's bookkeeping in annotations: our status schema is generated from the
    # pydantic models and would prune kopf's `status.kopf` field anyway.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(
        prefix=ANNOTATION_PREFIX
    )
    settings.persistence.diffbase_storage = DigestDiffBaseStorage(
        prefix=ANNOTATION_PREFIX, key="last-handled-configuration"
    )
    settings.persistence.finalizer = f"{ANNOTATION_PREFIX}/finalizer"
    # After kopf writes its bookkeeping it waits for that version to come back on the
    # watch before it runs handlers again; past this timeout it goes on with the stale
    # body, which lacks the bookkeeping, and reconciles the new target a second time.
    # Under a burst (1,000 targets applied at once) the watch lags by more than kopf's
    # 5 s default. Waiting is free when the version arrives (the wait ends at once); a
    # long timeout only delays an object whose awaited version the watch skipped.
    settings.persistence.consistency_timeout = CONSISTENCY_TIMEOUT_S
    settings.execution.max_workers = RECONCILE_THREADS
    # Routine handler logs stay in the log; Kubernetes events are posted explicitly
    # (plan changes, infeasible targets) so `kubectl describe st` tells a short story.
    settings.posting.level = logging.WARNING
    # Namespace-scoped installs have no cluster-wide RBAC to scan CRDs/namespaces with.
    settings.scanning.disabled = not config.clusterwide
    # A line per timer tick and watch event is noise at scale (about 100 lines/s with
    # 1,000 targets); those successes go to DEBUG, a decision that changes something
    # still says so at INFO (its event).
    objects = logging.getLogger("kopf.objects")
    if not any(isinstance(f, RoutineSuccesses) for f in objects.filters):
        objects.addFilter(RoutineSuccesses())


class DigestDiffBaseStorage(kopf.AnnotationsDiffBaseStorage):
    """kopf's record of the last handled spec as a digest per part, not a copy.

    kopf keeps what it last handled in an annotation to tell a change from a resume.
    A copy of the spec there is as big as the spec, JSON-escaped (an accented character
    takes 6 bytes), and a resource's annotations may hold 256 KiB in all: a spec with
    large env values would make every write of kopf's fail, the target loop forever and
    its deletion hang. Our update handler only asks whether ``spec`` changed (it reads
    the spec from the body, not kopf's old/new), which a digest answers in 80 bytes.
    """

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        source = body if extra_fields else essence_source(body)
        essence = super().build(body=source, extra_fields=extra_fields)
        digests = {part: {"sha256": digest(value)} for part, value in essence.items()}
        return cast(kopf.BodyEssence, digests)


# The metadata kopf's essence keeps (labels, annotations) or reads (owners, for its key).
ESSENCE_METADATA: Final = ("labels", "annotations", "ownerReferences", "name", "namespace")


def essence_source(body: Mapping[str, Any]) -> kopf.Body:
    """``body`` without what kopf's essence drops anyway: status, managedFields and the
    other bookkeeping in metadata. kopf deep-copies the whole body before dropping them,
    on every watch event; without them the copy is of the spec alone (under a burst of
    new targets that copy was a tenth of the operator's CPU)."""
    meta = body.get("metadata") or {}
    slim = {k: v for k, v in body.items() if k not in ("metadata", "status")}
    slim["metadata"] = {k: meta[k] for k in ESSENCE_METADATA if k in meta}
    return kopf.Body(cast(kopf.RawBody, slim))


def digest(value: Any) -> str:
    """SHA-256 of ``value``'s canonical JSON (sorted keys): equal for equal content."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


# Handlers that run on every tick or watch event, or per target for its lifetime, not on
# a user's change.
ROUTINE_HANDLERS: Final = (
    "presence",
    "replan_waiting",
    "engine_deployment_event",
    "target_event",
    "engine_deployments",
)


class RoutineSuccesses(logging.Filter):
    """kopf logs "<handler> succeeded." at INFO after every call; for the routine
    handlers that becomes DEBUG (shown with --verbose)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        routine = any(f"'{name}'" in message for name in ROUTINE_HANDLERS)
        if record.levelno == logging.INFO and routine and message.endswith(" succeeded."):
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            return logging.getLogger().isEnabledFor(logging.DEBUG)
        return True
