"""The command outputs and planner figures the user docs quote are what the code prints.

A planner change that moves a figure fails here until the doc is re-run: the README's
worked example (``rooftop plan ... --explain``, whole), docs/planner.md's ``--explain``
excerpt and the engine figures its prose quotes, and docs/operating.md's plan for the
nodes a cluster has.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import replace
from pathlib import Path

import pytest
from cli_process import ROOT, run_rooftop
from tests.cluster.nodes import default_nodes

from rooftop_planner.batching import predict_continuous
from rooftop_planner.catalog import load_catalog
from rooftop_planner.efficiency import load_efficiency
from rooftop_planner.scenarios import Scenario, default_limits, scenario_from_row

README = ROOT / "README.md"
PLANNER_DOC = ROOT / "docs" / "planner.md"
OPERATING_DOC = ROOT / "docs" / "operating.md"


def quoted_session(doc: Path, command_start: str) -> tuple[list[str], list[str]]:
    """The ``$ <command_start>...`` line of a fenced block: the command's arguments (a
    trailing backslash continues it) and the output lines up to the next ``$`` line."""
    for block in re.findall(r"```[a-z]*\n(.*?)```", doc.read_text(), flags=re.S):
        lines = block.rstrip("\n").split("\n")
        starts = [i for i, line in enumerate(lines) if line.startswith("$ " + command_start)]
        if not starts:
            continue
        command, rest = lines[starts[0]][2:], lines[starts[0] + 1 :]
        while command.endswith("\\"):
            command = command[:-1] + rest.pop(0).strip()
        ends = [i for i, line in enumerate(rest) if line.startswith("$ ")]
        return shlex.split(command), rest[: ends[0]] if ends else rest
    raise AssertionError(f"{doc.name} quotes no `$ {command_start}` session")


def run_quoted(argv: list[str], cwd: Path = ROOT, exit_code: int = 0) -> list[str]:
    """The command's stdout lines (``exit_code``: the one it must exit with)."""
    assert argv[0] == "rooftop", argv
    done = run_rooftop(*argv[1:], cwd=cwd)
    assert done.returncode == exit_code, done.stderr
    return done.stdout.rstrip("\n").split("\n")


def test_readme_worked_example_is_the_plan_it_prints() -> None:
    argv, quoted = quoted_session(README, "rooftop plan examples/")
    assert run_quoted(argv) == quoted, (
        f"re-run `{shlex.join(argv)}` and paste its output into README.md's worked example"
    )


def test_planner_doc_explain_excerpt_is_the_explanation_it_prints() -> None:
    argv, quoted = quoted_session(PLANNER_DOC, "rooftop predict ")
    assert quoted[0] == "...", "the excerpt starts with '...' for the table it leaves out"
    excerpt = quoted[1:]
    printed = run_quoted([*argv, "-o", "table"])
    assert printed[-len(excerpt) :] == excerpt, (
        f"re-run `{shlex.join(argv)}` and paste its explanation into docs/planner.md"
    )


def write_l4_only_target(folder: Path) -> None:
    """sim-chat-l4.yaml, as docs/operating.md makes it: examples/simulated-chat.yaml
    restricted to ``gpuTypes: [l4]``."""
    example = (ROOT / "examples" / "simulated-chat.yaml").read_text()
    l4_only = example.replace("gpuTypes: [l4, a100-80gb, h100-sxm]", "gpuTypes: [l4]")
    assert l4_only != example, "examples/simulated-chat.yaml's gpuTypes changed"
    (folder / "sim-chat-l4.yaml").write_text(l4_only)


def test_operating_doc_node_inventory_example_is_what_the_plan_prints(tmp_path: Path) -> None:
    """docs/operating.md's ``--nodes`` session, on the local control plane's fake fleet
    and examples/simulated-chat.yaml restricted to L4s, as the doc says it was made."""
    argv, quoted = quoted_session(OPERATING_DOC, "rooftop plan sim-chat-l4.yaml --nodes")
    nodes = {"apiVersion": "v1", "kind": "NodeList", "items": default_nodes()}
    (tmp_path / "nodes.json").write_text(json.dumps(nodes))
    write_l4_only_target(tmp_path)
    printed = run_quoted(argv, cwd=tmp_path, exit_code=1)  # 1: no feasible plan
    assert printed == quoted, (
        "re-run docs/operating.md's `rooftop plan sim-chat-l4.yaml --nodes nodes.json` "
        "session and paste its output there"
    )


def test_operating_doc_describe_excerpt_shows_the_plan_rooftop_plan_chooses(tmp_path: Path) -> None:
    """The Planned and Applied messages of the ``kubectl describe`` excerpt above it
    (captured on a cluster; the doc keeps its plan lines current) are today's plan."""
    _, quoted = quoted_session(OPERATING_DOC, "kubectl describe st sim-chat")
    write_l4_only_target(tmp_path)
    chosen = run_quoted(["rooftop", "plan", "sim-chat-l4.yaml"], cwd=tmp_path)[1]
    assert chosen.startswith("Chosen: "), chosen
    messages = [line.split("Message:", 1)[1].strip() for line in quoted if "Message:" in line]
    assert messages[0] == chosen.removeprefix("Chosen: ")
    shape = re.match(
        r"(\d+ replicas? of \d+x \S+ \(TP\d+\)), (\w+)/KV (\w+), max-num-seqs (\d+)", messages[0]
    )
    assert shape, messages[0]
    deployed, weights, kv, cap = shape.groups()
    assert messages[1].startswith(f"engine {deployed}, batch {cap}, {weights}/{kv}, ")


def scenario(engine: str, gpu: str, isl: int, osl: int, concurrency: int) -> Scenario:
    row = {"model": "llama-3.1-8b", "gpu": gpu, "tp": "1", "isl": str(isl),
           "osl": str(osl), "concurrency": str(concurrency), "engine": engine}  # fmt: skip
    return scenario_from_row(row, load_catalog(), load_efficiency())


@pytest.fixture(scope="module")
def planner_doc() -> str:
    return " ".join(PLANNER_DOC.read_text().split())  # prose wraps anywhere


def test_planner_doc_running_requests_under_each_engines_cache_rules(planner_doc: str) -> None:
    nim = scenario("nim", "a10g", 1024, 1024, 64).predict().batch
    vllm = scenario("vllm", "a10g", 1024, 1024, 64).predict().batch
    assert f"{nim:.1f} under NIM's rules, {vllm:.1f} under vLLM's" in planner_doc


def prefill_first_and_mixed_tpot_ms(isl: int, osl: int, clients: int) -> tuple[float, float]:
    """SGLang's default (a waiting prompt prefills before the next decode step) and the
    same kernels with the prompt's chunks carried in the decode steps, ms."""
    sglang = scenario("sglang", "h100", isl, osl, clients)
    limits = default_limits("sglang", sglang.deployment.gpu, clients)
    mixed = predict_continuous(sglang.deployment, clients, isl, osl,
                               replace(limits, mixed_prefill=True))  # fmt: skip
    return sglang.predict().tpot_s * 1e3, mixed.tpot_s * 1e3


def test_planner_doc_sglang_prefill_first_figures(planner_doc: str) -> None:
    first, mixed = prefill_first_and_mixed_tpot_ms(128, 128, 256)
    assert f"TPOT of {first:.1f} ms, {first / mixed:.2f}x" in planner_doc
    assert f"carried in the step ({mixed:.1f} ms)" in planner_doc
    first, mixed = prefill_first_and_mixed_tpot_ms(1000, 1000, 64)
    assert f"1,000/1,000 tokens, {first:.1f} ms, {first / mixed:.2f}x" in planner_doc


def test_operating_doc_owned_gpus_example_is_what_the_plan_prints() -> None:
    argv, quoted = quoted_session(OPERATING_DOC, "rooftop plan examples/owned-gpus.yaml")
    assert run_quoted(argv) == quoted, (
        "re-run `rooftop plan examples/owned-gpus.yaml` and paste its output into "
        "docs/operating.md's owned GPUs section"
    )


def test_operating_doc_mixed_fleet_example_is_what_the_plan_prints() -> None:
    argv, quoted = quoted_session(OPERATING_DOC, "rooftop plan examples/owned-a100s.yaml")
    assert run_quoted(argv) == quoted, (
        "re-run `rooftop plan examples/owned-a100s.yaml` and paste its output into "
        "docs/operating.md's mixed fleets section"
    )
