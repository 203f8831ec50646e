"""Inputs as strict as the API server: a manifest's types as the CRD types them, the flag
values Kubernetes and the API accept, flag pairs one of which would be ignored refused,
JSON that is JSON alone, and tables that fit the terminal without cutting a cell."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from cli_process import ROOT, Rooftop, on_a_terminal

EXAMPLE = ROOT / "examples" / "chat-llama-3.1-8b.yaml"
PREDICT = ("predict", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--concurrency", "8")
ESCAPES = re.compile(r"\x1b\[[0-9;]*m")


def _target(tmp_path: Path, old: str, new: str) -> str:
    path = tmp_path / "target.yaml"
    text = EXAMPLE.read_text()
    assert old in text
    path.write_text(text.replace(old, new))
    return str(path)


def test_a_boolean_is_not_a_number(rooftop: Rooftop, tmp_path: Path) -> None:
    # kubectl apply refuses tpotMs: true; pydantic alone read it as a 1 ms SLO
    done = rooftop("plan", _target(tmp_path, "tpotMs: 25", "tpotMs: true"))
    assert done.returncode == 2, done.stdout
    assert "spec.slo.tpotMs: expected a number, got true (a boolean)" in done.stderr


def test_a_quoted_integer_is_not_an_integer(rooftop: Rooftop, tmp_path: Path) -> None:
    done = rooftop("plan", _target(tmp_path, "maxReplicas: 8", 'maxReplicas: "8"'))
    assert done.returncode == 2, done.stdout
    assert "spec.constraints.maxReplicas: expected an integer, got the string '8'" in done.stderr
    assert "write 8 without quotes" in done.stderr
    # what the API server takes, the CLI takes: 8.0 reaches it as 8, an int is a number
    whole = _target(tmp_path, "maxReplicas: 8", "maxReplicas: 8.0")
    assert rooftop("plan", whole).returncode == 0
    assert rooftop("plan", _target(tmp_path, "usdPerHour: 12", "usdPerHour: 12.5")).returncode == 0


def test_predict_kv_dtype_is_one_the_api_accepts(rooftop: Rooftop) -> None:
    done = rooftop(*PREDICT, "--kv-dtype", "int4")
    assert done.returncode == 2 and "argument --kv-dtype: invalid choice: 'int4'" in done.stderr
    assert rooftop(*PREDICT, "--kv-dtype", "fp8").returncode == 0


def test_render_namespace_is_a_dns_label(rooftop: Rooftop, tmp_path: Path) -> None:
    done = rooftop("render", "-n", "Bad_NS", str(EXAMPLE))
    assert done.returncode == 2 and done.stdout == ""
    assert "'Bad_NS' is not a valid namespace" in done.stderr and "'bad-ns'" in done.stderr
    in_file = rooftop("render", _target(tmp_path, "name: chat-llama-8b", "name: x\n  namespace: A"))
    assert in_file.returncode == 2 and "metadata.namespace: 'A' is not a valid" in in_file.stderr


def test_predict_csv_refuses_the_flags_of_one_scenario(rooftop: Rooftop, tmp_path: Path) -> None:
    src = tmp_path / "in.csv"
    src.write_text("model,gpu,tp,isl,osl,concurrency\nllama-3.1-8b,h100-sxm,1,100,100,4\n")
    for flag in (("--gpu", "h100-sxm"), ("--explain",), ("--kv-dtype", "auto"), ("--tp", "1")):
        done = rooftop("predict", "--csv", str(src), *flag)
        assert done.returncode == 2 and done.stdout == "", flag
        assert f"--csv and {flag[0]} cannot be combined" in done.stderr
    alone = rooftop(*PREDICT, "--out", str(tmp_path / "out.csv"))
    assert alone.returncode == 2 and "--out writes the CSV of --csv" in alone.stderr


def test_json_and_another_output_are_refused_together(rooftop: Rooftop) -> None:
    for args in (("plan", str(EXAMPLE)), PREDICT):
        done = rooftop(*args, "--json", "-o", "yaml")
        assert done.returncode == 2 and done.stdout == "", args
        assert "argument -o/--output: not allowed with argument --json" in done.stderr


def test_predict_explain_keeps_json_one_document(rooftop: Rooftop) -> None:
    done = rooftop(*PREDICT, "--explain")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)  # nothing after the JSON
    assert data["fits"] is True and data["explanation"][0].startswith("mean decode step")
    assert "explanation" not in json.loads(rooftop(*PREDICT).stdout)


def test_tables_fit_the_terminal_and_cut_no_cell() -> None:
    for fmt in ("table", "wide"):
        out = ESCAPES.sub("", on_a_terminal("plan", str(EXAMPLE), "-o", fmt, COLUMNS="80"))
        lines = out.splitlines()
        assert all(len(line.rstrip()) <= 80 for line in lines), fmt
        assert "…" not in out, fmt
        assert "chat-llama-8b" in out and "USD/h" in out, fmt  # the first column, the last
        wide = on_a_terminal("plan", str(EXAMPLE), "-o", fmt, COLUMNS="400")
        assert "meta-llama/Llama-3.1-8B-Instruct" in ESCAPES.sub("", wide)
    narrow = ESCAPES.sub("", on_a_terminal(*PREDICT, "-o", "table", COLUMNS="60"))
    assert all(len(line.rstrip()) <= 60 for line in narrow.splitlines())
    assert "…" not in narrow and "true" in narrow


def test_an_explanation_names_only_the_lengths_given(rooftop: Rooftop, tmp_path: Path) -> None:
    # the target gives mean lengths only: no p99 of anything is the user's
    long = _target(tmp_path, "promptTokens: {mean: 1155, p90: 2600}", "promptTokens: {mean: 30000}")
    text = long.replace("target.yaml", "long.yaml")
    Path(text).write_text(
        Path(long).read_text().replace("maxReplicas: 8", "maxReplicas: 8\n    gpuTypes: [l4]")
    )
    done = rooftop("plan", text, "--explain")
    assert "l4 TP1 bf16/KV auto" in done.stdout, done.stdout + done.stderr
    assert "p99" not in done.stdout
    assert "the prompt plus output that 99 % of requests stay within" in done.stdout


def test_a_closed_loop_run_is_described_by_its_flags(rooftop: Rooftop) -> None:
    base = ("predict", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--isl", "1000")
    one_wave = json.loads(rooftop(*base, "--concurrency", "64", "--num-prompts", "64").stdout)
    many = json.loads(rooftop(*base, "--concurrency", "64", "--num-prompts", "6400").stdout)
    assert one_wave["ttft_ms"] > 2 * many["ttft_ms"]  # the first wave's queue, averaged in
    varied = rooftop(*base, "--concurrency", "64", "--num-prompts", "6400", "--lengths", "varied")
    assert json.loads(varied.stdout)["ttft_ms"] < many["ttft_ms"]
    static = rooftop(*base, "--batch", "8", "--lengths", "fixed")
    assert static.returncode != 0 and "lengths: describes a closed-loop run" in static.stderr


def test_an_open_loop_run_at_a_request_rate(rooftop: Rooftop) -> None:
    base = ("predict", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--isl", "1000")
    served = json.loads(rooftop(*base, "--osl", "200", "--request-rate", "5").stdout)
    assert served["output_tok_s"] == pytest.approx(1000) and served["error"] is None
    over = json.loads(rooftop(*base, "--osl", "200", "--request-rate", "1000").stdout)
    assert over["ttft_ms"] is None and over["error"].startswith("overloaded: ")
    both = rooftop(*base, "--request-rate", "5", "--concurrency", "8")
    assert both.returncode == 2 and "not allowed with argument" in both.stderr
    assert "give requests per second" in rooftop(*base, "--request-rate", "0").stderr


def test_a_null_field_means_its_default_as_on_the_cluster(rooftop: Rooftop, tmp_path: Path) -> None:
    # the API server drops a null where the schema has no nullable: true, then defaults it
    done = rooftop("plan", _target(tmp_path, "minReplicas: 1", "minReplicas: null"), "-o", "json")
    assert done.returncode == 0, done.stderr
    listed = rooftop("plan", _target(tmp_path, "minReplicas: 1", "minReplicas: 1"), "-o", "json")
    assert json.loads(done.stdout) == json.loads(listed.stdout)


def test_plan_explain_is_honoured_in_every_format(rooftop: Rooftop) -> None:
    explained = json.loads(rooftop("plan", str(EXAMPLE), "--explain", "-o", "json").stdout)
    assert explained["explanation"][0].startswith("Chosen: ")
    assert "explanation" not in json.loads(rooftop("plan", str(EXAMPLE), "-o", "json").stdout)
    table = rooftop("plan", str(EXAMPLE), "--explain", "-o", "table").stdout
    assert table.splitlines()[0].startswith("NAME") and "\nChosen: " in table
