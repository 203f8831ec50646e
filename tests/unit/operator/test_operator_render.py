"""``rooftop render``: the operator's own objects for a target file, as YAML."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from rooftop_cli.main import main

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "chat-llama-3.1-8b.yaml"


def render(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[Any], str]:
    code = main(["render", *argv])
    out, err = capsys.readouterr()
    docs = [d for d in yaml.safe_load_all(out) if d] if code == 0 else []
    return code, docs, err


def test_render_prints_every_child_the_operator_applies(capsys: pytest.CaptureFixture[str]) -> None:
    code, docs, _ = render(capsys, str(EXAMPLE), "--namespace", "team-a")
    assert code == 0
    kinds = [d["kind"] for d in docs]
    assert kinds == ["ConfigMap", "Deployment", "Service", "PodDisruptionBudget", "PodMonitor"]
    assert {d["metadata"]["namespace"] for d in docs} == {"team-a"}
    engine = docs[1]["spec"]["template"]["spec"]["containers"][0]
    assert engine["command"] == ["vllm", "serve"]
    assert engine["args"][0] == "meta-llama/Llama-3.1-8B-Instruct"
    assert engine["image"] == "vllm/vllm-openai:v0.32.0"


def test_a_mixed_fleet_renders_one_deployment_per_pool(capsys: pytest.CaptureFixture[str]) -> None:
    """Four owned A100s beside one on-demand GH200 cost less than six A100s: two pool
    Deployments, each pinned to its GPU type, share one Service."""
    code, docs, _ = render(capsys, str(ROOT / "examples" / "owned-a100s.yaml"))
    assert code == 0
    kinds = [d["kind"] for d in docs]
    assert kinds == ["ConfigMap", "Deployment", "Deployment", "Service", "PodDisruptionBudget",
                     "PodMonitor"]  # fmt: skip
    pools = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Deployment"}
    assert set(pools) == {"chat-owned-a100-engine-a100-80gb", "chat-owned-a100-engine-gh200"}
    for name, deployment in pools.items():
        gpu = name.removeprefix("chat-owned-a100-engine-")
        assert deployment["spec"]["selector"]["matchLabels"]["rooftop.dev/pool"] == gpu
        pod = deployment["spec"]["template"]["spec"]
        assert pod["nodeSelector"]["nvidia.com/gpu.product"] != ""
    selectors = {tuple(sorted(d["spec"]["template"]["spec"]["nodeSelector"].items()))
                 for d in pools.values()}  # fmt: skip
    assert len(selectors) == 2


def test_without_the_prometheus_operator_pods_carry_scrape_annotations(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, docs, _ = render(capsys, str(EXAMPLE), "--no-pod-monitor")
    assert code == 0 and "PodMonitor" not in [d["kind"] for d in docs]
    annotations = docs[1]["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"


def test_image_flags_pick_the_engine_image(capsys: pytest.CaptureFixture[str]) -> None:
    code, docs, _ = render(capsys, str(EXAMPLE), "--vllm-image", "mirror.local/vllm:0.32.0")
    assert code == 0
    assert docs[1]["spec"]["template"]["spec"]["containers"][0]["image"] == (
        "mirror.local/vllm:0.32.0"
    )


def test_bad_input_exits_2_naming_the_problem(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, _, err = render(capsys, str(tmp_path / "missing.yaml"))
    assert code == 2 and "missing.yaml" in err
    bad = tmp_path / "bad.yaml"
    text = EXAMPLE.read_text().replace("tpotMs: 25", "tpotMs: -1")
    bad.write_text(text)
    code, _, err = render(capsys, str(bad))
    assert code == 2 and "tpotMs" in err


def test_a_target_no_plan_serves_exits_1_with_the_reason(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    poor = tmp_path / "poor.yaml"
    poor.write_text(EXAMPLE.read_text().replace("usdPerHour: 12", "usdPerHour: 0.01"))
    code, _, err = render(capsys, str(poor))
    assert code == 1 and "no plan" in err and "over budget" in err
