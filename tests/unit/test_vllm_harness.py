"""The real-vLLM harness's pure parts: a pod's command as a local process on the pod's
address (tests/cluster/vllm_engines.py, tests/cluster/engines.py).

The e2e test runs them once against one pod; these pin the rules on hand-made pods.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tests.cluster.engines import pod_endpoint
from tests.cluster.vllm_engines import (
    HostPaths,
    host_path,
    local_command,
    volume_dirs,
    with_flag,
)

ARGS = ["/models/tiny", "--served-model-name", "tiny", "--max-num-seqs", "8", "--port", "8000"]


def pod(args: list[str] = ARGS, env: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    container = {
        "name": "engine",
        "command": ["vllm", "serve"],
        "args": args,
        "env": env or [{"name": "HF_HOME", "value": "/cache/hf"}, {"name": "X", "value": "1"}],
        "ports": [{"name": "http", "containerPort": 8000}],
        "volumeMounts": [
            {"name": "model-files", "mountPath": "/models", "readOnly": True},
            {"name": "cache", "mountPath": "/cache"},
            {"name": "token", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"},
        ],
    }
    volumes = [
        {"name": "model-files", "persistentVolumeClaim": {"claimName": "models"}},
        {"name": "cache", "emptyDir": {}},
        {"name": "token", "projected": {"sources": []}},
    ]
    labels = {"app.kubernetes.io/name": "rooftop-engine", "rooftop.dev/servingtarget": "t"}
    return {
        "metadata": {"name": "t-engine-1", "namespace": "ns", "labels": labels},
        "spec": {"nodeName": "l4-0", "containers": [container], "volumes": volumes},
    }


def test_the_pods_command_runs_with_only_paths_and_host_changed(tmp_path: Path) -> None:
    paths = HostPaths(claims={"models": tmp_path / "pvc"}, scratch=tmp_path / "pods")
    vllm = tmp_path / "venv" / "bin" / "vllm"
    argv, env = local_command(pod(), vllm, "127.244.0.9", paths)
    assert argv == [str(vllm), "serve", str(tmp_path / "pvc" / "tiny"),
                    "--served-model-name", "tiny", "--max-num-seqs", "8",
                    "--port", "8000", "--host", "127.244.0.9"]  # fmt: skip
    assert env["HF_HOME"] == str(tmp_path / "pods" / "t-engine-1" / "volumes" / "cache" / "hf")
    assert env["X"] == "1"
    assert env["HOME"] == str(tmp_path / "pods" / "t-engine-1" / "home")
    assert env["PATH"].split(":")[0] == str(vllm.parent)


def test_a_claim_without_a_host_directory_or_another_command_is_refused(tmp_path: Path) -> None:
    paths = HostPaths(claims={}, scratch=tmp_path)
    with pytest.raises(ValueError, match="no host directory for PVC models"):
        local_command(pod(), tmp_path / "vllm", "127.0.0.1", paths)
    sim = pod()
    sim["spec"]["containers"][0]["command"] = ["rooftop", "engine-sim"]
    with pytest.raises(ValueError, match="does not run vllm"):
        local_command(sim, tmp_path / "vllm", "h", HostPaths({"models": tmp_path}, tmp_path))


def test_env_from_a_secret_is_refused(tmp_path: Path) -> None:
    secret = [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]
    with pytest.raises(ValueError, match="HF_TOKEN is not a plain value"):
        local_command(
            pod(env=secret), tmp_path / "vllm", "h", HostPaths({"models": tmp_path}, tmp_path)
        )


def test_host_path_maps_only_whole_mount_prefixes() -> None:
    mounts = {"/models": Path("/h/m"), "/models/big": Path("/h/b")}
    assert host_path("/models/x", mounts) == "/h/m/x"
    assert host_path("/models/big/y", mounts) == "/h/b/y"  # the longest mount wins
    assert host_path("/modelsx", mounts) == "/modelsx"
    assert host_path("tiny", mounts) == "tiny"


def test_with_flag_replaces_either_spelling_or_appends() -> None:
    assert with_flag(["--port", "1"], "--port", "2") == ["--port", "2"]
    assert with_flag(["--port=1"], "--port", "2") == ["--port=2"]
    assert with_flag(["a"], "--host", "h") == ["a", "--host", "h"]


def test_a_pods_process_listens_on_its_ip_and_named_port() -> None:
    """Where a Prometheus that discovers the pod scrapes it (its PodMonitor's port)."""
    running = pod()
    running["status"] = {"podIP": "127.244.0.7"}
    assert pod_endpoint(running, "http") == ("127.244.0.7", 8000)
    with pytest.raises(ValueError, match="no port named metrics"):
        pod_endpoint(running, "metrics")
    with pytest.raises(ValueError, match="has no IP yet"):
        pod_endpoint(pod(), "http")  # not given one yet


def test_a_config_map_volume_holds_its_keys_as_files(tmp_path: Path) -> None:
    """The kubelet writes each key of a mounted ConfigMap as a file (the drain
    middleware vLLM pods import); a ConfigMap the harness was not given is refused."""
    p = pod()
    p["spec"]["volumes"].append({"name": "drain", "configMap": {"name": "t-engine"}})
    p["spec"]["containers"][0]["volumeMounts"].append({"name": "drain", "mountPath": "/opt/r"})
    data = {"t-engine": {"rooftop_drain.py": "x = 1\n"}}
    paths = HostPaths({"models": tmp_path}, tmp_path / "pods", config_maps=data)
    mounts = volume_dirs(p, paths)
    assert (mounts["/opt/r"] / "rooftop_drain.py").read_text() == "x = 1\n"
    with pytest.raises(ValueError, match="no data for ConfigMap t-engine"):
        volume_dirs(p, HostPaths({"models": tmp_path}, tmp_path / "other"))
