"""The Helm chart: documented, schema-checked values and least-privilege RBAC.

Rendering tests need the helm binary (built by `make tools`); they skip without it, the
values tests never do. `make test` builds the tools first, so there they always run.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import tempfile
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from tests.cluster.controlplane import find_binary

from rooftop_operator.settings import configured, read_settings

ROOT = Path(__file__).resolve().parents[3]
CHART = ROOT / "charts" / "rooftop"
KEY = re.compile(r"^(\s*)([A-Za-z_][\w.-]*):(.*)$")


def values() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text())
    return loaded


def validator() -> jsonschema.Draft7Validator:
    return jsonschema.Draft7Validator(json.loads((CHART / "values.schema.json").read_text()))


def test_values_yaml_matches_its_schema() -> None:
    errors = [e.message for e in validator().iter_errors(values())]
    assert errors == []


@pytest.mark.parametrize(
    "override",
    [
        {"rbac": {"scope": "everywhere"}},
        {"dashboards": {"enabled": "yes", "label": "x", "labelValue": "1", "annotations": {}}},
        {"replicaCount": -1},
        {"unknownKey": True},
        {"metrics": {"podMonitor": {"interval": "soon"}}},
        {"loop": {"prometheusAuth": {"bearerTokenFile": "token.txt"}}},  # not a path
        {"loop": {"prometheusAuth": {"caConfigMap": {"name": "Prom_CA", "key": "ca.crt"}}}},
        {"loop": {"prometheusAuth": {"headers": {"X-Scope-OrgID": 7}}}},
        {"engine": {"podSecurity": "privileged"}},
        {"engine": {"podMonitor": {"labels": {"release": 1}}}},
        {"engine": {"podMonitor": {"labels": {"release": "kube prometheus"}}}},
        {"engine": {"podMonitor": {"labels": {"-release": "kps"}}}},
        {"engine": {"podMonitor": {"labels": {"rooftop.dev/servingtarget": "x"}}}},
        {"engine": {"podMonitor": {"selector": {}}}},
        {"operator": {"peering": {"lifetimeSeconds": 5}}},  # below kopf's renewal margin
        {"operator": {"peering": {"name": "Rooftop_HA"}}},  # not a Kubernetes name
        {"prometheusRule": {"enabled": "yes"}},
        {"prometheusRule": {"labels": {"release": 1}}},
        {"prometheusRule": {"alertLabels": {"severity": "page"}}},  # the rules set it
        {"prometheusRule": {"alertLabels": {"team.example.com/owner": "ml"}}},  # not a label
        {"prometheusRule": {"for": {"engineMetricsMissing": "soon"}}},
        {"prometheusRule": {"for": {"engineMetricsMissing": ""}}},
        {"prometheusRule": {"for": {"RooftopEngineMetricsMissing": "1m"}}},  # not the key
        {"prometheusRule": {"for": {"tpotErrorBudgetBurn": "1m"}}},  # held by its windows
    ],
)
def test_schema_rejects_bad_values(override: dict[str, Any]) -> None:
    assert list(validator().iter_errors({**values(), **override}))


def test_dashboard_values_exist_with_defaults() -> None:
    assert values()["dashboards"] == {
        "enabled": True, "label": "grafana_dashboard", "labelValue": "1", "annotations": {}
    }  # fmt: skip
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert set(schema["properties"]["dashboards"]["properties"]) == {
        "enabled", "label", "labelValue", "annotations"
    }  # fmt: skip


def test_every_value_is_documented_and_camel_case() -> None:
    """helm-docs style: each leaf key has a `# --` comment block right above it."""
    lines = (CHART / "values.yaml").read_text().splitlines()
    undocumented = []
    for i, line in enumerate(lines):
        match = KEY.match(line)
        if not match or line.lstrip().startswith("-"):
            continue
        indent, key, rest = match.groups()
        assert re.fullmatch(r"[a-z][a-zA-Z0-9]*", key), f"not camelCase: {key}"
        nested = not rest.strip() and i + 1 < len(lines) and lines[i + 1].startswith(indent + " ")
        if nested and key not in {"resources", "podSecurityContext", "securityContext"}:
            continue
        j = i - 1
        while (
            j >= 0 and lines[j].strip().startswith("#") and not lines[j].strip().startswith("# --")
        ):
            j -= 1
        if j < 0 or not lines[j].strip().startswith("# --"):
            undocumented.append(key)
    # Keys inside documented free-form maps (resources.requests...) are not values of ours.
    assert set(undocumented) <= {"requests", "limits", "cpu", "memory", "runAsNonRoot",
                                 "runAsUser", "runAsGroup", "fsGroup", "seccompProfile",
                                 "type", "allowPrivilegeEscalation", "readOnlyRootFilesystem",
                                 "capabilities", "drop"}, undocumented  # fmt: skip


def test_app_version_matches_the_package() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert chart["appVersion"] == project["version"]


def test_operator_image_is_non_root() -> None:
    dockerfile = (ROOT / "Containerfile").read_text()
    assert "FROM python:3.11-slim" in dockerfile
    assert re.search(r"^USER 10001", dockerfile, re.M)


# ---------------------------------------------------------------- rendering (helm)

HELM = find_binary("helm")
needs_helm = pytest.mark.skipif(HELM is None, reason="helm not built: make tools")


def render(*sets: str) -> list[dict[str, Any]]:
    args = [str(HELM), "template", "rt", str(CHART), "--namespace", "ops"]
    for s in sets:
        args += ["--set", s]
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


@needs_helm
def test_helm_lint() -> None:
    result = subprocess.run([str(HELM), "lint", str(CHART)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


@needs_helm
def test_cluster_scope_renders_cluster_role() -> None:
    docs = render()
    (role,) = by_kind(docs, "ClusterRole")
    (binding,) = by_kind(docs, "ClusterRoleBinding")
    assert not by_kind(docs, "Role")
    assert binding["subjects"][0] == {"kind": "ServiceAccount", "name": "rt-rooftop",
                                      "namespace": "ops"}  # fmt: skip
    resources = {r for rule in role["rules"] for r in rule["resources"]}
    assert {"servingtargets", "servingtargets/status", "deployments", "services", "podmonitors",
            "events", "pods", "namespaces", "customresourcedefinitions"} <= resources  # fmt: skip
    (deployment,) = by_kind(docs, "Deployment")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[0] == "operator" and "--all-namespaces" in args


@needs_helm
def test_rbac_is_least_privilege() -> None:
    for docs in (render(), render("rbac.scope=namespace"), render("replicaCount=2"),
                 render("replicaCount=2", "rbac.scope=namespace")):  # fmt: skip
        for role in by_kind(docs, "ClusterRole") + by_kind(docs, "Role"):
            for rule in role["rules"]:
                assert "*" not in rule["verbs"] + rule["resources"] + rule["apiGroups"]
                # children go by GC; a mixed fleet's pool Deployment the plan no longer
                # has is the one thing the operator deletes itself
                if "delete" in rule["verbs"]:
                    assert (rule["apiGroups"], rule["resources"]) == (["apps"], ["deployments"])
                if rule["resources"] in (["pods"], ["namespaces"]):
                    assert set(rule["verbs"]) <= {"get", "list", "watch"}


@needs_helm
def test_namespace_scope_has_no_cluster_permissions() -> None:
    docs = render("rbac.scope=namespace", "operator.watchNamespaces={team-a,team-b}")
    assert not by_kind(docs, "ClusterRole") and not by_kind(docs, "ClusterRoleBinding")
    assert sorted(r["metadata"]["namespace"] for r in by_kind(docs, "Role")) == ["team-a", "team-b"]
    assert len(by_kind(docs, "RoleBinding")) == 2
    (deployment,) = by_kind(docs, "Deployment")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--namespace=team-a" in args and "--all-namespaces" not in args


@needs_helm
def test_namespace_scope_defaults_to_the_release_namespace() -> None:
    (role,) = by_kind(render("rbac.scope=namespace"), "Role")
    assert role["metadata"]["namespace"] == "ops"


@needs_helm
def test_operator_pod_is_locked_down() -> None:
    (deployment,) = by_kind(render(), "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["resources"]["requests"] == {"cpu": "100m", "memory": "256Mi"}
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert pod["serviceAccountName"] == "rt-rooftop"


@needs_helm
def test_the_operator_needs_no_passwd_entry_for_its_uid() -> None:
    """uid 10001 has no passwd entry in the image; kopf names itself after the user
    unless POD_ID is set, and the lookup crashed the operator pod at start."""
    (deployment,) = by_kind(render(), "Deployment")
    env = {e["name"]: e for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["POD_ID"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert re.search(r"^ENV .*\bUSER=rooftop\b", (ROOT / "Containerfile").read_text(), re.M)


@needs_helm
def test_optional_resources() -> None:
    assert not by_kind(render(), "PodMonitor")
    (monitor,) = by_kind(render("metrics.podMonitor.enabled=true"), "PodMonitor")
    assert monitor["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"
    docs = render("metrics.enabled=false", "dashboards.enabled=false")
    assert not by_kind(docs, "Service") and not by_kind(docs, "ConfigMap")


@needs_helm
def test_operator_pod_monitor_keeps_the_targets_namespace() -> None:
    """The operator's per-target series carry `namespace` (the ServingTarget's): with
    honorLabels the Prometheus Operator's own `namespace` target label (the operator
    pod's) does not rename it to `exported_namespace`, which the dashboards' namespace
    variables and the PrometheusRule's joins would not find."""
    from rooftop_operator.metrics import TARGET_LABELS

    assert "namespace" in TARGET_LABELS
    (monitor,) = by_kind(render("metrics.podMonitor.enabled=true"), "PodMonitor")
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["honorLabels"] is True


@needs_helm
def test_one_resource_per_template_file() -> None:
    """Dashed file names, one kind each (role/rolebinding: one per watched namespace)."""
    for template in (CHART / "templates").glob("*.yaml"):
        assert re.fullmatch(r"[a-z]+(-[a-z]+)*\.yaml", template.name), template.name
        args = [
            str(HELM),
            "template",
            "rt",
            str(CHART),
            "--show-only",
            f"templates/{template.name}",
            "--set",
            "metrics.podMonitor.enabled=true",
            "--set",
            "replicaCount=2",
            "--set",
            "prometheusRule.enabled=true",
            "--set",
            "rbac.scope=namespace",
        ]
        if template.name.startswith("cluster"):
            args[-1] = "rbac.scope=cluster"
        out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
        kinds = {d["kind"] for d in yaml.safe_load_all(out) if d}
        assert len(kinds) == 1, (template.name, kinds)


@needs_helm
def test_loop_values_reach_the_operator_as_its_settings() -> None:
    """The chart's loop values become the environment LoopSettings reads."""

    docs = render("loop.prometheusUrl=http://prom.mon:9090", "loop.scaleDownWindowSeconds=600")
    (deployment,) = by_kind(docs, "Deployment")
    env = {
        e["name"]: e["value"]
        for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]
        if "value" in e  # POD_ID comes from the pod's name
    }
    settings = configured(read_settings(env)).loop
    assert settings.prometheus_url == "http://prom.mon:9090"
    assert settings.scale_down_window_s == 600.0
    # no chart-wide start-up: each target's own (rooftop_planner.lifecycle)
    assert (settings.interval_s, settings.window_s, settings.startup_s) == (15.0, 60.0, None)


def _env(docs: list[dict[str, Any]]) -> dict[str, str]:
    (deployment,) = by_kind(docs, "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e.get("value", "") for e in container["env"]}


def _node_rules(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for role in by_kind(docs, "ClusterRole") for r in role["rules"]
            if "nodes" in r["resources"]]  # fmt: skip


@needs_helm
def test_gpu_inventory_is_off_by_default_and_reads_no_nodes() -> None:
    docs = render()
    assert _env(docs)["ROOFTOP_GPU_INVENTORY"] == "off"
    assert not _node_rules(docs)


@needs_helm
def test_the_cluster_pricing_reaches_the_operator_as_it_reads_it() -> None:
    from rooftop_operator.settings import parse_default_pricing

    assert "ROOFTOP_DEFAULT_PRICING" not in _env(render())
    docs = render("operator.pricing.owned.l4.count=8", "operator.pricing.usdPerGpuHour.l4=2")
    pricing = parse_default_pricing(_env(docs)["ROOFTOP_DEFAULT_PRICING"])
    assert pricing.owned is not None and pricing.owned["l4"].count == 8
    assert pricing.usd_per_gpu_hour == {"l4": 2.0}


@needs_helm
def test_gpu_inventory_nodes_may_list_nodes_and_nothing_more() -> None:
    docs = render("operator.gpuInventory=nodes")
    assert _env(docs)["ROOFTOP_GPU_INVENTORY"] == "nodes"
    (rule,) = _node_rules(docs)
    assert rule == {"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]}


@needs_helm
@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (["operator.gpuInventory=nodes", "rbac.scope=namespace"], "use rbac.scope=cluster"),
        (["operator.gpuInventory=yes"], "value must be one of 'off', 'nodes'"),
    ],
)
def test_gpu_inventory_misconfigurations_fail_with_the_fix(sets: list[str], message: str) -> None:
    args = [str(HELM), "template", "rt", str(CHART)]
    for s in sets:
        args += ["--set", s]
    result = subprocess.run(args, capture_output=True, text=True)
    assert result.returncode != 0 and message in result.stderr, result.stderr


def _operator_container(docs: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    (deployment,) = by_kind(docs, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    return pod, pod["containers"][0]


@needs_helm
def test_prometheus_credentials_reach_the_operator_as_files_and_env() -> None:
    """A token Secret and a CA ConfigMap are mounted read-only and named in the
    environment the loop reads (ROOFTOP_PROMETHEUS_*); headers travel as JSON."""
    pod, container = _operator_container(render(
        "loop.prometheusAuth.bearerTokenSecret.name=prom-token",
        "loop.prometheusAuth.caConfigMap.name=prom-ca",
        "loop.prometheusAuth.headers.X-Scope-OrgID=team-a",
    ))  # fmt: skip
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    assert env["ROOFTOP_PROMETHEUS_BEARER_TOKEN_FILE"] == "/etc/rooftop/prometheus-token/token"
    assert env["ROOFTOP_PROMETHEUS_CA_FILE"] == "/etc/rooftop/prometheus-ca/ca.crt"
    assert json.loads(env["ROOFTOP_PROMETHEUS_HEADERS"]) == {"X-Scope-OrgID": "team-a"}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["prometheus-token"]["secret"] == {"secretName": "prom-token"}
    assert volumes["prometheus-ca"]["configMap"] == {"name": "prom-ca"}
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["prometheus-token"]["readOnly"] and mounts["prometheus-ca"]["readOnly"]


@needs_helm
def test_no_prometheus_credentials_by_default_and_a_plain_token_file() -> None:
    pod, container = _operator_container(render())
    assert not any(e["name"].startswith("ROOFTOP_PROMETHEUS_") and e["name"] !=
                   "ROOFTOP_PROMETHEUS_URL" for e in container["env"])  # fmt: skip
    assert [v["name"] for v in pod["volumes"]] == ["tmp"]
    sa_token = "/var/run/secrets/kubernetes.io/serviceaccount/token"
    _, container = _operator_container(render(f"loop.prometheusAuth.bearerTokenFile={sa_token}"))
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    assert env["ROOFTOP_PROMETHEUS_BEARER_TOKEN_FILE"] == sa_token


@needs_helm
def test_an_upgrade_reusing_older_values_still_renders() -> None:
    """`helm upgrade --reuse-values` (docs/operating.md's upgrade) keeps the old release's
    values, which lack keys this chart added, such as loop.prometheusAuth."""
    pod, container = _operator_container(render("loop.prometheusAuth=null"))
    assert [v["name"] for v in pod["volumes"]] == ["tmp"]
    assert "ROOFTOP_PROMETHEUS_URL" in {e["name"] for e in container["env"]}


@needs_helm
def test_engine_values_reach_the_operator_as_its_settings() -> None:
    """engine.podSecurity and engine.podMonitor.labels become the environment the
    operator's settings read, and parse there to what was asked for."""
    from rooftop_operator.engine_security import PodSecurity

    docs = render("engine.podSecurity=restricted", "engine.podMonitor.labels.release=kps",
                  "engine.podMonitor.labels.team\\.example\\.com/owner=ml")  # fmt: skip
    config = read_settings(_env(docs))
    assert config["engine_pod_security"] is PodSecurity.RESTRICTED
    assert config["pod_monitor_labels"] == {"release": "kps", "team.example.com/owner": "ml"}


@needs_helm
def test_engine_defaults_are_baseline_and_no_extra_labels() -> None:
    for docs in (render(), render("engine=null")):  # null: `--reuse-values` from an older chart
        env = _env(docs)
        assert env["ROOFTOP_ENGINE_POD_SECURITY"] == "baseline"
        assert "ROOFTOP_PODMONITOR_LABELS" not in env


@needs_helm
def test_engine_images_per_accelerator_family_reach_the_operator() -> None:
    """ROCm and TPU accelerators are planned only where the chart names their vLLM image;
    by default only the pinned CUDA image is configured."""
    from rooftop_operator.settings import VLLM_IMAGE

    default = configured(read_settings(_env(render())))
    assert default.engine_images() == {"cuda": VLLM_IMAGE}
    docs = render("operator.rocmImage=rocm/vllm:tested", "operator.tpuImage=vllm/vllm-tpu:x")
    families = configured(read_settings(_env(docs)))
    assert families.engine_images() == {
        "cuda": VLLM_IMAGE, "rocm": "rocm/vllm:tested", "tpu": "vllm/vllm-tpu:x"
    }  # fmt: skip
    arm = configured(read_settings(_env(render("operator.vllmArm64Image=m/vllm:arm"))))
    assert (default.vllm_arm64_image, arm.vllm_arm64_image) == ("", "m/vllm:arm")


def test_the_chart_deploys_the_vllm_version_the_tests_run() -> None:
    """One version everywhere: the chart's default image, the operator's default and the
    CPU build tests/engine/install-vllm.sh installs for the real-engine tests."""
    from rooftop_operator.settings import VLLM_IMAGE, VLLM_VERSION

    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["operator"]["vllmImage"] == VLLM_IMAGE == f"vllm/vllm-openai:v{VLLM_VERSION}"
    script = (ROOT / "tests" / "engine" / "install-vllm.sh").read_text()
    assert re.search(rf"^VLLM_VERSION={re.escape(VLLM_VERSION)}$", script, re.M)


# ---------------------------------------------------------------- high availability (peering)

PEERING_KINDS = ("ClusterKopfPeering", "KopfPeering")


def _peering_rules(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    roles = by_kind(docs, "ClusterRole") + by_kind(docs, "Role")
    return [r for role in roles for r in role["rules"] if r["apiGroups"] == ["kopf.dev"]]


def _operator_config(docs: list[dict[str, Any]]) -> Any:
    """The OperatorConfig the operator builds from the Deployment's arguments."""
    from rooftop_operator import __main__ as main_mod

    _, container = _operator_container(docs)
    assert container["command"] == ["rooftop"] and container["args"][0] == "operator"
    parser = argparse.ArgumentParser()
    main_mod.add_arguments(parser)
    return main_mod.config_from_args(parser.parse_args(container["args"][1:]))


@needs_helm
def test_one_replica_runs_standalone() -> None:
    docs = render()
    assert not [d for d in docs if d["kind"] in PEERING_KINDS]
    assert not _peering_rules(docs) and not by_kind(docs, "PodDisruptionBudget")
    (deployment,) = by_kind(docs, "Deployment")
    assert deployment["spec"]["strategy"]["type"] == "Recreate"
    assert "affinity" not in deployment["spec"]["template"]["spec"]
    assert _operator_config(docs).peering is None


@needs_helm
def test_two_replicas_peer_cluster_wide() -> None:
    """All namespaces watched: kopf peers through a ClusterKopfPeering, which kopf never
    creates itself, so the chart does; the ServiceAccount may watch and patch just those."""
    docs = render("replicaCount=2")
    (peering,) = by_kind(docs, "ClusterKopfPeering")
    assert (peering["apiVersion"], peering["metadata"]["name"]) == ("kopf.dev/v1", "rooftop")
    assert not by_kind(docs, "KopfPeering")
    assert _peering_rules(docs) == [{"apiGroups": ["kopf.dev"],
                                     "resources": ["clusterkopfpeerings"],
                                     "verbs": ["get", "list", "watch", "patch"]}]  # fmt: skip
    config = _operator_config(docs)
    assert (config.clusterwide, config.peering, config.peering_lifetime_s) == (True, "rooftop", 20)
    (deployment,) = by_kind(docs, "Deployment")
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"]["type"] == "RollingUpdate"
    (pdb,) = by_kind(docs, "PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"] == deployment["spec"]["selector"]
    anti = deployment["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    (term,) = anti["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"


@needs_helm
def test_two_replicas_peer_in_each_watched_namespace() -> None:
    """Listed namespaces: kopf peers in each of them (a KopfPeering there), and the
    namespace-scoped install grants that in each namespace's Role."""
    watched = "operator.watchNamespaces={team-a,team-b}"
    docs = render("replicaCount=2", "rbac.scope=namespace", watched, "operator.peering.name=ha")
    assert not by_kind(docs, "ClusterKopfPeering") and not by_kind(docs, "ClusterRole")
    peerings = by_kind(docs, "KopfPeering")
    assert sorted((p["metadata"]["namespace"], p["metadata"]["name"]) for p in peerings) == [
        ("team-a", "ha"), ("team-b", "ha")
    ]  # fmt: skip
    assert _peering_rules(docs) == 2 * [{"apiGroups": ["kopf.dev"], "resources": ["kopfpeerings"],
                                         "verbs": ["get", "list", "watch", "patch"]}]  # fmt: skip
    config = _operator_config(docs)
    assert (config.namespaces, config.clusterwide, config.peering) == (
        ("team-a", "team-b"), False, "ha"
    )  # fmt: skip
    # cluster scope watching listed namespaces peers the same way
    cluster = render("replicaCount=2", "operator.watchNamespaces={team-a}")
    assert [p["metadata"]["namespace"] for p in by_kind(cluster, "KopfPeering")] == ["team-a"]
    assert [r["resources"] for r in _peering_rules(cluster)] == [["kopfpeerings"]]


@needs_helm
def test_peering_on_one_replica_and_its_lifetime() -> None:
    docs = render("operator.peering.enabled=true", "operator.peering.lifetimeSeconds=15")
    assert by_kind(docs, "ClusterKopfPeering") and not by_kind(docs, "PodDisruptionBudget")
    assert _operator_config(docs).peering_lifetime_s == 15
    # `helm upgrade --reuse-values` from a chart without these values
    assert _operator_config(render("replicaCount=2", "operator.peering=null")).peering == "rooftop"


def test_peering_crds_are_the_ones_kopf_watches() -> None:
    """The chart's crds/ carry kopf's peering CRDs under the group, version and plural
    this kopf looks for (read from kopf's own, private, selectors; it also reads the
    pre-1.0 zalando.org group, which we do not ship), with the status kopf writes its
    keep-alives into kept whole."""
    from kopf._cogs.structs import references

    wanted = {references.CLUSTER_PEERINGS_K: "Cluster", references.NAMESPACED_PEERINGS_K:
              "Namespaced"}  # fmt: skip
    for selector, scope in wanted.items():
        plural, group = selector.any_name, selector.group
        crd = yaml.safe_load((CHART / "crds" / f"{plural}.{group}.yaml").read_text())
        assert crd["metadata"]["name"] == f"{plural}.{group}"
        assert (crd["spec"]["group"], crd["spec"]["scope"]) == (group, scope)
        assert crd["spec"]["names"]["plural"] == plural
        (version,) = crd["spec"]["versions"]
        assert version["name"] == selector.version and version["served"] and version["storage"]
        status = version["schema"]["openAPIV3Schema"]["properties"]["status"]
        assert status == {"type": "object", "x-kubernetes-preserve-unknown-fields": True}


# ---------------------------------------------------------------- NOTES.txt

PODMONITOR_API = "monitoring.coreos.com/v1/PodMonitor"


def notes(*sets: str, api_versions: tuple[str, ...] = ()) -> str:
    """NOTES.txt as `helm install` prints it. `helm template` does not render NOTES (and
    `helm install --dry-run` wants a cluster), so a copy of the chart renders it as a
    template of its own (`api_versions`: the APIs the cluster would offer)."""
    with tempfile.TemporaryDirectory() as tmp:
        chart = Path(tmp) / "rooftop"
        shutil.copytree(CHART, chart)
        text = (chart / "templates" / "NOTES.txt").read_text()
        (chart / "templates" / "notes-render.yaml").write_text(
            '{{- define "notes" }}' + text + '{{- end }}\nnotes: {{ include "notes" . | toJson }}\n'
        )
        args = [str(HELM), "template", "rt", str(chart), "--namespace", "ops",
                "--show-only", "templates/notes-render.yaml"]  # fmt: skip
        for s in sets:
            args += ["--set", s]
        for api in api_versions:
            args += ["--api-versions", api]
        out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    rendered: str = yaml.safe_load(out)["notes"]
    return rendered


@needs_helm
def test_notes_warn_when_the_engine_pod_monitors_carry_no_selector_label() -> None:
    """With the Prometheus Operator present and engine.podMonitor.labels empty, a default
    kube-prometheus-stack will not select the engine PodMonitors: the notes say so, name
    the value and print the command that sets it."""
    for text in (notes(api_versions=(PODMONITOR_API,)), notes("metrics.podMonitor.enabled=true")):
        assert "PodMonitor (engine.podMonitor.labels): none" in text
        assert "WARNING: engine.podMonitor.labels is empty" in text
        assert "the\nfeedback loop will see no metrics" in text
        assert "--set engine.podMonitor.labels.release=<your kube-prometheus-stack release>" in text
    # the operator's own PodMonitor already names the label: the engines get the same
    text = notes("metrics.podMonitor.enabled=true", "metrics.podMonitor.labels.release=kps")
    assert "--reuse-values --set engine.podMonitor.labels.release=kps" in text


@needs_helm
def test_notes_print_the_engine_pod_monitor_labels() -> None:
    text = notes("metrics.podMonitor.enabled=true", "engine.podMonitor.labels.release=kps",
                 "engine.podMonitor.labels.team\\.example\\.com/owner=ml",
                 api_versions=(PODMONITOR_API,))  # fmt: skip
    assert "(engine.podMonitor.labels): release=kps, team.example.com/owner=ml" in text
    assert "WARNING" not in text
    # no sign of the Prometheus Operator: the value, and no warning
    text = notes()
    assert "(engine.podMonitor.labels): none" in text and "WARNING" not in text
    # `--reuse-values` from a chart without these values
    assert "(engine.podMonitor.labels): none" in notes("engine=null", "prometheusRule=null")


@needs_helm
def test_notes_name_the_rule_and_its_selector_labels() -> None:
    text = notes("prometheusRule.enabled=true", "engine.podMonitor.labels.release=kps")
    assert "PrometheusRule rt-rooftop" in text
    assert "set prometheusRule.labels.release" in text
    text = notes("prometheusRule.enabled=true", "prometheusRule.labels.release=kps",
                 "engine.podMonitor.labels.release=kps")  # fmt: skip
    assert "(prometheusRule.labels): release=kps" in text and "WARNING" not in text
