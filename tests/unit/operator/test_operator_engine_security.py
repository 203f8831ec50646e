"""Engine pods' Pod Security level and the engine PodMonitor's extra labels: the
builder dicts, the operator settings that choose them, and the reconcile that joins the
two. The real admission check runs in tests/e2e/test_engine_settings.py."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml
from operator_fakes import NS, SPEC, FakeKube, target_body
from test_operator_builders import REF, container, inputs, pod_spec

from rooftop_api.spec import ModelCache
from rooftop_operator import __main__ as main_mod
from rooftop_operator import builders
from rooftop_operator.engine_security import MODEL_CACHE_PATH, PodSecurity, parse_pod_security
from rooftop_operator.reconcile import reconcile
from rooftop_operator.runtime import Runtime
from rooftop_operator.settings import OperatorConfig, parse_pod_monitor_labels, read_settings
from rooftop_planner.catalog import Catalog

Obj = dict[str, Any]
RESTRICTED = PodSecurity.RESTRICTED
SIMULATED = {**SPEC, "mode": "simulated"}


def pod(catalog: Catalog, level: PodSecurity, spec: Obj | None = None, **plan: Any) -> Obj:
    """The engine pod spec a Deployment built at ``level`` carries."""
    inp = replace(inputs(catalog, spec, **plan), pod_security=level)
    return pod_spec(builders.build_deployment(inp))


def env_of(pod: Obj) -> dict[str, Obj]:
    return {e["name"]: e for e in pod["containers"][0].get("env", [])}


def restricted_violations(pod: Obj) -> list[str]:
    """The "restricted" rules of the Pod Security Standards that concern these pods
    (kubernetes.io/docs/concepts/security/pod-security-standards), checked the way the
    admission plugin does: a pod-level field counts for the container unless the
    container overrides it."""
    pod_ctx, (engine,) = pod.get("securityContext", {}), pod["containers"]
    ctx = {**pod_ctx, **engine.get("securityContext", {})}
    problems = []
    if ctx.get("runAsNonRoot") is not True:
        problems.append("runAsNonRoot != true")
    if ctx.get("runAsUser") == 0:
        problems.append("runAsUser=0")
    if ctx.get("allowPrivilegeEscalation") is not False:
        problems.append("allowPrivilegeEscalation != false")
    if ctx.get("capabilities", {}).get("drop") != ["ALL"]:
        problems.append("capabilities.drop != [ALL]")
    if ctx.get("seccompProfile", {}).get("type") not in ("RuntimeDefault", "Localhost"):
        problems.append("seccompProfile not RuntimeDefault/Localhost")
    allowed = {"emptyDir", "persistentVolumeClaim", "configMap", "secret", "projected"}
    problems += [f"volume {v['name']}" for v in pod["volumes"] if not set(v) - {"name"} <= allowed]
    return problems


# ---------------------------------------------------------------- baseline (default)


def test_baseline_is_the_default_and_keeps_the_images_user(catalog: Catalog) -> None:
    """The public vLLM image runs as root: baseline must not ask for another user."""
    assert OperatorConfig().engine_pod_security is PodSecurity.BASELINE
    spec = pod(catalog, PodSecurity.BASELINE)
    assert spec["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}
    assert spec["containers"][0]["securityContext"] == {"allowPrivilegeEscalation": False}
    volumes = {v["name"] for v in spec["volumes"]}
    assert volumes == {"model-cache", "dshm", "rooftop-drain"}  # no writable extras


@pytest.mark.parametrize("level", list(PodSecurity))
def test_the_model_cache_is_hf_home_at_every_level(catalog: Catalog, level: PodSecurity) -> None:
    """Not under /root, which only root may enter; HF_HOME follows the mount."""
    spec = pod(catalog, level, {**SPEC, "engine": {"modelCache": {"pvcName": "models"}}})
    mounts = {m["name"]: m["mountPath"] for m in spec["containers"][0]["volumeMounts"]}
    assert mounts["model-cache"] == MODEL_CACHE_PATH == "/var/cache/rooftop/huggingface"
    assert env_of(spec)["HF_HOME"] == {"name": "HF_HOME", "value": MODEL_CACHE_PATH}


def test_the_crd_says_where_the_cache_is() -> None:
    """The planner (which generates the CRD) may not import the operator: the path is
    written twice, and this keeps the two equal."""
    assert MODEL_CACHE_PATH in (ModelCache.__doc__ or "")


def test_baseline_fails_restricted(catalog: Catalog) -> None:
    """The check below can fail: baseline pods are refused by a restricted namespace."""
    assert "runAsNonRoot != true" in restricted_violations(pod(catalog, PodSecurity.BASELINE))


# ---------------------------------------------------------------- restricted


@pytest.mark.parametrize("tp", [1, 4])  # 4: with the /dev/shm emptyDir
def test_restricted_vllm_pod_passes_restricted(catalog: Catalog, tp: int) -> None:
    spec = pod(catalog, RESTRICTED, tp=tp)
    assert restricted_violations(spec) == []
    assert spec["securityContext"] == {
        "seccompProfile": {"type": "RuntimeDefault"}, "runAsNonRoot": True,
        "runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 1000,
        "fsGroupChangePolicy": "OnRootMismatch",
    }  # fmt: skip
    assert spec["containers"][0]["securityContext"] == {
        "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": True,  # what vLLM writes is on volumes (next test)
    }  # fmt: skip


def test_every_path_vllm_writes_is_on_a_writable_volume(catalog: Catalog) -> None:
    """A non-root uid cannot write the image's /root or /tmp: every home and cache
    variable must point into an emptyDir (or the model cache) mounted in the pod."""
    spec = pod(catalog, RESTRICTED)
    volumes = {v["name"]: v for v in spec["volumes"]}
    writable = [PurePosixPath(m["mountPath"]) for m in spec["containers"][0]["volumeMounts"]
                if "emptyDir" in volumes[m["name"]] or m["name"] == "model-cache"]  # fmt: skip
    assert PurePosixPath("/tmp") in writable
    env = env_of(spec)
    wanted = {"HOME", "HF_HOME", "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "VLLM_CACHE_ROOT",
              "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR"}  # fmt: skip
    assert wanted <= set(env)
    for name in wanted:
        path = PurePosixPath(env[name]["value"])
        assert any(path == w or w in path.parents for w in writable), (name, path)


def test_the_users_env_wins_and_each_name_appears_once(catalog: Catalog) -> None:
    """spec.engine.env is the user's explicit choice (a cache on another path); a
    duplicate name would fail the server-side apply of the whole Deployment."""
    user = [{"name": "HF_HOME", "value": "/models"}, {"name": "A", "value": "1"}]
    engine = {"env": user, "hfTokenSecretRef": {"name": "hf"}}
    env = pod(catalog, RESTRICTED, {**SPEC, "engine": engine})["containers"][0]["env"]
    names = [e["name"] for e in env]
    assert len(names) == len(set(names))
    by_name = {e["name"]: e for e in env}
    assert by_name["HF_HOME"]["value"] == "/models" and by_name["A"]["value"] == "1"
    assert by_name["HOME"]["value"] == "/home/rooftop"
    assert "secretKeyRef" in by_name["HF_TOKEN"]["valueFrom"]


@pytest.mark.parametrize("mode", ["vllm", "simulated"])
def test_a_name_given_twice_is_applied_once(catalog: Catalog, mode: str) -> None:
    """The API server refuses a server-side apply whose env names a variable twice
    ("duplicate entries for key [name=...]"), so the target would never deploy: a
    repeated name keeps its last value (a plain HF_TOKEN beside hfTokenSecretRef is
    refused by the API: test_spec_engine.py)."""
    user = [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]
    engine = {"env": user, "hfTokenSecretRef": {"name": "hf"}}
    env = pod(catalog, RESTRICTED, {**SPEC, "mode": mode, "engine": engine}, gpu="l4")
    entries = env["containers"][0]["env"]
    assert sorted(e["name"] for e in entries if e["name"] in ("A", "HF_TOKEN")) == ["A", "HF_TOKEN"]
    assert env_of(env)["A"]["value"] == "2"
    assert env_of(env)["HF_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "hf"


def test_a_simulated_pod_changes_only_its_security_context(catalog: Catalog) -> None:
    """The simulator runs the operator's image (user 10001, writes nothing): restricted
    neither picks a uid for it nor adds volumes or environment."""
    baseline = pod(catalog, PodSecurity.BASELINE, SIMULATED, gpu="l4")
    restricted = pod(catalog, RESTRICTED, SIMULATED, gpu="l4")
    assert restricted_violations(restricted) == []
    assert restricted["securityContext"] == {
        "seccompProfile": {"type": "RuntimeDefault"}, "runAsNonRoot": True
    }  # fmt: skip
    strip = _without_security_context
    assert strip(restricted) == strip(baseline)
    assert "env" not in restricted["containers"][0]


def _without_security_context(pod: Obj) -> Obj:
    containers = [{k: v for k, v in c.items() if k != "securityContext"}
                  for c in pod["containers"]]  # fmt: skip
    return {**{k: v for k, v in pod.items() if k != "securityContext"}, "containers": containers}


# ---------------------------------------------------------------- settings


@pytest.mark.parametrize(("text", "level"), [("restricted", RESTRICTED), (" Baseline", "baseline")])
def test_pod_security_from_the_environment(text: str, level: str) -> None:
    assert read_settings({"ROOFTOP_ENGINE_POD_SECURITY": text})["engine_pod_security"] == level


def test_a_bad_pod_security_level_names_the_variable_and_stops_the_operator(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(ValueError, match="ROOFTOP_ENGINE_POD_SECURITY='privileged': use baseline"):
        parse_pod_security("privileged")
    monkeypatch.setenv("ROOFTOP_ENGINE_POD_SECURITY", "strict")
    parser = argparse.ArgumentParser()
    main_mod.add_arguments(parser)
    assert main_mod.run(parser.parse_args(["-n", "x"])) == 2
    assert "ROOFTOP_ENGINE_POD_SECURITY='strict'" in capsys.readouterr().err


def test_pod_monitor_labels_from_the_environment() -> None:
    raw = '{"release": "kps", "team.example.com/owner": "ml-platform"}'
    got = read_settings({"ROOFTOP_PODMONITOR_LABELS": raw})["pod_monitor_labels"]
    assert got == {"release": "kps", "team.example.com/owner": "ml-platform"}
    assert OperatorConfig().pod_monitor_labels == {}


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("release=kps", "give a JSON object of strings"),
        ('["release"]', "give a JSON object of strings"),
        ('{"release": 1}', "give a JSON object of strings"),
        ('{"-release": "kps"}', "not a valid Kubernetes label"),
        ('{"release": "kube prometheus"}', "not a valid Kubernetes label"),
        ('{"release": "' + "k" * 64 + '"}', "not a valid Kubernetes label"),
        ('{"rooftop.dev/servingtarget": "x"}', "the operator sets"),
        ('{"app.kubernetes.io/managed-by": "helm"}', "the operator sets"),
    ],
)
def test_bad_pod_monitor_labels_name_the_variable(raw: str, message: str) -> None:
    with pytest.raises(ValueError, match="ROOFTOP_PODMONITOR_LABELS") as err:
        parse_pod_monitor_labels(raw)
    assert message in str(err.value)


# ---------------------------------------------------------------- PodMonitor labels


def test_pod_monitor_carries_the_extra_labels_beside_its_own() -> None:
    monitor = builders.build_pod_monitor(REF, {"release": "kps"})
    assert monitor["metadata"]["labels"] == {**builders.labels("chat"), "release": "kps"}
    assert monitor["spec"]["selector"]["matchLabels"] == builders.selector_labels("chat")
    assert builders.build_pod_monitor(REF)["metadata"]["labels"] == builders.labels("chat")


def test_the_operators_own_labels_win_a_clash() -> None:
    """The settings refuse such keys; the builder still never gives them up."""
    clash = {"rooftop.dev/servingtarget": "other", "release": "kps"}
    labels = builders.build_pod_monitor(REF, clash)["metadata"]["labels"]
    assert labels["rooftop.dev/servingtarget"] == "chat" and labels["release"] == "kps"


def test_reconcile_applies_what_the_operator_was_configured_with(
    rt: Runtime, kube: FakeKube
) -> None:
    kube.pod_monitors = True
    config = OperatorConfig(engine_pod_security=RESTRICTED, pod_monitor_labels={"release": "kps"})
    kube.add(target_body())
    reconcile(replace(rt, config=config), target_body())
    monitor = kube.get("monitoring.coreos.com/v1", "PodMonitor", NS, "chat-engine")
    assert monitor is not None and monitor["metadata"]["labels"]["release"] == "kps"
    deployment = kube.get("apps/v1", "Deployment", NS, "chat-engine")
    assert deployment is not None
    assert restricted_violations(pod_spec(deployment)) == []
    assert container(deployment)["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def test_rooftop_render_shows_what_the_operator_is_configured_with(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`rooftop render` reads the same ROOFTOP_* settings, so it prints the pods and
    PodMonitor the operator would apply; a bad value exits 2 naming the variable."""
    from rooftop_cli.main import main

    example = Path(__file__).resolve().parents[3] / "examples" / "chat-llama-3.1-8b.yaml"
    monkeypatch.setenv("ROOFTOP_ENGINE_POD_SECURITY", "restricted")
    monkeypatch.setenv("ROOFTOP_PODMONITOR_LABELS", '{"release": "kps"}')
    assert main(["render", str(example)]) == 0
    docs = [d for d in yaml.safe_load_all(capsys.readouterr().out) if d]
    deployment, monitor = docs[1], docs[-1]
    assert restricted_violations(pod_spec(deployment)) == []
    assert monitor["kind"] == "PodMonitor" and monitor["metadata"]["labels"]["release"] == "kps"
    monkeypatch.setenv("ROOFTOP_PODMONITOR_LABELS", "release=kps")
    assert main(["render", str(example)]) == 2
    assert "ROOFTOP_PODMONITOR_LABELS='release=kps'" in capsys.readouterr().err


def test_pods_the_api_server_refuses_are_the_ready_reason() -> None:
    """A namespace enforcing Pod Security refuses the pods themselves: no pod exists
    to look at, and only the Deployment's ReplicaFailure condition says why."""
    from rooftop_operator.readiness import readiness

    why = 'pods "chat-engine-1" is forbidden: violates PodSecurity "restricted:latest": ...'
    deployment = {
        "metadata": {"generation": 1},
        "spec": {"replicas": 1},
        "status": {"observedGeneration": 1, "conditions": [
            {"type": "Progressing", "status": "True", "reason": "NewReplicaSetCreated"},
            {"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate", "message": why},
        ]},
    }  # fmt: skip
    cond, desired, ready = readiness(deployment)
    assert (cond.status, cond.reason, desired, ready) == ("False", "FailedCreate", 1, 0)
    assert cond.message == f"0/1 engine replicas ready; {why}"
