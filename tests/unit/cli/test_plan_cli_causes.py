"""`rooftop plan` and `rooftop predict` as a platform engineer runs them: the first line
names the real cause and its fix, and a plan holds nothing the target did not ask for.

Each test runs the command in a fresh interpreter, exactly as a user types it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).parents[3]
CHAT = ROOT / "examples" / "chat-llama-3.1-8b.yaml"


def rooftop(*args: str) -> subprocess.CompletedProcess[str]:
    """``rooftop ARGS`` with this checkout's planner and operator on the path."""
    paths = [str(ROOT / "planner"), str(ROOT / "operator"), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
    return subprocess.run(
        [sys.executable, "-m", "rooftop_cli.main", *args],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=120,
    )  # fmt: skip


def target(tmp_path: Path, **spec: Any) -> Path:
    """A manifest: an 8B chat target with ``spec`` merged over it."""
    base: dict[str, Any] = {
        "model": "llama-3.1-8b",
        "slo": {"tpotMs": 25},
        "workload": {
            "requestsPerSecond": 1,
            "promptTokens": {"mean": 1000, "p90": 2000},
            "outputTokens": {"mean": 100, "p90": 200},
        },
        "budget": {"usdPerHour": 50},
    }
    doc = {"apiVersion": "rooftop.dev/v1alpha1", "kind": "ServingTarget",
           "metadata": {"name": "t"}, "spec": {**base, **spec}}  # fmt: skip
    path = tmp_path / "target.json"
    path.write_text(json.dumps(doc))
    return path


def headline(out: str) -> str:
    """The first reason under ``No feasible plan.``."""
    lines = out.splitlines()
    return lines[lines.index("No feasible plan.") + 1].removeprefix("  - ")


# ---------------------------------------------------------------- A: the real cause first


def test_an_int4_kv_cache_is_refused_naming_vllm_and_the_fix(tmp_path: Path) -> None:
    done = rooftop("plan", str(target(tmp_path, constraints={"kvDtypes": ["int4"]})))
    assert done.returncode == 2, done.stdout
    assert "kvDtypes [int4]: vLLM has no int4 KV cache; use auto or fp8" in done.stderr
    assert "at any cost" not in done.stdout + done.stderr


def test_one_shared_reason_is_the_headline(tmp_path: Path) -> None:
    """fp16 weights with a bf16 KV cache: every candidate is invalid for the same reason."""
    path = target(tmp_path, constraints={"weightDtypes": ["fp16"], "kvDtypes": ["bf16"]})
    done = rooftop("plan", str(path))
    assert done.returncode == 1
    assert headline(done.stdout) == (
        "no candidate can run: vLLM keeps a 16-bit KV cache in the model's dtype: kv bf16 "
        "needs weight dtype bf16 (use kvDtype auto)"
    )


def test_a_missing_checkpoint_is_the_headline(tmp_path: Path) -> None:
    path = target(tmp_path, model="mistral-7b", constraints={"weightDtypes": ["fp4"]})
    done = rooftop("plan", str(path))
    assert done.returncode == 1
    first = headline(done.stdout)
    assert first.startswith("no candidate can run: no fp4 checkpoint of mistral-7b is known")
    assert "spec.engine.checkpoints.fp4" in first


def test_prompts_beyond_the_models_context_are_the_headline(tmp_path: Path) -> None:
    lengths = {"requestsPerSecond": 1, "promptTokens": {"mean": 2_000_000},
               "outputTokens": {"mean": 100}}  # fmt: skip
    done = rooftop("plan", str(target(tmp_path, workload=lengths)), "--explain")
    assert done.returncode == 1
    assert headline(done.stdout).startswith(
        "prompts at the 90th percentile of the workload's lengths (2,000,000 tokens) exceed "
        "llama-3.1-8b's 131,072-token context; vLLM refuses such requests"
    )
    assert "relax the SLO" not in done.stdout


def test_prompt_plus_output_beyond_the_context_is_the_headline(tmp_path: Path) -> None:
    lengths = {"requestsPerSecond": 1, "promptTokens": {"mean": 100_000, "p90": 120_000},
               "outputTokens": {"mean": 10_000, "p90": 20_000}}  # fmt: skip
    done = rooftop("plan", str(target(tmp_path, workload=lengths)))
    assert done.returncode == 1
    assert headline(done.stdout).startswith(
        "prompts and answers at the 90th percentile of the workload's lengths (120,000 + "
        "20,000 tokens) exceed"
    )


def test_nodes_without_gpus_are_said_plainly(tmp_path: Path) -> None:
    cpu = [{"kind": "Node", "metadata": {"name": f"cpu-{i}", "labels": {}},
            "status": {"allocatable": {"cpu": "8"}}} for i in range(3)]  # fmt: skip
    nodes = tmp_path / "nodes.json"
    nodes.write_text(json.dumps({"kind": "List", "items": cpu}))
    done = rooftop("plan", str(CHAT), "--nodes", str(nodes))
    assert done.returncode == 1
    assert "offer no GPU nodes" not in done.stdout
    assert headline(done.stdout).startswith(
        "the cluster has no GPU nodes (3 schedulable nodes, none with a GPU resource); with "
        "nodes of 1 gh200 GPU(s) each, this would work"
    )


def test_predict_refuses_a_request_longer_than_the_context(tmp_path: Path) -> None:
    args = ("predict", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--concurrency", "1")
    done = rooftop(*args, "--isl", "300000")
    assert done.returncode == 2 and '"fits": "true"' not in done.stdout
    assert "300,256 tokens exceed llama-3.1-8b's 131,072-token context" in done.stderr
    rows = tmp_path / "in.csv"
    rows.write_text("model,gpu,tp,weight_dtype,kv_dtype,isl,osl,concurrency,batch\n"
                    "llama-3.1-8b,h100-sxm,1,bf16,auto,300000,256,1,\n"
                    "llama-3.1-8b,h100-sxm,1,bf16,auto,130000,1000,1,\n")  # fmt: skip
    done = rooftop("predict", "--csv", str(rows))
    assert done.returncode == 0
    too_long, fits = done.stdout.splitlines()[1:]
    assert ",false," in too_long and "131,072-token context" in too_long
    assert ",true," in fits


# ---------------------------------------------------------------- B: plans without surprises


def test_without_weight_dtypes_only_16_bit_weights_are_planned() -> None:
    done = rooftop("plan", str(CHAT), "--json")
    data = json.loads(done.stdout)
    shapes = [data["plan"], *data["alternatives"], *data["frontier"]]
    assert {p["weight_dtype"] for p in shapes} == {"bf16"}


def test_a_chosen_quantized_dtype_says_outputs_differ(tmp_path: Path) -> None:
    path = target(tmp_path, constraints={"gpuTypes": ["l4"], "weightDtypes": ["fp8"]})
    done = rooftop("plan", str(path))
    assert done.returncode == 0
    assert re.search(r"weights fp8( and KV fp8)?: outputs differ from bf16", done.stdout)


def test_alternatives_are_distinct_shapes() -> None:
    """Same GPU, TP, weights and cost, another KV dtype: one line, not two."""
    done = rooftop("plan", str(CHAT), "--explain")
    lines = done.stdout.splitlines()
    alternatives = lines[lines.index("Alternatives:") + 1 : lines.index(
        "Rejected, one example per reason:")]  # fmt: skip
    shapes = [re.sub(r"/KV \S+,", "", line.split(":")[0]) for line in alternatives]
    assert len(shapes) == len(set(shapes)), alternatives
    assert any("/KV auto|fp8," in line for line in alternatives)
