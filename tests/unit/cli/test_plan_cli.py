from __future__ import annotations

import csv
import importlib.util
import json
from pathlib import Path

import pytest

from rooftop_cli.main import main

EXAMPLES = sorted((Path(__file__).parents[3] / "examples").glob("*.yaml"))


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_every_example_plans(example: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(example), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["feasible"] and data["plan"]["replicas"] >= 1


def test_plot_is_written(tmp_path: Path) -> None:
    out = tmp_path / "plane.png"
    assert main(["plan", str(EXAMPLES[0]), "--plot", str(out)]) == 0
    assert out.read_bytes()[:4] == b"\x89PNG"


BASE = """apiVersion: rooftop.dev/v1alpha1
kind: ServingTarget
metadata: {name: x}
spec:
  model: llama-3-8b
  slo: {tpotMs: 20}
  workload: {requestsPerSecond: 1, promptTokens: {mean: 10}, outputTokens: {mean: 10}}
  budget: {usdPerHour: 5}
"""


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("spec: [", "malformed YAML"),
        ("apiVersion: v1\nkind: Pod\n", "expected apiVersion: rooftop.dev/v1alpha1"),
        (
            """apiVersion: rooftop.dev/v1alpha1
kind: ServingTarget
metadata: {name: x}
spec:
  model: llama-3-8b
  slo: {tpotMs: 20}
  workload: {requestsPerSecond: -1, promptTokens: {mean: 10}, outputTokens: {mean: 10}}
  budget: {usdPerHour: 5}
""",
            "spec.workload.requestsPerSecond",
        ),
        (
            """apiVersion: rooftop.dev/v1alpha1
kind: ServingTarget
metadata: {name: x}
spec:
  model: not-a-model
  slo: {tpotMs: 20}
  workload: {requestsPerSecond: 1, promptTokens: {mean: 10}, outputTokens: {mean: 10}}
  budget: {usdPerHour: 5}
""",
            "unknown model 'not-a-model'",
        ),
        (
            """apiVersion: rooftop.dev/v1alpha1
kind: ServingTarget
metadata: {name: x}
spec:
  model: llama-3-8b
  slo: {tpotMs: 20, tpotPercentil: p90}
  workload: {requestsPerSecond: 1, promptTokens: {mean: 10}, outputTokens: {mean: 10}}
  budget: {usdPerHour: 5}
""",
            "spec.slo.tpotPercentil: unknown field",
        ),
        (BASE.replace("tpotMs: 20", "tpotMs: .nan"), "spec.slo.tpotMs: Input should be a finite"),
        (
            BASE + "  pricing: {usdPerGpuHour: {l4: .inf}}\n",
            "spec.pricing.usdPerGpuHour.l4: Input should be a finite number",
        ),
        (
            BASE.replace(
                "promptTokens: {mean: 10}",
                "promptTokens: {histogram: [{tokens: 9, weight: 1.0e+308}]}",
            ),
            "spec.workload.promptTokens.histogram.0.weight: Input should be less than or equal",
        ),
    ],
)
def test_bad_manifests_exit_2_with_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, expected: str
) -> None:
    path = tmp_path / "t.yaml"
    path.write_text(text)
    assert main(["plan", str(path)]) == 2
    err = capsys.readouterr().err
    assert expected in err and "Traceback" not in err


def test_binary_files_exit_2_naming_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    junk = tmp_path / "junk"
    junk.write_bytes(b"\x7fELF\x02\x01\x01\x00\xff\xfe" * 20)
    assert main(["plan", str(junk)]) == 2
    assert f"{junk}: not a UTF-8 text file" in capsys.readouterr().err
    assert main(["predict", "--csv", str(junk)]) == 2
    assert f"{junk}: not a UTF-8 text CSV" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("name", "needle"),
    [("plane.txt", "must end in one of .png"), ("nowhere/plane.png", "does not exist")],
)
def test_a_plot_that_cannot_be_written_exits_2_before_planning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, needle: str
) -> None:
    assert main(["plan", str(EXAMPLES[0]), "--plot", str(tmp_path / name)]) == 2
    assert needle in capsys.readouterr().err


@pytest.mark.parametrize("command", ["plan", "simulate"])
def test_plotting_without_matplotlib_names_the_extra(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    command: str,
) -> None:
    """matplotlib is the optional ``plot`` extra (the operator image has none): --plot
    without it is bad input, said before any work, with the install line."""
    real = importlib.util.find_spec

    def without_matplotlib(name: str, package: str | None = None) -> object:
        return None if name == "matplotlib" else real(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", without_matplotlib)
    args = [command, str(EXAMPLES[0]), "--plot", str(tmp_path / "plane.png")]
    if command == "simulate":
        args += ["--trace", str(tmp_path / "never-read.csv")]
    assert main(args) == 2
    assert "pip install 'rooftop[plot]'" in capsys.readouterr().err
    assert not (tmp_path / "plane.png").exists()


def test_missing_file_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "/nonexistent/target.yaml"]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_predict_csv_fills_errors_per_row(tmp_path: Path) -> None:
    src = tmp_path / "in.csv"
    src.write_text(
        "model,gpu,tp,weight_dtype,kv_dtype,isl,osl,concurrency,batch,engine\n"
        "Llama-3.1-8B-Instruct,H100 80GB HBM3,1,bf16,auto,1000,200,16,,vllm\n"
        "llama-2-70b,A100-SXM4-80GB,4,fp16,auto,128,128,,8,trtllm\n"
        "gpt-9,h100,1,bf16,auto,100,100,1,,\n"
        "llama-3-8b,h100,1,bf16,auto,-5,100,1,,\n"
        "llama-3-8b,h100,1,bf16,auto,100,100,,,\n"
        "llama-3-8b,h100,1,bf16,auto,100,100,4,,sglang\n"
    )
    out = tmp_path / "out.csv"
    assert main(["predict", "--csv", str(src), "--out", str(out)]) == 0
    rows = list(csv.DictReader(out.open()))
    assert len(rows) == 6
    assert float(rows[0]["tpot_ms"]) > 0 and rows[0]["fits"] == "true" and not rows[0]["error"]
    assert float(rows[1]["ttft_ms"]) > 0
    assert "unknown model" in rows[2]["error"] and not rows[2]["tpot_ms"]
    assert "isl" in rows[3]["error"]
    assert "concurrency/batch" in rows[4]["error"]
    assert float(rows[5]["output_tok_s"]) > 0


def test_predict_csv_missing_columns_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "in.csv"
    src.write_text("model,gpu\nx,y\n")
    assert main(["predict", "--csv", str(src)]) == 2
    assert "missing column(s)" in capsys.readouterr().err


def test_predict_csv_needs_only_columns_without_defaults(tmp_path: Path) -> None:
    """A file of continuous runs needs no batch column, nor dtype or engine columns:
    the rows then predict as the same flags left out would."""
    src = tmp_path / "in.csv"
    src.write_text("model,gpu,tp,isl,osl,concurrency\nllama-3.1-8b,h100-sxm,1,1000,200,16\n")
    out = tmp_path / "out.csv"
    assert main(["predict", "--csv", str(src), "--out", str(out)]) == 0
    (short,) = csv.DictReader(out.open())
    full = tmp_path / "full.csv"
    full.write_text("model,gpu,tp,weight_dtype,kv_dtype,isl,osl,concurrency,batch,engine\n"
                    "llama-3.1-8b,h100-sxm,1,bf16,auto,1000,200,16,,vllm\n")  # fmt: skip
    assert main(["predict", "--csv", str(full), "--out", str(out)]) == 0
    (explicit,) = csv.DictReader(out.open())
    assert not short["error"] and float(short["tpot_ms"]) > 0
    assert short["tpot_ms"] == explicit["tpot_ms"] and short["ttft_ms"] == explicit["ttft_ms"]


def test_predict_csv_without_concurrency_batch_or_rate_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "in.csv"
    src.write_text("model,gpu,tp,isl,osl\nllama-3.1-8b,h100-sxm,1,1000,200\n")
    assert main(["predict", "--csv", str(src)]) == 2
    assert "concurrency, batch or rate" in capsys.readouterr().err


def test_predict_says_when_a_full_kv_cache_evicts(capsys: pytest.CaptureFixture[str]) -> None:
    """64 clients of 1,000/1,000 tokens overfill Qwen3-32B's KV cache on one H100 (about
    23 fit): vLLM evicts and prefills again, and --explain says what that costs."""
    args = ["predict", "--model", "qwen3-32b", "--gpu", "h100-sxm", "--isl", "1000", "--osl",
            "1000"]  # fmt: skip
    assert main([*args, "--concurrency", "8"]) == 0
    assert json.loads(capsys.readouterr().out)["evictions"] == 0.0
    assert main([*args, "--concurrency", "64", "--explain"]) == 0
    out = capsys.readouterr().out
    data = json.loads(out[: out.rindex("}") + 1])
    assert data["evictions"] > 0.5 and "the KV cache is full" in out


def test_predict_one_scenario(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(["predict", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--concurrency", "8"]) == 0
    )
    data = json.loads(capsys.readouterr().out)
    assert 3 < float(data["tpot_ms"]) < 30


def row(**overrides: str) -> dict[str, str]:
    base = {
        "model": "llama-3.1-8b",
        "gpu": "h100-sxm",
        "tp": "1",
        "weight_dtype": "bf16",
        "kv_dtype": "auto",
        "isl": "1000",
        "osl": "500",
        "concurrency": "32",
        "batch": "",
    }
    return {**base, **overrides}  # fmt: skip


@pytest.mark.parametrize(
    "overrides",
    [{}, {"concurrency": "1"}, {"concurrency": "256"}, {"gpu": "a10g", "concurrency": "4"},
     {"model": "llama-3.1-70b", "tp": "4", "weight_dtype": "fp8", "kv_dtype": "fp8"},
     {"model": "mixtral-8x7b", "tp": "2"}, {"batch": "64", "concurrency": ""},
     {"gpu": "b200", "engine": "trtllm"}, {"gpu": "l40s", "engine": "sglang"}],
)  # fmt: skip
def test_no_prediction_is_below_its_physical_floor(overrides: dict[str, str]) -> None:
    from rooftop_cli.predict import predict_row

    out = predict_row(row(**overrides))
    floor, tpot = float(out["floor_ms"]), float(out["tpot_ms"])
    assert 0 < floor <= tpot and float(out["floor_share"]) == pytest.approx(floor / tpot, 1e-3)


@pytest.mark.parametrize(("overrides", "running"), [
    ({"concurrency": "8"}, 8.0),  # every client runs
    ({"gpu": "a100-80gb", "concurrency": "512"}, 256.0),  # vLLM's cap on A100s
])  # fmt: skip
def test_running_says_how_many_clients_decode_at_once(
    overrides: dict[str, str], running: float
) -> None:
    from rooftop_cli.predict import predict_row

    assert float(predict_row(row(**overrides))["running"]) == running


def test_running_is_what_the_kv_cache_holds_when_it_binds() -> None:
    """64 clients of 1,024/1,024 tokens on a 24 GB A10G: the cache holds about 20."""
    from rooftop_cli.predict import predict_row

    out = predict_row(row(gpu="a10g", concurrency="64", isl="1024", osl="1024"))
    assert 15 < float(out["running"]) < 25


def test_the_engine_picks_its_own_measured_curves() -> None:
    from rooftop_cli.predict import predict_row

    by_engine = {e: predict_row(row(engine=e)) for e in ("vllm", "sglang", "trtllm", "nim")}
    assert by_engine["vllm"]["curves"] == "vllm 0.24.0 kernels timed on h100_sxm"
    assert by_engine["sglang"]["curves"].startswith("sglang ")
    assert by_engine["nim"]["curves"] == by_engine["trtllm"]["curves"]  # NIM runs TRT-LLM
    # each engine's kernels give its own step times (TPOT alone may tie when rounded)
    timings = {
        (by_engine[e]["tpot_ms"], by_engine[e]["ttft_ms"]) for e in ("vllm", "sglang", "trtllm")
    }
    assert len(timings) == 3
    borrowed = predict_row(row(gpu="h100-nvl"))
    assert "borrowed" in borrowed["curves"] and "h100_sxm" in borrowed["curves"]


def test_predict_explain_names_where_the_step_goes(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["predict", "--model", "llama-3.1-70b", "--gpu", "h100-sxm", "--tp", "4"]
    assert main([*args, "--concurrency", "64", "--explain"]) == 0
    data = json.loads(capsys.readouterr().out)  # one JSON document, the explanation in it
    out = "\n".join(data["explanation"])
    for words in (
        "floor",
        "x the floor",
        "GEMMs",
        "attention",
        "all-reduces",
        "elementwise kernels",
        "fixed costs",
    ):
        assert words in out
    parts = [float(line.split()[0]) for line in out.splitlines() if line.endswith(
        ("LM head)", "prefill chunks)", "all-reduces", "writes)", "per-layer)"))]  # fmt: skip
    assert sum(parts) == pytest.approx(float(data["tpot_ms"]), rel=0.01)


def test_more_concurrency_raises_tpot_and_throughput() -> None:
    from rooftop_cli.predict import predict_row

    rows = [
        predict_row(
            {
                "model": "llama-3.1-8b",
                "gpu": "a100-80gb",
                "tp": "1",
                "weight_dtype": "bf16",
                "kv_dtype": "auto",
                "isl": "512",
                "osl": "256",
                "concurrency": str(c),
                "batch": "",
            }
        )
        for c in (1, 16, 64)
    ]
    tpots = [float(r["tpot_ms"]) for r in rows]
    tputs = [float(r["output_tok_s"]) for r in rows]
    assert tpots == sorted(tpots) and tputs == sorted(tputs)


def test_predict_refuses_a_tensor_parallel_group_wider_than_a_node(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """One engine pod holds the whole TP group and runs on one node (8 H100s in the
    catalog): TP 16 is not a deployment Rooftop could make, so no prediction for it."""
    args = ["predict", "--model", "llama-3.1-70b", "--gpu", "h100-sxm", "--concurrency", "8"]
    assert main([*args, "--tp", "16"]) == 2
    err = capsys.readouterr().err
    assert "tp: 16 exceeds the 8 h100-sxm GPUs one node holds" in err and "tp <= 8" in err
    assert main([*args, "--tp", "8"]) == 0


def test_plan_explain_names_the_curves_it_timed_with(capsys: pytest.CaptureFixture[str]) -> None:
    example = Path(__file__).parents[3] / "examples" / "llama-3.1-70b-budget.yaml"
    main(["plan", str(example), "--explain"])
    out = capsys.readouterr().out
    assert "  - step times from vllm " in out and " kernels timed on " in out
