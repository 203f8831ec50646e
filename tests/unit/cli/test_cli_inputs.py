"""What ``rooftop`` reads: ``--version``, ``-`` for standard input, several manifests and
multi-document files (one result per target, the worst exit code), duplicate keys and
target names refused with the line or field named."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import yaml
from cli_process import ROOT, Rooftop

EXAMPLE = ROOT / "examples" / "chat-llama-3.1-8b.yaml"
SECOND = ROOT / "examples" / "llama-3.1-70b-budget.yaml"


def _poor() -> str:
    """The example with a budget no plan fits: infeasible, exit 1."""
    text = EXAMPLE.read_text().replace("usdPerHour: 12", "usdPerHour: 0.01")
    return text.replace("name: chat-llama-8b", "name: poor")


def _bad() -> str:
    """The example with a negative TPOT SLO: bad input, exit 2."""
    return (
        EXAMPLE.read_text()
        .replace("tpotMs: 25", "tpotMs: -1")
        .replace("name: chat-llama-8b", "name: bad")
    )


def test_version_is_the_package_version(rooftop: Rooftop) -> None:
    done = rooftop("--version")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert done.returncode == 0 and done.stdout.strip() == f"rooftop {project['version']}"


def test_plan_reads_standard_input(rooftop: Rooftop) -> None:
    done = rooftop("plan", "-", "-o", "json", stdin=EXAMPLE.read_text())
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["source"] == "<stdin>" and data["feasible"] is True
    twice = rooftop("plan", "-", "-", stdin=EXAMPLE.read_text())
    assert twice.returncode == 2 and "can be given only once" in twice.stderr


def test_several_files_give_a_list_and_one_row_each(rooftop: Rooftop) -> None:
    done = rooftop("plan", str(EXAMPLE), str(SECOND), "-o", "json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert [d["source"] for d in data] == [str(EXAMPLE), str(SECOND)]
    rows = rooftop("plan", str(EXAMPLE), str(SECOND), "-o", "table").stdout.splitlines()[1:]
    assert [r.split()[0] for r in rows] == ["chat-llama-8b", yaml.safe_load(
        SECOND.read_text())["metadata"]["name"]]  # fmt: skip


def test_a_multi_document_file_is_one_target_per_document(rooftop: Rooftop, tmp_path: Path) -> None:
    bundle = tmp_path / "bundle.yaml"
    namespace = "apiVersion: v1\nkind: Namespace\nmetadata: {name: team}\n"
    bundle.write_text("---\n".join([namespace, EXAMPLE.read_text(), _poor()]))
    done = rooftop("plan", str(bundle), "-o", "json")
    assert done.returncode == 1, done.stderr  # the worst: one target has no plan
    data = json.loads(done.stdout)
    assert [(d["name"], d["feasible"]) for d in data] == [("chat-llama-8b", True), ("poor", False)]
    assert data[1]["source"] == f"{bundle} (document 3)"
    text = rooftop("plan", str(bundle)).stdout
    assert "ServingTarget chat-llama-8b" in text and "ServingTarget poor" in text


def test_the_exit_code_is_the_worst_of_the_targets(rooftop: Rooftop, tmp_path: Path) -> None:
    poor, bad = tmp_path / "poor.yaml", tmp_path / "bad.yaml"
    poor.write_text(_poor())
    bad.write_text(_bad())
    assert rooftop("plan", str(EXAMPLE), str(poor)).returncode == 1
    done = rooftop("plan", str(bad), str(EXAMPLE), str(poor), "-o", "table")
    assert done.returncode == 2
    assert f"{bad}: invalid ServingTarget" in done.stderr and "spec.slo.tpotMs" in done.stderr
    names = [r.split()[0] for r in done.stdout.splitlines()[1:]]
    assert names == ["chat-llama-8b", "poor"]  # the others still planned


def test_render_takes_several_targets_and_standard_input(rooftop: Rooftop, tmp_path: Path) -> None:
    poor = tmp_path / "poor.yaml"
    poor.write_text(_poor())
    done = rooftop("render", "-", str(poor), stdin=EXAMPLE.read_text())
    assert done.returncode == 1 and "no plan for poor" in done.stderr
    docs = [d for d in yaml.safe_load_all(done.stdout) if d]
    assert [d["kind"] for d in docs][:3] == ["ConfigMap", "Deployment", "Service"]
    two = rooftop("render", str(EXAMPLE), str(SECOND))
    assert two.returncode == 0, two.stderr
    deployments = [d for d in yaml.safe_load_all(two.stdout) if d and d["kind"] == "Deployment"]
    assert len(deployments) == 2


def test_a_duplicate_key_is_refused_with_its_line(rooftop: Rooftop, tmp_path: Path) -> None:
    lines = EXAMPLE.read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if line.strip().startswith("tpotMs:"))
    lines.insert(at + 1, lines[at].replace("25", "50"))
    path = tmp_path / "twice.yaml"
    path.write_text("\n".join(lines) + "\n")
    done = rooftop("plan", str(path))
    assert done.returncode == 2
    assert f"{path} line {at + 2}: duplicate key 'tpotMs'" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_key_that_overrides_a_yaml_merge_is_not_a_duplicate(
    rooftop: Rooftop, tmp_path: Path
) -> None:
    text = EXAMPLE.read_text().replace(
        "  budget:\n    usdPerHour: 12", "  budget: {<<: {usdPerHour: 3}, usdPerHour: 12}"
    )
    path = tmp_path / "merge.yaml"
    path.write_text(text)
    done = rooftop("plan", str(path), "-o", "json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["plan"]["usd_per_hour"] <= 12


def test_a_target_name_kubernetes_refuses_is_refused_with_the_fix(
    rooftop: Rooftop, tmp_path: Path
) -> None:
    path = tmp_path / "name.yaml"
    for name, fix in (("Chat_Llama", "chat-llama"), ("chat.llama", "chat-llama"),
                      ("a" * 57, "a" * 56)):  # fmt: skip
        path.write_text(EXAMPLE.read_text().replace("name: chat-llama-8b", f"name: {name}"))
        done = rooftop("plan", str(path))
        assert done.returncode == 2, name
        assert f"metadata.name: {name!r} is not a valid name" in done.stderr
        assert f"e.g. {fix!r}" in done.stderr and "Value error" not in done.stderr
    path.write_text(EXAMPLE.read_text().replace("name: chat-llama-8b", "name: a" + "b" * 55))
    assert rooftop("plan", str(path)).returncode == 0
