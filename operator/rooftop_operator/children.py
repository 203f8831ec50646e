"""From (target, plan) to the objects the operator applies, without a cluster.

The operator's handlers and ``rooftop render`` both call ``engine_inputs`` and
``desired``, so what ``render`` prints is what the operator would apply. Everything a
handler would read from the cluster (whether the PodMonitor API exists) is a parameter.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, NamedTuple

from rooftop_api.spec import Mode, ServingTargetSpec
from rooftop_operator import builders
from rooftop_operator.settings import OperatorConfig
from rooftop_operator.specs import TargetRef
from rooftop_planner.catalog import ACCELERATOR_FAMILIES, Catalog
from rooftop_planner.errors import PlannerError
from rooftop_planner.hf_config import resolve_model
from rooftop_planner.lifecycle import Lifecycle, lifecycle
from rooftop_planner.plan import Plan
from rooftop_planner.pricing import replica_price
from rooftop_planner.weights import Weights, resolve_weights

Obj = dict[str, Any]


def served_model(spec: ServingTargetSpec, catalog: Catalog) -> str:
    """The model's usual name: the catalog entry's Hugging Face repo, else ``spec.model``
    itself (a repo id, with its config given inline in ``modelConfig``)."""
    if spec.model_config_json is not None:
        return spec.model
    try:
        repo = catalog.model(spec.model).hf_repo
    except PlannerError:
        return spec.model
    return str(repo or spec.model)


def engine_families(config: OperatorConfig, spec: ServingTargetSpec) -> list[str]:
    """Accelerator families a plan may use: those with a vLLM image, or every family
    when the target names its own image (the user vouches for it)."""
    if spec.engine.image:
        return list(ACCELERATOR_FAMILIES)
    return sorted(config.engine_images())


def resolve_plan_weights(catalog: Catalog, spec: ServingTargetSpec, plan: Plan) -> Weights | None:
    """The checkpoint the plan's weight dtype loads, resolved from the catalog and the
    spec (None for a simulated engine); ``builders.vllm_weights`` reads it from the inputs.

    Raises:
        builders.UnsupportedPlan: no checkpoint serves that dtype.
    """
    if spec.mode is Mode.SIMULATED:
        return None
    weights = resolve_weights(spec, resolve_model(spec, catalog), plan.weight_dtype)
    if isinstance(weights, str):
        raise builders.UnsupportedPlan(weights)
    return weights


def pod_lifecycle(catalog: Catalog, spec: ServingTargetSpec, plan: Plan) -> Lifecycle:
    """How one engine pod of ``plan`` starts and drains (``rooftop_planner.lifecycle``).

    Raises:
        builders.UnsupportedPlan: no checkpoint serves the plan's weight dtype.
        ValueError, KeyError: the spec names a model the catalog cannot resolve.
    """
    weights = resolve_plan_weights(catalog, spec, plan)
    return lifecycle(spec, plan, resolve_model(spec, catalog), weights)


def resolve_engine_image(
    config: OperatorConfig, spec: ServingTargetSpec, family: str, arch: str = "amd64"
) -> str:
    """The image for this accelerator family and host architecture, from the operator's
    configured images (the spec's own wins; ``builders.image_for_mode`` chooses by mode).

    GH200 hosts are arm64: vLLM publishes vllm/vllm-openai tags as multi-arch manifests
    (x86_64 and aarch64), so the CUDA image serves them unless ``vllm_arm64_image``
    names another (a registry mirror that copied only the amd64 variant).

    Raises:
        builders.UnsupportedPlan: no vLLM image for the family is configured.
    """
    images = config.engine_images()
    if family == "cuda" and arch == "arm64" and config.vllm_arm64_image:
        images["cuda"] = config.vllm_arm64_image
    if spec.mode is Mode.VLLM and not spec.engine.image and family not in images:
        raise builders.UnsupportedPlan(
            f"no vLLM image for {family} accelerators is configured "
            f"(chart value operator.{family}Image)"
        )
    return builders.image_for_mode(spec, images.get(family, ""), config.self_image)


def engine_inputs(
    catalog: Catalog,
    config: OperatorConfig,
    ref: TargetRef,
    spec: ServingTargetSpec,
    plan: Plan,
    *,
    pod_monitor: bool,
) -> builders.EngineInputs:
    """Everything the builders need for one target and plan; a mixed fleet's with each
    pool's own (``EngineInputs.pools``)."""
    target = _Target(catalog, config, ref, spec, pod_monitor)
    one = _inputs_for(target, plan)
    if not plan.pools:
        return one
    pools = tuple(
        replace(
            _inputs_for(target, pool),
            pool=pool.gpu,
            others=(plan.replicas - pool.replicas, plan.usd_per_hour - pool.usd_per_hour),
        )
        for pool in plan.pools
    )
    return replace(one, pools=pools)


class _Target(NamedTuple):
    """What every pool's inputs share: the target and where it is deployed."""

    catalog: Catalog
    config: OperatorConfig
    ref: TargetRef
    spec: ServingTargetSpec
    pod_monitor: bool


def _inputs_for(target: _Target, plan: Plan) -> builders.EngineInputs:
    catalog, config, ref, spec, pod_monitor = target
    gpu = catalog.gpu(plan.gpu)
    weights = resolve_plan_weights(catalog, spec, plan)
    return builders.EngineInputs(
        ref=ref,
        spec=spec,
        plan=plan,
        served_model=served_model(spec, catalog),
        node_label=(gpu.node_label_key, gpu.node_label_value),
        gpu_resource=gpu.resource_name,
        image=resolve_engine_image(config, spec, gpu.family, gpu.host_arch),
        host_arch=gpu.host_arch,
        pod_monitor=pod_monitor,
        pod_security=config.engine_pod_security,
        pod_monitor_labels=config.pod_monitor_labels,
        weights=weights,
        lifecycle=lifecycle(spec, plan, resolve_model(spec, catalog), weights),
        price=replica_price(spec, catalog, plan.gpu, plan.tp),
    )


def desired(inp: builders.EngineInputs) -> list[Obj]:
    """The target's children: for vLLM the drain middleware's ConfigMap (first: its
    pods mount it), then the Deployment (a mixed fleet: one per pool), Service,
    PodDisruptionBudget and, where the Prometheus Operator is installed, a PodMonitor."""
    objects = [] if inp.spec.mode is Mode.SIMULATED else [builders.build_config_map(inp.ref)]
    objects += [builders.build_deployment(p) for p in inp.pools or (inp,)]
    objects += [
        builders.build_service(inp.ref, inp.plan.session_affinity),
        builders.build_pod_disruption_budget(inp.ref),
    ]
    if inp.pod_monitor:
        objects.append(builders.build_pod_monitor(inp.ref, inp.pod_monitor_labels))
    return objects
