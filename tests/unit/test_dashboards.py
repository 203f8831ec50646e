"""Dashboards as code: rendered JSON is current, wired to $datasource, and every PromQL
expression is well formed, uses only metrics that exist and never a lifetime average."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # ``dashboards/`` lives at the repo root, not in a package dir
    sys.path.insert(0, str(REPO))

from dashboards import build, queries  # noqa: E402
from dashboards.panels import DATASOURCE, GRID_WIDTH, SCHEMA_VERSION  # noqa: E402

from rooftop_operator.metrics import METRIC_NAMES  # noqa: E402

# vLLM V1 metric names (as 0.32.0 serves them: tests/e2e/test_vllm_metrics.py), by type.
# Deprecated and removed names (gpu_cache_usage_perc, time_per_output_token_seconds,
# gpu_prefix_cache_*) are absent on purpose: dashboards must not use them.
VLLM_GAUGES = (
    "num_requests_running",
    "num_requests_waiting",
    "num_requests_waiting_by_reason",
    "kv_cache_usage_perc",
    "engine_sleep_state",
    "cache_config_info",
    "lora_requests_info",
)
VLLM_COUNTERS = (  # exposed with _total
    "prompt_tokens",
    "generation_tokens",
    "request_success",
    "num_preemptions",
    "prefix_cache_queries",
    "prefix_cache_hits",
    "external_prefix_cache_queries",
    "external_prefix_cache_hits",
    "mm_cache_queries",
    "mm_cache_hits",
    "prompt_tokens_by_source",
    "prompt_tokens_cached",
    "prompt_tokens_cached_by_source",
    "admission_rejections",
    "corrupted_requests",
    "spec_decode_num_drafts",
    "spec_decode_num_draft_tokens",
    "spec_decode_num_accepted_tokens",
    "spec_decode_num_accepted_tokens_per_pos",
)
VLLM_HISTOGRAMS = (  # exposed as _bucket, _sum, _count
    "time_to_first_token_seconds",
    "inter_token_latency_seconds",
    "request_time_per_output_token_seconds",
    "e2e_request_latency_seconds",
    "request_queue_time_seconds",
    "request_inference_time_seconds",
    "request_prefill_time_seconds",
    "request_decode_time_seconds",
    "request_prompt_tokens",
    "request_generation_tokens",
    "request_max_num_generation_tokens",
    "request_params_max_tokens",
    "request_prefill_kv_computed_tokens",
    "request_params_n",
    "iteration_tokens_total",  # a histogram despite the name
    "request_num_preemptions",
    "kv_block_lifetime_seconds",
    "kv_block_idle_before_evict_seconds",
    "kv_block_reuse_gap_seconds",
)
VLLM_NAMES = frozenset(
    [f"vllm:{g}" for g in VLLM_GAUGES]
    + [f"vllm:{c}_total" for c in VLLM_COUNTERS]
    + [f"vllm:{h}{s}" for h in VLLM_HISTOGRAMS for s in ("_bucket", "_sum", "_count")]
)
KNOWN_NAMES = VLLM_NAMES | frozenset(METRIC_NAMES)
# Series that only make sense under rate()/increase(): counters and histogram parts.
CUMULATIVE = re.compile(r"(_total|_bucket|_sum|_count)$")

PROMQL_WORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring"}
PROMQL_WORDS |= {"group_left", "group_right", "inf", "nan", "le"}

DASHBOARDS = build.render_all()
EXPRS = sorted({q.expr for q in queries.ALL.values()})


def rendered(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARDS[name])
    return loaded


def all_panels(dash: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for panel in dash["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))
    return out


def metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression, by a superficial scan (not a parser)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals
    text = re.sub(r"\[[^\]]*\]", "", text)  # range / subquery durations
    text = re.sub(r"\{[^}]*\}", "", text)  # label matchers
    grouping = r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)"
    text = re.sub(grouping, "", text)
    names = set()
    for match in re.finditer(r"(?<![\w:.])([A-Za-z_:][\w:]*)(\s*\()?", text):
        word, call = match.group(1), match.group(2)
        if not call and word not in PROMQL_WORDS:
            names.add(word)
    return names


def balanced(expr: str) -> bool:
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    pairs, stack = {")": "(", "]": "[", "}": "{"}, []
    for ch in text:
        if ch in "([{":
            stack.append(ch)
        elif ch in pairs and (not stack or stack.pop() != pairs[ch]):
            return False
    return not stack and text.count('"') % 2 == 0


# -- rendering --------------------------------------------------------------------


def test_every_dashboard_renders_with_a_fixed_uid() -> None:
    uids = {name: rendered(name)["uid"] for name in DASHBOARDS}
    assert uids == {"rooftop-fleet.json": "rooftop-fleet", "rooftop-target.json": "rooftop-target"}
    for name in DASHBOARDS:
        dash = rendered(name)
        assert dash["schemaVersion"] == SCHEMA_VERSION
        assert dash["id"] is None and dash["title"].startswith("Rooftop")


def test_committed_json_is_up_to_date() -> None:
    assert build.stale() == [], "run: python dashboards/build.py"


def test_check_flag_reports_stale_files(tmp_path: Path) -> None:
    assert build.main(["--check", "--out-dir", str(tmp_path)]) == 1
    assert build.main(["--out-dir", str(tmp_path)]) == 0
    assert build.main(["--check", "--out-dir", str(tmp_path)]) == 0
    (tmp_path / "rooftop-fleet.json").write_text("{}")
    assert build.main(["--check", "--out-dir", str(tmp_path)]) == 1


def test_rendering_is_deterministic() -> None:
    assert build.render_all() == DASHBOARDS


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_every_panel_and_query_uses_the_datasource_variable(name: str) -> None:
    dash = rendered(name)
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert DATASOURCE == {"type": "prometheus", "uid": "${datasource}"}
    for panel in all_panels(dash):
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == DATASOURCE, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == DATASOURCE, panel["title"]
    for var in variables.values():
        if var["type"] == "query":
            assert var["datasource"] == DATASOURCE
    for annotation in dash["annotations"]["list"]:
        assert annotation["datasource"] == DATASOURCE


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_layout_fits_the_grid_with_unique_ids(name: str) -> None:
    panels = all_panels(rendered(name))
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= GRID_WIDTH, panel["title"]
    for panel in panels:
        refs = [t["refId"] for t in panel.get("targets", [])]
        assert len(refs) == len(set(refs)), panel["title"]


def test_target_dashboard_variables() -> None:
    variables = {v["name"]: v for v in rendered("rooftop-target.json")["templating"]["list"]}
    assert list(variables) == ["datasource", "namespace", "target", "model_name"]
    assert "rooftop_" in variables["target"]["definition"]
    assert "vllm:" in variables["model_name"]["definition"]
    for query in queries.VARIABLE_QUERIES:
        inner = re.fullmatch(r"label_values\((.*), *\w+\)", query)
        assert inner and metric_names(inner.group(1)) <= KNOWN_NAMES, query


# -- queries ----------------------------------------------------------------------


def test_dashboards_run_exactly_the_queries_in_queries_all() -> None:
    """queries.ALL is what the end-to-end test runs, so it must cover every panel."""
    used = {e for name in DASHBOARDS for e in queries.extract_exprs(rendered(name))}
    assert used == set(EXPRS)


@pytest.mark.parametrize("expr", EXPRS)
def test_expression_is_balanced(expr: str) -> None:
    assert balanced(expr), expr


@pytest.mark.parametrize("expr", EXPRS)
def test_expression_uses_only_known_metrics(expr: str) -> None:
    names = metric_names(expr)
    assert names, expr
    assert names <= KNOWN_NAMES, names - KNOWN_NAMES


@pytest.mark.parametrize("expr", EXPRS)
def test_no_lifetime_averages(expr: str) -> None:
    """Counters and histogram parts appear only as rate/increase(x{...}[$__rate_interval])."""
    assert not re.search(r"avg\([^()]*_sum\b.*\)\s*/\s*avg\([^()]*_count\b", expr), expr
    for name in metric_names(expr):
        if not CUMULATIVE.search(name):
            continue
        for match in re.finditer(re.escape(name) + r"(?![\w:])", expr):
            before, after = expr[: match.start()], expr[match.end() :]
            assert re.search(r"\b(?:rate|irate|increase)\(\s*$", before), (name, expr)
            assert re.match(r"\s*(?:\{[^}]*\})?\s*\[\$__rate_interval\]", after), (name, expr)


@pytest.mark.parametrize("expr", [e for e in EXPRS if "histogram_quantile" in e])
def test_histogram_quantile_keeps_le(expr: str) -> None:
    assert re.search(r"histogram_quantile\([\d.]+, sum by \(([\w, ]*\b)?le\) \(rate\(", expr)


@pytest.mark.parametrize("key", sorted(k for k in queries.ALL if k.startswith("target.")))
def test_target_queries_select_one_target(key: str) -> None:
    expr = queries.ALL[key].expr
    if "vllm:" in expr:
        assert 'namespace="$namespace", servingtarget="$target"' in expr
    else:
        assert 'namespace="$namespace", name="$target"' in expr


def test_known_names_exclude_removed_vllm_metrics() -> None:
    assert "vllm:gpu_cache_usage_perc" not in KNOWN_NAMES
    assert "vllm:time_per_output_token_seconds_bucket" not in KNOWN_NAMES
    assert "vllm:iteration_tokens_total_bucket" in KNOWN_NAMES


def test_metric_name_scan() -> None:
    expr = (
        'histogram_quantile(0.9, sum by (namespace, le) (rate(vllm:x_bucket{a="b(c"}[5m])))'
        " / on (namespace) group_left max(rooftop_y) or vector(0)"
    )
    assert metric_names(expr) == {"vllm:x_bucket", "rooftop_y"}
    assert balanced(expr) and not balanced("sum(rate(x[1m])")


# -- concrete() -------------------------------------------------------------------


@pytest.mark.parametrize("key", sorted(queries.ALL))
def test_concrete_fills_every_variable(key: str) -> None:
    expr = queries.concrete(queries.ALL[key].expr, "demo", "chat", "llama", rate_interval="2m")
    assert "$" not in expr
    assert balanced(expr)


def test_concrete_values() -> None:
    expr = queries.TARGET_QUERIES["tpot_p90"].expr
    got = queries.concrete(expr, "demo", "chat", "llama")
    assert got == (
        "histogram_quantile(0.9, sum by (le) "
        "(rate(vllm:request_time_per_output_token_seconds_bucket"
        '{namespace="demo", servingtarget="chat", model_name=~"llama"}[1m])))'
    )
    assert queries.concrete('x{a=~"${namespace}"}', "demo", "t") == 'x{a=~"demo"}'
    with pytest.raises(KeyError):
        queries.concrete('x{a="$unknown"}', "demo", "t")
