"""Builders are pure: each test builds dicts and reads them like kubectl would."""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import replace
from typing import Any

import pytest
from operator_fakes import NS, SPEC, UID, make_plan

from rooftop_control.durations import parse_duration_s
from rooftop_operator import builders
from rooftop_operator.specs import TargetRef, parse_spec
from rooftop_planner import perf
from rooftop_planner.bursts import BURST_INTERVAL_S
from rooftop_planner.catalog import Catalog
from rooftop_planner.lifecycle import lifecycle
from rooftop_planner.weights import Weights, resolve_weights
from rooftop_sim.engine import server as engine_sim

REF = TargetRef(name="chat", namespace=NS, uid=UID, generation=3)
KV_CHOICES = {"auto", "fp8"}  # what a planned KV dtype becomes in vLLM 0.32


def inputs(
    catalog: Catalog,
    spec: dict[str, Any] | None = None,
    weights: Weights | None = None,
    **plan: Any,
) -> Any:
    parsed = parse_spec(spec or SPEC)
    the_plan = make_plan(**plan)
    gpu = catalog.gpu(the_plan.gpu)
    return builders.EngineInputs(
        ref=REF,
        spec=parsed,
        plan=the_plan,
        served_model="meta-llama/Llama-3.1-8B-Instruct",
        node_label=(gpu.node_label_key, gpu.node_label_value),
        gpu_resource=gpu.resource_name,
        image=builders.image_for_mode(parsed, "vllm/vllm-openai:v0.32.0", "rooftop:test"),
        weights=weights,
        lifecycle=lifecycle(parsed, the_plan, catalog.model(parsed.model), weights),
    )


def pod_spec(deployment: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = deployment["spec"]["template"]["spec"]
    return spec


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    (only,) = pod_spec(deployment)["containers"]
    return dict(only)


def flags(args: list[str]) -> list[str]:
    return [a for a in args if a.startswith("--")]


def pairs(args: list[str]) -> dict[str, str]:
    return {flag: args[i + 1] for i, flag in enumerate(args) if flag.startswith("--")}


def weights(catalog: Catalog, dtype: str, spec: dict[str, Any] | None = None) -> Weights:
    resolved = resolve_weights(parse_spec(spec or SPEC), catalog.model("llama-3.1-8b"), dtype)
    assert isinstance(resolved, Weights), resolved
    return resolved


@pytest.mark.parametrize(
    "plan",
    [
        {},
        {"tp": 4, "weight_dtype": "fp8", "kv_dtype": "fp8"},
        {"weight_dtype": "bf16", "kv_dtype": "bf16", "max_model_len": 0},
        {"gpu": "l4", "weight_dtype": "fp16", "kv_dtype": "fp16"},
    ],
)
def test_vllm_args_use_only_the_flags_the_builder_declares(
    catalog: Catalog, plan: dict[str, Any]
) -> None:
    args = builders.vllm_args(inputs(catalog, **plan))
    assert set(flags(args)) <= builders.ENGINE_FLAGS
    assert pairs(args)["--kv-cache-dtype"] in KV_CHOICES


def test_the_model_is_vllm_serves_positional_argument(catalog: Catalog) -> None:
    deployment = builders.build_deployment(inputs(catalog))
    engine = container(deployment)
    assert engine["command"] == ["vllm", "serve"]
    assert engine["args"][0] == "meta-llama/Llama-3.1-8B-Instruct"
    assert "--model" not in engine["args"]  # deprecated with `vllm serve`


def test_vllm_args_carry_the_plan(catalog: Catalog) -> None:
    args = builders.vllm_args(inputs(catalog, tp=2, max_num_seqs=48, weight_dtype="fp8"))
    got = pairs(args)
    assert got["--tensor-parallel-size"] == "2"
    assert got["--max-num-seqs"] == "48"
    assert got["--max-model-len"] == "4096"
    assert got["--gpu-memory-utilization"] == "0.9"
    # the token budget the plan's prefill chunks assume, whatever vLLM's default on this GPU
    assert got["--max-num-batched-tokens"] == str(perf.DEFAULT_MAX_NUM_BATCHED_TOKENS)
    assert got["--quantization"] == "fp8_per_tensor"  # online fp8; "fp8" is deprecated
    assert got["--port"] == "8000"
    # First served name is the one vLLM puts in the model_name metric label.
    names = args[args.index("--served-model-name") + 1 :]
    assert names[:2] == ["llama-3.1-8b", "meta-llama/Llama-3.1-8B-Instruct"]


def test_the_planned_prefill_chunk_reaches_vllm_and_the_engine_simulator(
    catalog: Catalog,
) -> None:
    chunked = inputs(catalog, max_num_batched_tokens=2048)
    assert pairs(builders.vllm_args(chunked))["--max-num-batched-tokens"] == "2048"
    assert pairs(builders.sim_command(chunked))["--max-num-batched-tokens"] == "2048"


@pytest.mark.parametrize(("dtype", "vllm_dtype"), [("bf16", "bfloat16"), ("fp16", "float16")])
def test_16_bit_weights_are_pinned_with_dtype(
    catalog: Catalog, dtype: str, vllm_dtype: str
) -> None:
    args = builders.vllm_args(inputs(catalog, weight_dtype=dtype))
    assert pairs(args)["--dtype"] == vllm_dtype  # not the checkpoint's own (Llama-2: fp16)
    assert "--quantization" not in args


@pytest.mark.parametrize("dtype", ["int8", "int4", "fp4"])
def test_quantized_weights_load_a_quantized_checkpoint(catalog: Catalog, dtype: str) -> None:
    args = builders.vllm_args(inputs(catalog, weight_dtype=dtype, weights=weights(catalog, dtype)))
    assert args[0] == catalog.model("llama-3.1-8b").checkpoints[dtype].repo
    assert args[0] != "meta-llama/Llama-3.1-8B-Instruct"
    # the checkpoint's quantization_config says its format; bitsandbytes is no 0.32 method
    assert "--quantization" not in args and "--dtype" not in args


@pytest.mark.parametrize("dtype", ["int8", "int4", "fp4"])
def test_quantized_weights_without_a_checkpoint_are_refused(catalog: Catalog, dtype: str) -> None:
    with pytest.raises(builders.UnsupportedPlan, match=f"checkpoints.{dtype}"):
        builders.vllm_args(inputs(catalog, weight_dtype=dtype))


def test_a_16_bit_kv_cache_is_spelled_auto(catalog: Catalog) -> None:
    args = builders.vllm_args(inputs(catalog, weight_dtype="bf16", kv_dtype="bf16"))
    assert pairs(args)["--kv-cache-dtype"] == "auto"  # vLLM refuses an explicit bfloat16


def test_a_kv_dtype_other_than_the_weights_16_bit_type_is_refused(catalog: Catalog) -> None:
    with pytest.raises(builders.UnsupportedPlan, match="kv bf16 needs weight dtype bf16"):
        builders.vllm_args(inputs(catalog, weight_dtype="fp16", kv_dtype="bf16"))


@pytest.mark.parametrize(
    ("config", "refused"),
    [
        ({"method": "suffix", "num_speculative_tokens": 3,
          "num_speculative_tokens_per_batch_size": [[1, 16, 3], [17, 256, 1]]}, True),
        ({"method": "suffix", "num_speculative_tokens_per_batch_size": [[1, 256, 3]]}, True),
        ({"method": "suffix", "num_speculative_tokens": 3,
          "num_speculative_tokens_per_batch_size": [[1, 16, 3], [17, 256, 3]]}, False),
        ({"method": "suffix", "num_speculative_tokens": 3}, False),
        ({"method": "ngram", "num_speculative_tokens": 3,
          "num_speculative_tokens_per_batch_size": [[1, 16, 3], [17, 256, 1]]}, False),
    ],
)  # fmt: skip
def test_a_suffix_config_whose_schedule_changes_the_length_is_never_deployed(
    catalog: Catalog, config: dict[str, Any], refused: bool
) -> None:
    """vLLM's suffix proposer asserts one draft length at every step, so a schedule
    giving another (vLLM's default K is 24) stops the engine at its first drafting step:
    refused before a pod is made, naming the fix. Prompt lookup takes a schedule."""
    spec = {**SPEC, "engine": {"extraArgs": ["--speculative-config", json.dumps(config)]}}
    if refused:
        with pytest.raises(builders.UnsupportedPlan, match="one length at every batch"):
            builders.vllm_args(inputs(catalog, spec))
    else:
        assert json.dumps(config) in builders.vllm_args(inputs(catalog, spec))


def test_model_volume_is_mounted_read_only_and_served_from(catalog: Catalog) -> None:
    engine_spec = {"modelVolume": {"claimName": "models", "path": "tiny/llama"}}
    spec = {**SPEC, "engine": engine_spec}
    inp = inputs(catalog, spec, weights=weights(catalog, "bf16", spec))
    deployment = builders.build_deployment(inp)
    assert container(deployment)["args"][0] == "/models/tiny/llama"
    claim = {"claimName": "models", "readOnly": True}
    assert {"name": "model-files", "persistentVolumeClaim": claim} in pod_spec(deployment)[
        "volumes"
    ]
    mount = {"name": "model-files", "mountPath": "/models", "readOnly": True}
    assert mount in container(deployment)["volumeMounts"]


def test_extra_args_are_appended_last(catalog: Catalog) -> None:
    spec = {**SPEC, "engine": {"extraArgs": ["--enable-prefix-caching"]}}
    assert builders.vllm_args(inputs(catalog, spec))[-1] == "--enable-prefix-caching"


def test_kv_dtype_vllm_cannot_store_is_refused(catalog: Catalog) -> None:
    with pytest.raises(builders.UnsupportedPlan, match="int8 KV cache"):
        builders.vllm_args(inputs(catalog, kv_dtype="int8"))


@pytest.mark.parametrize(
    ("gpu", "product"),
    [("h100-sxm", "NVIDIA-H100-80GB-HBM3"), ("a100-80gb", "NVIDIA-A100-SXM4-80GB"),
     ("l4", "NVIDIA-L4")],
)  # fmt: skip
def test_node_selector_targets_the_planned_gpu(catalog: Catalog, gpu: str, product: str) -> None:
    deployment = builders.build_deployment(inputs(catalog, gpu=gpu))
    assert pod_spec(deployment)["nodeSelector"] == {"nvidia.com/gpu.product": product}


def rollout(deployment: dict[str, Any]) -> dict[str, Any]:
    strategy = deployment["spec"]["strategy"]
    assert strategy["type"] == "RollingUpdate"
    rolling: dict[str, Any] = strategy["rollingUpdate"]
    return rolling


def test_a_rollout_starts_new_pods_before_old_ones_go(catalog: Catalog) -> None:
    # 2 replicas at $6.98/h under a $20/h budget: room for one more pod
    assert rollout(builders.build_deployment(inputs(catalog))) == {
        "maxSurge": 1, "maxUnavailable": 0,
    }  # fmt: skip
    # 8 replicas: 25 % of them at once, when budget and maxReplicas allow
    roomy = {**SPEC, "budget": {"usdPerHour": 100}}
    big = builders.build_deployment(inputs(catalog, roomy, replicas=8, usd_per_hour=8 * 3.49))
    assert rollout(big) == {"maxSurge": 2, "maxUnavailable": 0}


def test_a_rollout_never_bills_above_the_budget_or_max_replicas(catalog: Catalog) -> None:
    # 2 replicas at $10/h each use the whole $20/h budget: no surge, one pod at a time
    full = builders.build_deployment(inputs(catalog, usd_per_hour=20.0))
    assert rollout(full) == {"maxSurge": 0, "maxUnavailable": 1}
    # room for one more under the budget, though 25 % of 8 would be 2
    tight = {**SPEC, "budget": {"usdPerHour": 9 * 3.49}}
    one = builders.build_deployment(inputs(catalog, tight, replicas=8, usd_per_hour=8 * 3.49))
    assert rollout(one)["maxSurge"] == 1
    # maxReplicas caps the surge as it caps scaling
    capped = {**SPEC, "budget": {"usdPerHour": 100}, "constraints": {"maxReplicas": 8}}
    at_max = builders.build_deployment(inputs(catalog, capped, replicas=8, usd_per_hour=8 * 3.49))
    assert rollout(at_max) == {"maxSurge": 0, "maxUnavailable": 1}


def test_user_node_selector_is_merged_but_the_plan_wins(catalog: Catalog) -> None:
    selector = {"pool": "inference", "nvidia.com/gpu.product": "NVIDIA-L4"}
    spec = {**SPEC, "constraints": {"nodeSelector": selector}}
    deployment = builders.build_deployment(inputs(catalog, spec, gpu="h100-sxm"))
    assert pod_spec(deployment)["nodeSelector"] == {
        "pool": "inference",
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
    }


def test_non_nvidia_gpu_uses_its_own_label_and_resource(catalog: Catalog) -> None:
    deployment = builders.build_deployment(inputs(catalog, gpu="mi300x"))
    assert pod_spec(deployment)["nodeSelector"] == {
        "amd.com/gpu.product-name": "AMD_Instinct_MI300X"
    }
    resources = container(deployment)["resources"]
    assert resources["limits"] == {"amd.com/gpu": "1"}
    assert {"key": "amd.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod_spec(
        deployment
    )["tolerations"]


@pytest.mark.parametrize("tp", [1, 2, 8])
def test_gpu_request_equals_limit_equals_tp(catalog: Catalog, tp: int) -> None:
    resources = container(builders.build_deployment(inputs(catalog, tp=tp)))["resources"]
    assert resources["limits"] == {"nvidia.com/gpu": str(tp)}
    assert resources["requests"]["nvidia.com/gpu"] == str(tp)


@pytest.mark.parametrize(
    ("tp", "mode", "has_shm"),
    [(1, "vllm", True), (2, "vllm", True), (8, "vllm", True), (2, "simulated", False)],
)
def test_dev_shm_for_every_vllm_engine(catalog: Catalog, tp: int, mode: str, has_shm: bool) -> None:
    """vLLM passes messages between its API server and engine core through /dev/shm even
    at TP 1: its CPU build on the real node refused to start with the runtime's 64 MiB
    ("Insufficient space in /dev/shm ... 160 MiB required")."""
    deployment = builders.build_deployment(inputs(catalog, {**SPEC, "mode": mode}, tp=tp))
    volumes = {v["name"]: v for v in pod_spec(deployment)["volumes"]}
    mounts = {m["mountPath"] for m in container(deployment)["volumeMounts"]}
    assert ("dshm" in volumes) is has_shm
    assert ("/dev/shm" in mounts) is has_shm
    if has_shm:
        assert volumes["dshm"]["emptyDir"] == {"medium": "Memory"}


def test_hf_token_comes_from_the_secret(catalog: Catalog) -> None:
    spec = {
        **SPEC,
        "engine": {"hfTokenSecretRef": {"name": "hf"}, "env": [{"name": "A", "value": "1"}]},
    }
    env = container(builders.build_deployment(inputs(catalog, spec)))["env"]
    assert {"name": "A", "value": "1"} in env
    assert {
        "name": "HF_TOKEN",
        "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}},
    } in env


def test_api_key_comes_from_its_secret(catalog: Catalog) -> None:
    """vLLM reads VLLM_API_KEY; the key stays in the Secret, never in the pod spec."""
    spec = {**SPEC, "engine": {"apiKeySecretRef": {"name": "keys", "key": "api"}}}
    env = container(builders.build_deployment(inputs(catalog, spec)))["env"]
    assert {
        "name": "VLLM_API_KEY",
        "valueFrom": {"secretKeyRef": {"name": "keys", "key": "api"}},
    } in env


def test_no_secret_no_hf_token(catalog: Catalog) -> None:
    env = container(builders.build_deployment(inputs(catalog)))["env"]
    assert "HF_TOKEN" not in {e["name"] for e in env}


@pytest.mark.parametrize(
    ("cache", "source"),
    [
        (None, {"emptyDir": {}}),
        ({"sizeGi": 200}, {"emptyDir": {"sizeLimit": "200Gi"}}),
        ({"pvcName": "models"}, {"persistentVolumeClaim": {"claimName": "models"}}),
    ],
)
def test_model_cache_volume(catalog: Catalog, cache: Any, source: dict[str, Any]) -> None:
    spec = {**SPEC, "engine": {"modelCache": cache}} if cache else SPEC
    deployment = builders.build_deployment(inputs(catalog, spec))
    volumes = {v["name"]: v for v in pod_spec(deployment)["volumes"]}
    assert volumes["model-cache"] == {"name": "model-cache", **source}
    assert {"name": "model-cache", "mountPath": builders.CACHE_PATH} in container(deployment)[
        "volumeMounts"
    ]


def test_every_child_is_owned_by_the_target(catalog: Catalog) -> None:
    inp = inputs(catalog)
    children = [
        builders.build_deployment(inp),
        builders.build_service(REF),
        builders.build_pod_monitor(REF),
        builders.build_pod_disruption_budget(REF),
    ]
    for child in children:
        (owner,) = child["metadata"]["ownerReferences"]
        assert owner == {
            "apiVersion": "rooftop.dev/v1alpha1",
            "kind": "ServingTarget",
            "name": "chat",
            "uid": UID,
            "controller": True,
            "blockOwnerDeletion": True,
        }
        assert child["metadata"]["namespace"] == NS
        assert child["metadata"]["labels"]["rooftop.dev/servingtarget"] == "chat"


def test_service_selects_exactly_the_deployment_pods(catalog: Catalog) -> None:
    deployment = builders.build_deployment(inputs(catalog))
    service = builders.build_service(REF)
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["metadata"]["name"] == "chat"
    assert deployment["metadata"]["name"] == "chat-engine"
    assert deployment["spec"]["selector"]["matchLabels"] == service["spec"]["selector"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert pod_labels["app.kubernetes.io/name"] == "rooftop-engine"
    assert service["spec"]["ports"] == [
        {"name": "http", "port": 8000, "targetPort": "http", "protocol": "TCP"}
    ]


def test_the_plans_session_affinity_pins_clients_and_none_leaves_it_out() -> None:
    """Server-side apply removes a field the manager stops sending, so a plan without
    affinity must omit both fields (an explicit "None" with a leftover config is refused)."""
    pinned = builders.build_service(REF, "ClientIP")["spec"]
    assert pinned["sessionAffinity"] == "ClientIP"
    assert pinned["sessionAffinityConfig"] == {
        "clientIP": {"timeoutSeconds": builders.AFFINITY_TIMEOUT_S}
    }
    spread = builders.build_service(REF, "")["spec"]
    assert "sessionAffinity" not in spread and "sessionAffinityConfig" not in spread


def test_disruption_budget_covers_exactly_the_deployment_pods(catalog: Catalog) -> None:
    deployment = builders.build_deployment(inputs(catalog))
    pdb = builders.build_pod_disruption_budget(REF)
    assert (pdb["apiVersion"], pdb["metadata"]["name"]) == ("policy/v1", "chat-engine")
    assert pdb["spec"]["selector"] == deployment["spec"]["selector"]
    # one pod at a time at any replica count: a drain is slowed, never blocked
    assert pdb["spec"]["maxUnavailable"] == 1 and "minAvailable" not in pdb["spec"]
    assert pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"


def test_probes_hit_health_on_the_engine_port(catalog: Catalog) -> None:
    engine = container(builders.build_deployment(inputs(catalog)))
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert engine[probe]["httpGet"] == {"path": "/health", "port": "http"}
    assert engine["ports"] == [{"name": "http", "containerPort": 8000, "protocol": "TCP"}]


def test_scrape_annotations_only_without_pod_monitor(catalog: Catalog) -> None:
    inp = inputs(catalog)
    annotated = builders.build_deployment(inp)["spec"]["template"]["metadata"]
    scrape = {k: v for k, v in annotated["annotations"].items() if k.startswith("prometheus.io")}
    assert scrape == {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": "8000",
        "prometheus.io/path": "/metrics",
    }
    monitored = builders.build_deployment(replace(inp, pod_monitor=True))
    assert list(monitored["spec"]["template"]["metadata"]["annotations"]) == [
        builders.DRAIN_ANNOTATION
    ]


def test_pod_monitor_adds_namespace_and_servingtarget_labels() -> None:
    monitor = builders.build_pod_monitor(REF)
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    targets = {r["targetLabel"]: r["sourceLabels"] for r in endpoint["relabelings"]}
    assert targets == {
        "namespace": ["__meta_kubernetes_namespace"],
        "servingtarget": ["__meta_kubernetes_pod_label_rooftop_dev_servingtarget"],
        "pool": ["__meta_kubernetes_pod_label_rooftop_dev_pool"],
    }
    assert endpoint["port"] == "http" and endpoint["path"] == "/metrics"
    assert monitor["spec"]["selector"]["matchLabels"] == builders.selector_labels("chat")


def test_the_pod_monitor_scrapes_at_the_interval_burstiness_is_counted_over() -> None:
    """The loop reads a scrape interval's count as the increase between two scrapes
    (``idelta``); at another interval the planner would size bursts on the wrong scale."""
    (endpoint,) = builders.build_pod_monitor(REF)["spec"]["podMetricsEndpoints"]
    assert parse_duration_s(endpoint["interval"]) == BURST_INTERVAL_S


def test_user_tolerations_are_added_to_the_gpu_one(catalog: Catalog) -> None:
    toleration = {"key": "dedicated", "operator": "Equal", "value": "llm", "effect": "NoSchedule"}
    spec = {**SPEC, "constraints": {"tolerations": [toleration]}}
    tolerations = pod_spec(builders.build_deployment(inputs(catalog, spec)))["tolerations"]
    assert tolerations == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        toleration,
    ]


def test_image_pinned_to_the_tested_vllm_unless_overridden(catalog: Catalog) -> None:
    assert container(builders.build_deployment(inputs(catalog)))["image"] == (
        "vllm/vllm-openai:v0.32.0"
    )
    spec = {**SPEC, "engine": {"image": "registry.local/vllm:patched"}}
    assert container(builders.build_deployment(inputs(catalog, spec)))["image"] == (
        "registry.local/vllm:patched"
    )


def test_simulated_mode_runs_engine_sim_on_any_node(catalog: Catalog) -> None:
    """Simulated targets are the try-it path: on a cluster without GPUs they must
    schedule, so they ask for CPU and memory only and need no GPU label or taint."""
    spec = {**SPEC, "mode": "simulated"}
    deployment = builders.build_deployment(inputs(catalog, spec, tp=2, gpu="l4"))
    engine = container(deployment)
    assert engine["image"] == "rooftop:test"
    assert engine["command"][:2] == ["rooftop", "engine-sim"]
    assert "args" not in engine
    resources = engine["resources"]
    assert "nvidia.com/gpu" not in resources["limits"]
    assert set(resources["requests"]) == {"cpu", "memory", "ephemeral-storage"}
    assert pod_spec(deployment)["nodeSelector"] == {}
    assert pod_spec(deployment)["tolerations"] == []
    # the target's own placement still applies
    placed = {**spec, "constraints": {"nodeSelector": {"pool": "cpu"}}}
    deployment = builders.build_deployment(inputs(catalog, placed, tp=2, gpu="l4"))
    assert pod_spec(deployment)["nodeSelector"] == {"pool": "cpu"}
    # The same labels, port and probes as a vLLM pod: Service and scraping don't care.
    assert engine["ports"][0]["containerPort"] == 8000
    assert engine["readinessProbe"]["httpGet"]["path"] == "/health"


def test_simulator_accepts_every_flag_it_is_given(catalog: Catalog) -> None:
    """The real engine-sim parser must accept the command line (no drift)."""
    spec = {**SPEC, "mode": "simulated"}
    command = builders.sim_command(inputs(catalog, spec, tp=2, weight_dtype="fp8"))
    parser = argparse.ArgumentParser()
    engine_sim.add_arguments(parser)
    args = parser.parse_args(command[2:])
    assert (args.host, args.port, args.tp, args.gpu) == ("0.0.0.0", 8000, 2, "h100-sxm")
    assert (args.weight_dtype, args.max_num_seqs, args.max_model_len) == ("fp8", 64, 4096)


def test_a_simulated_engine_speculates_as_planned_at_the_stated_acceptance(
    catalog: Catalog,
) -> None:
    config = json.dumps({"method": "ngram", "num_speculative_tokens": 2})
    spec = {**SPEC, "mode": "simulated", "workload": {**SPEC["workload"], "acceptanceRate": 0.6}}
    command = builders.sim_command(inputs(catalog, spec, speculative_config=config))
    parser = argparse.ArgumentParser()
    engine_sim.add_arguments(parser)
    args = parser.parse_args(command[2:])
    assert (args.speculative_config, args.acceptance_rate) == (config, 0.6)
    plain = builders.sim_command(inputs(catalog, {**SPEC, "mode": "simulated"}))
    assert "--speculative-config" not in plain


def test_a_simulated_engine_gets_the_shape_of_a_drafter_the_spec_names(
    catalog: Catalog,
) -> None:
    config = json.dumps({"method": "eagle3", "model": "my/head", "num_speculative_tokens": 2})
    spec = {
        **SPEC,
        "mode": "simulated",
        "workload": {**SPEC["workload"], "acceptanceRate": 0.7},
        "constraints": {"speculative": ["eagle3"]},
        "engine": {"drafter": {"method": "eagle3", "model": "my/head", "draftVocabSize": 32000}},
    }
    command = builders.sim_command(inputs(catalog, spec, speculative_config=config))
    parser = argparse.ArgumentParser()
    engine_sim.add_arguments(parser)
    args = parser.parse_args(command[2:])
    assert (args.draft_layers, args.draft_vocab_size) == (1, 32000)
    sim = engine_sim.EngineSim(engine_sim.config_from_args(args))
    assert sim.engine.config.speculation is not None and sim.truth.drafter is not None


def test_replicas_come_from_the_plan(catalog: Catalog) -> None:
    deployment = builders.build_deployment(inputs(catalog, replicas=5))
    assert deployment["spec"]["replicas"] == 5


@pytest.mark.parametrize(
    ("scraped", "stored"),
    [
        ("vllm_num_requests_running", "vllm:num_requests_running"),
        ("vllm:num_requests_running", "vllm:num_requests_running"),
        ("process_cpu_seconds_total", "process_cpu_seconds_total"),
    ],
)
def test_pod_monitor_restores_vllm_metric_names(scraped: str, stored: str) -> None:
    """Prometheus relabel regexes are fully anchored; $1 is the first group."""
    (endpoint,) = builders.build_pod_monitor(REF)["spec"]["podMetricsEndpoints"]
    (rule,) = endpoint["metricRelabelings"]
    match = re.fullmatch(rule["regex"], scraped)
    result = rule["replacement"].replace("$1", match.group(1)) if match else scraped
    assert (rule["sourceLabels"], rule["targetLabel"]) == (["__name__"], "__name__")
    assert result == stored


def test_engine_pods_pull_with_the_targets_secrets(catalog: Catalog) -> None:
    spec = {**SPEC, "engine": {"imagePullSecrets": [{"name": "mirror"}, {"name": "ngc"}]}}
    pod = builders.build_deployment(inputs(catalog, spec))["spec"]["template"]["spec"]
    assert pod["imagePullSecrets"] == [{"name": "mirror"}, {"name": "ngc"}]
    default = builders.build_deployment(inputs(catalog))["spec"]["template"]["spec"]
    assert "imagePullSecrets" not in default


def test_every_flag_the_plan_sets_is_kept_out_of_extra_args(catalog: Catalog) -> None:
    """The spec refuses extraArgs that set a dest the builder sets (vLLM keeps the last
    one): every flag the builder writes must set such a dest, read as vLLM reads it."""
    from rooftop_api.vllm_args import ADDITIVE, PLANNED, RESERVED, resolve

    args = container(builders.build_deployment(inputs(catalog)))["args"]
    flags = args if args[0].startswith("-") else args[1:]  # the model may be positional
    dests = {s.dest for s in resolve(flags)}
    owned = {*PLANNED, *RESERVED, *ADDITIVE}
    assert dests and dests <= owned, dests - owned


def test_a_speculating_plan_reaches_vllm_as_its_speculative_config(catalog: Catalog) -> None:
    """The plan's JSON goes to vLLM as it is; a target whose planner chooses it may not
    set another in extraArgs (the spec refuses that, ``test_speculative``)."""
    config = json.dumps({"method": "eagle3", "model": "head", "num_speculative_tokens": 3})
    args = builders.vllm_args(inputs(catalog, speculative_config=config))
    assert json.loads(pairs(args)["--speculative-config"])["method"] == "eagle3"
    assert set(flags(args)) <= builders.ENGINE_FLAGS
    assert "--speculative-config" not in builders.vllm_args(inputs(catalog))


# ---------------------------------------------------------------- pod lifecycle


@pytest.mark.parametrize("mode", ["vllm", "simulated"])
def test_a_stopping_pod_finishes_its_requests(catalog: Catalog, mode: str) -> None:
    """vLLM's --shutdown-timeout defaults to 0, which aborts every in-flight stream on
    SIGTERM: each scale-down and rollout cut them. The plan's drain goes on the command
    line, a preStop sleep lets the endpoints drop the pod before SIGTERM, and the grace
    period outlasts both (the old 60 s was shorter than a long drain)."""
    inp = inputs(catalog, {**SPEC, "mode": mode})
    deployment = builders.build_deployment(inp)
    engine, pod = container(deployment), pod_spec(deployment)
    line = engine.get("args") or engine["command"]
    drain = int(line[line.index("--shutdown-timeout") + 1])
    assert drain == inp.lifecycle.shutdown_timeout_s >= 30
    pre_stop = engine["lifecycle"]["preStop"]
    if mode == "simulated":
        longest_hook = pre_stop["sleep"]["seconds"]
        assert longest_hook > 0
    else:
        argv = pre_stop["exec"]["command"]
        assert float(argv[argv.index("--min-s") + 1]) > 0
        longest_hook = float(argv[argv.index("--max-s") + 1])
    assert pod["terminationGracePeriodSeconds"] > longest_hook + drain


def test_vllm_pods_load_the_drain_middleware_from_their_config_map(catalog: Catalog) -> None:
    """A ClusterIP keeps a kept-alive connection on a draining pod, where vLLM aborts
    new requests: every vLLM pod loads engine_drain (vLLM's --middleware, from the
    target's ConfigMap on PYTHONPATH) and its preStop runs it as a script."""
    inp = inputs(catalog, {**SPEC, "engine": {"env": [{"name": "PYTHONPATH", "value": "/x"}]}})
    deployment = builders.build_deployment(inp)
    engine, pod = container(deployment), pod_spec(deployment)
    args = engine["args"]
    assert args[args.index("--middleware") + 1] == "rooftop_drain.DrainMiddleware"
    (volume,) = [v for v in pod["volumes"] if "configMap" in v]
    config_map = builders.build_config_map(REF)
    assert volume["configMap"]["name"] == config_map["metadata"]["name"] == "chat-engine"
    (mount,) = [m for m in engine["volumeMounts"] if m["name"] == volume["name"]]
    assert mount["readOnly"] is True
    env = {e["name"]: e["value"] for e in engine["env"] if "value" in e}
    assert env["PYTHONPATH"] == f"{mount['mountPath']}:/x"  # the target's own path kept
    (module,) = config_map["data"]
    assert module == "rooftop_drain.py"
    assert "class DrainMiddleware" in config_map["data"][module]
    script = engine["lifecycle"]["preStop"]["exec"]["command"][1]
    assert script == f"{mount['mountPath']}/{module}"


def test_a_changed_drain_module_rolls_the_pods(
    catalog: Catalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Running engines imported the middleware at start: new code needs new pods."""
    before = builders.build_deployment(inputs(catalog))["spec"]["template"]
    monkeypatch.setattr(builders, "drain_source", lambda: "changed = True\n")
    after = builders.build_deployment(inputs(catalog))["spec"]["template"]
    key = builders.DRAIN_ANNOTATION
    assert before["metadata"]["annotations"][key] != after["metadata"]["annotations"][key]


def test_simulated_targets_have_no_drain_config_map(catalog: Catalog) -> None:
    from rooftop_operator.children import desired

    kinds = [o["kind"] for o in desired(inputs(catalog, {**SPEC, "mode": "simulated"}))]
    assert "ConfigMap" not in kinds
    assert [o["kind"] for o in desired(inputs(catalog))][0] == "ConfigMap"  # mounted: first


def test_a_long_workload_drains_longer(catalog: Catalog) -> None:
    """Output p90 of 1,000 tokens at a 50 ms TPOT: a p99 request takes about 113 s."""
    long = {**SPEC, "workload": {**SPEC["workload"],
                                 "outputTokens": {"mean": 500, "p90": 1000}}}  # fmt: skip
    short_pod = pod_spec(builders.build_deployment(inputs(catalog)))
    long_pod = pod_spec(builders.build_deployment(inputs(catalog, long)))
    assert long_pod["terminationGracePeriodSeconds"] > 170
    assert short_pod["terminationGracePeriodSeconds"] < long_pod["terminationGracePeriodSeconds"]


@pytest.mark.parametrize("mode", ["vllm", "simulated"])
def test_engine_pods_get_no_service_links_and_no_token(catalog: Catalog, mode: str) -> None:
    """A Service named `vllm` in the namespace makes Kubernetes inject VLLM_PORT=tcp://..,
    which vLLM refuses at start-up; the engine never calls the API server."""
    pod = pod_spec(builders.build_deployment(inputs(catalog, {**SPEC, "mode": mode})))
    assert pod["enableServiceLinks"] is False
    assert pod["automountServiceAccountToken"] is False


def test_start_up_budget_follows_the_checkpoint_and_its_cache(catalog: Catalog) -> None:
    """Downloading pods ask the node for the checkpoint's disk and get a progress deadline
    and startup probe long enough for it; a PVC cache needs scratch only."""
    fresh = builders.build_deployment(inputs(catalog))
    cached_spec = {**SPEC, "engine": {"modelCache": {"pvcName": "hf-cache"}}}
    cached = builders.build_deployment(inputs(catalog, cached_spec))
    storage = [int(container(d)["resources"]["requests"]["ephemeral-storage"])
               for d in (fresh, cached)]  # fmt: skip
    assert storage[0] > 16e9 > storage[1]
    for deployment in (fresh, cached):
        deadline = deployment["spec"]["progressDeadlineSeconds"]
        assert deadline >= 600
        probe = container(deployment)["startupProbe"]
        assert probe["periodSeconds"] * probe["failureThreshold"] >= deadline


def test_a_70b_download_is_not_called_stuck_after_ten_minutes(catalog: Catalog) -> None:
    """141 GB at the assumed 200 MB/s is 705 s of download alone: Kubernetes' default
    600 s progress deadline would mark a healthy rollout ProgressDeadlineExceeded."""
    big = {**SPEC, "model": "llama-3.1-70b"}
    deployment = builders.build_deployment(inputs(catalog, big, tp=4))
    assert deployment["spec"]["progressDeadlineSeconds"] > 1500


def test_vllm_is_told_chunked_prefill_and_its_drain(catalog: Catalog) -> None:
    """The flags the builder emits are the ones ENGINE_FLAGS lists (the contract test
    parses them with the real vLLM)."""
    args = container(builders.build_deployment(inputs(catalog)))["args"]
    assert "--enable-chunked-prefill" in args and "--shutdown-timeout" in args
    emitted = {a for a in args if a.startswith("--")}
    assert emitted <= builders.ENGINE_FLAGS


# ---------------------------------------------------------------- arm64 GPU hosts


def test_a_gh200_plan_runs_an_arm64_image_on_arm64_nodes(catalog: Catalog) -> None:
    """GH200 hosts are arm64 (Grace). vLLM publishes vllm/vllm-openai tags as multi-arch
    manifests (x86_64 and aarch64), so the default image serves them; a mirror with only
    amd64 sets operator.vllmArm64Image. The pods pin kubernetes.io/arch either way."""
    from rooftop_operator import children
    from rooftop_operator.settings import OperatorConfig

    spec, gh200 = parse_spec(SPEC), make_plan(gpu="gh200")
    default = children.engine_inputs(catalog, OperatorConfig(), REF, spec, gh200,
                                     pod_monitor=False)  # fmt: skip
    assert default.image == OperatorConfig().vllm_image
    mirror = OperatorConfig(vllm_image="mirror/vllm:amd64", vllm_arm64_image="mirror/vllm:arm")
    inp = children.engine_inputs(catalog, mirror, REF, spec, gh200, pod_monitor=False)
    assert container(builders.build_deployment(inp))["image"] == "mirror/vllm:arm"
    assert pod_spec(builders.build_deployment(inp))["nodeSelector"]["kubernetes.io/arch"] == (
        "arm64"
    )
    h100 = children.engine_inputs(catalog, mirror, REF, spec, make_plan(), pod_monitor=False)
    assert h100.image == "mirror/vllm:amd64"
    assert "kubernetes.io/arch" not in pod_spec(builders.build_deployment(h100))["nodeSelector"]


def test_a_simulated_engine_is_not_deployed_for_a_model_only_its_config_json_gives(
    catalog: Catalog,
) -> None:
    """engine-sim times the catalog's models by their kernel tables; a model known from
    spec.modelConfig alone would crash every pod, so the plan is refused with the fix."""
    config = model_config_of(catalog.model("llama-3.1-8b"))
    spec = {**SPEC, "mode": "simulated", "model": "acme/custom-8b", "modelConfig": config}
    known = inputs(catalog, {**SPEC, "mode": "simulated"})
    custom = replace(known, spec=parse_spec(spec))
    with pytest.raises(builders.UnsupportedPlan, match="serves the catalog's models only"):
        builders.sim_command(custom)
    assert builders.sim_command(known)[:2] == ["rooftop", "engine-sim"]


def model_config_of(model: Any) -> dict[str, Any]:
    """A config.json of a catalog model's shape."""
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "hidden_size": model.hidden_size, "intermediate_size": model.intermediate_size,
            "num_attention_heads": model.num_heads, "num_key_value_heads": model.num_kv_heads,
            "num_hidden_layers": model.num_layers, "vocab_size": model.vocab_size,
            "max_position_embeddings": 8192}  # fmt: skip
