"""``-o/--output json|yaml|table|wide``: typed JSON and YAML, tables drawn with rich on a
terminal and plain when piped or NO_COLOR is set."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from cli_process import ROOT, Rooftop, on_a_terminal

EXAMPLE = ROOT / "examples" / "chat-llama-3.1-8b.yaml"
SIMULATED = ROOT / "examples" / "simulated-chat.yaml"
TRACE = ROOT / "examples" / "traces" / "azure_conv_excerpt.csv"
PREDICT = ("predict", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--concurrency", "8")
BOX = set("─━│┃┏┓┗┛╇╋┡┩")


def test_plan_json_and_yaml_carry_the_target_and_the_search(rooftop: Rooftop) -> None:
    done = rooftop("plan", str(EXAMPLE), "-o", "json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["name"] == "chat-llama-8b" and data["source"] == str(EXAMPLE)
    assert data["feasible"] is True and isinstance(data["plan"]["replicas"], int)
    assert json.loads(rooftop("plan", str(EXAMPLE), "--json").stdout) == data  # the alias
    assert yaml.safe_load(rooftop("plan", str(EXAMPLE), "-o", "yaml").stdout) == data


def test_plan_table_is_plain_when_piped(rooftop: Rooftop) -> None:
    done = rooftop("plan", str(EXAMPLE), "-o", "table")
    assert done.returncode == 0, done.stderr
    header, *rows = done.stdout.splitlines()
    assert header.split()[:4] == ["NAME", "MODEL", "FEASIBLE", "GPU"]
    assert len(rows) == 1 and rows[0].split()[:3] == [
        "chat-llama-8b", "meta-llama/Llama-3.1-8B-Instruct", "true"
    ]  # fmt: skip
    assert "\x1b[" not in done.stdout and not BOX & set(done.stdout)
    wide = rooftop("plan", str(EXAMPLE), "-o", "wide").stdout.splitlines()
    assert "SOURCE" in wide[0].split() and str(EXAMPLE) in wide[1].split()
    assert len(wide[0].split()) > len(header.split())


def test_a_table_on_a_terminal_is_drawn_unless_no_color() -> None:
    drawn = on_a_terminal("plan", str(EXAMPLE), "-o", "table")
    assert "\x1b[" in drawn and BOX & set(drawn) and "chat-llama-8b" in drawn
    plain = on_a_terminal("plan", str(EXAMPLE), "-o", "table", NO_COLOR="1")
    assert "\x1b[" not in plain and not BOX & set(plain)
    assert plain.split()[:2] == ["NAME", "MODEL"]


def test_predict_prints_typed_json(rooftop: Rooftop) -> None:
    done = rooftop(*PREDICT, "-o", "json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    for key in (
        "tpot_ms",
        "ttft_ms",
        "output_tok_s",
        "running",
        "evictions",
        "floor_ms",
        "floor_share",
    ):
        assert isinstance(data[key], float), key
    assert data["fits"] is True and data["error"] is None and isinstance(data["curves"], str)
    assert json.loads(rooftop(*PREDICT).stdout) == data  # json is the default
    assert json.loads(rooftop(*PREDICT, "--json").stdout) == data
    assert yaml.safe_load(rooftop(*PREDICT, "-o", "yaml").stdout) == data


def test_predict_table_and_wide(rooftop: Rooftop) -> None:
    header, row = rooftop(*PREDICT, "-o", "table").stdout.splitlines()
    assert header.split() == ["MODEL", "GPU", "TP", "TPOT(ms)", "TTFT(ms)", "TOK/s", "FITS"]
    assert row.split()[:3] == ["llama-3.1-8b", "h100-sxm", "1"] and row.split()[-1] == "true"
    wide = rooftop(*PREDICT, "-o", "wide").stdout.splitlines()
    assert "CURVES" in wide[0] and "vllm" in wide[1]


def test_predict_csv_stays_csv_and_refuses_another_format(rooftop: Rooftop, tmp_path: Path) -> None:
    src = tmp_path / "in.csv"
    src.write_text("model,gpu,tp,weight_dtype,kv_dtype,isl,osl,concurrency,batch\n"
                   "llama-3.1-8b,h100-sxm,1,bf16,auto,100,100,4,\n")  # fmt: skip
    done = rooftop("predict", "--csv", str(src))
    assert done.returncode == 0 and done.stdout.startswith("model,gpu,")
    refused = rooftop("predict", "--csv", str(src), "-o", "json")
    assert refused.returncode == 2 and "--csv and -o/--output" in refused.stderr


def test_render_json_is_one_kubectl_list(rooftop: Rooftop) -> None:
    done = rooftop("render", str(EXAMPLE), "-o", "json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["kind"] == "List" and data["apiVersion"] == "v1"
    kinds = [item["kind"] for item in data["items"]]
    assert kinds == ["ConfigMap", "Deployment", "Service", "PodDisruptionBudget", "PodMonitor"]
    replicas = data["items"][1]["spec"]["replicas"]
    assert isinstance(replicas, int)
    docs = [d for d in yaml.safe_load_all(rooftop("render", str(EXAMPLE)).stdout) if d]
    assert docs == data["items"]  # yaml, the default, holds the same objects


def test_simulate_report_as_a_table_and_as_json(rooftop: Rooftop, tmp_path: Path) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_text("\n".join(TRACE.read_text().splitlines()[:301]) + "\n")  # 300 requests
    args = ("simulate", str(SIMULATED), "--trace", str(trace), "--policy", "static-peak")
    table = rooftop(*args, "-o", "table")
    assert table.returncode == 0, table.stderr
    header, row = table.stdout.splitlines()
    assert header.split()[:3] == ["POLICY", "TPOT-OK", "TTFT-OK"]
    assert row.split()[0] == "static-peak"
    data = json.loads(rooftop(*args, "-o", "json").stdout)
    assert data["policy"] == "static-peak" and isinstance(data["requests"], int)
