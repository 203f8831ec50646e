"""Small builders that emit Grafana dashboard JSON (schemaVersion 39) as plain dicts.

Every query-bearing panel and every target carries ``DATASOURCE``, a reference to the
``$datasource`` variable, so the dashboards work with whatever Prometheus the Grafana
they are loaded into calls its own. Panels are built with a width and height only;
``layout`` places them left to right in sections and numbers them.

Generic builders (``timeseries``, ``stat``, ``bargauge``, ``table``) come first; the
panel shapes both dashboards share (latency against the SLO, cost against budget,
replicas, scaling decisions, ratio gauges) are factories on top of them at the end.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from dashboards.queries import Query

Json = dict[str, Any]

SCHEMA_VERSION: Final = 39
DATASOURCE: Final[Json] = {"type": "prometheus", "uid": "${datasource}"}
GRID_WIDTH: Final = 24
SLO_REF: Final = "SLO"  # refId of the SLO line in latency panels


def target(query: Query, ref_id: str, *, instant: bool = False) -> Json:
    """One Prometheus query; ``instant`` ones come back as a table frame."""
    return {
        "datasource": DATASOURCE,
        "editorMode": "code",
        "expr": query.expr,
        "format": "table" if instant else "time_series",
        "instant": instant,
        "legendFormat": query.legend or "__auto",
        "range": not instant,
        "refId": ref_id,
    }


def targets(queries: Sequence[Query], *, instant: bool = False) -> list[Json]:
    """Targets with refIds A, B, C... (``SLO`` for a query whose legend is ``SLO``)."""
    return [
        target(q, SLO_REF if q.legend == SLO_REF else chr(ord("A") + i), instant=instant)
        for i, q in enumerate(queries)
    ]


def thresholds(*steps: tuple[float | None, str]) -> Json:
    """Absolute thresholds; the first step's value must be None (the base colour)."""
    return {"mode": "absolute", "steps": [{"color": c, "value": v} for v, c in steps]}


def _panel(
    kind: str,
    title: str,
    description: str,
    w: int,
    h: int,
    defaults: Json,
    options: Json,
    refs: list[Json],
    overrides: Sequence[Json] = (),
) -> Json:
    """A panel of any kind: field defaults and overrides, options, targets, no position."""
    return {
        "datasource": DATASOURCE,
        "description": description,
        "fieldConfig": {"defaults": defaults, "overrides": list(overrides)},
        "gridPos": {"h": h, "w": w, "x": 0, "y": 0},
        "options": options,
        "targets": refs,
        "title": title,
        "type": kind,
    }


def _dashed() -> list[Json]:
    """Override properties that draw a series as a dashed line without fill."""
    return [
        {"id": "custom.lineStyle", "value": {"dash": [10, 10], "fill": "dash"}},
        {"id": "custom.fillOpacity", "value": 0},
    ]


def _slo_override() -> Json:
    """Draw the SLO as a dashed red line without fill."""
    return {
        "matcher": {"id": "byFrameRefID", "options": SLO_REF},
        "properties": [
            {"id": "color", "value": {"fixedColor": "red", "mode": "fixed"}},
            *_dashed(),
        ],
    }


def _last_value() -> Json:
    """Reduce each series to its last non-null value (stat and bar gauge panels)."""
    return {"calcs": ["lastNotNull"], "fields": "", "values": False}


def timeseries(
    title: str,
    queries: Sequence[Query],
    *,
    unit: str,
    description: str = "",
    w: int = 12,
    h: int = 8,
    bars: bool = False,
    min_value: float | None = 0,
    max_value: float | None = None,
    dashed: str = "",
) -> Json:
    """A time series panel; a query with legend ``SLO`` is drawn as a dashed line.

    Args:
        dashed: a regex of series names also drawn dashed (e.g. per-target SLO lines).
    """
    defaults: Json = {
        "custom": {
            "drawStyle": "bars" if bars else "line",
            "fillOpacity": 80 if bars else 10,
            "lineWidth": 1,
            "showPoints": "never",
            "spanNulls": False,
            "stacking": {"group": "A", "mode": "normal" if bars else "none"},
        },
        "unit": unit,
    }
    if min_value is not None:
        defaults["min"] = min_value
    if max_value is not None:
        defaults["max"] = max_value
    overrides = [_slo_override()] if any(q.legend == SLO_REF for q in queries) else []
    if dashed:
        overrides.append(
            {"matcher": {"id": "byRegexp", "options": dashed}, "properties": _dashed()}
        )
    options = {
        "legend": {"calcs": [], "displayMode": "list", "placement": "bottom", "showLegend": True},
        "tooltip": {"mode": "multi", "sort": "desc"},
    }
    refs = targets(queries)
    return _panel("timeseries", title, description, w, h, defaults, options, refs, overrides)


def stat(
    title: str,
    queries: Sequence[Query],
    *,
    unit: str = "short",
    description: str = "",
    w: int = 4,
    h: int = 4,
    steps: Json | None = None,
    mappings: Sequence[Json] = (),
    text_mode: str = "auto",
    decimals: int | None = None,
) -> Json:
    """A single-value panel showing the last value of each query."""
    defaults: Json = {
        "mappings": list(mappings),
        "thresholds": steps or thresholds((None, "green")),
        "unit": unit,
    }
    if decimals is not None:
        defaults["decimals"] = decimals
    options = {
        "colorMode": "value",
        "graphMode": "none",
        "justifyMode": "auto",
        "orientation": "auto",
        "reduceOptions": _last_value(),
        "textMode": text_mode,
    }
    return _panel("stat", title, description, w, h, defaults, options, targets(queries))


def bargauge(
    title: str,
    queries: Sequence[Query],
    *,
    unit: str,
    description: str = "",
    w: int = 12,
    h: int = 8,
    steps: Json | None = None,
    max_value: float | None = None,
) -> Json:
    """Horizontal bars, one per series (e.g. one per target)."""
    defaults: Json = {"min": 0, "thresholds": steps or thresholds((None, "green")), "unit": unit}
    if max_value is not None:
        defaults["max"] = max_value
    options = {
        "displayMode": "gradient",
        "orientation": "horizontal",
        "reduceOptions": _last_value(),
        "showUnfilled": True,
    }
    return _panel("bargauge", title, description, w, h, defaults, options, targets(queries))


def table(
    title: str,
    columns: Sequence[tuple[str, Query, str]],
    *,
    description: str = "",
    w: int = 24,
    h: int = 8,
    mappings: Sequence[Json] = (),
    links: Sequence[Json] = (),
    column_mappings: Mapping[str, Json] | None = None,
) -> Json:
    """A table of instant queries merged on their shared labels.

    Args:
        columns: (column title, query, unit) per value column; label columns come
            from the queries' ``by`` clauses.
        links: data links on every cell (e.g. to the per-target dashboard).
        column_mappings: column title -> value mapping for that column only.
    """
    refs = targets([q for _, q, _ in columns], instant=True)
    rename = {f"Value #{t['refId']}": col for t, (col, _, _) in zip(refs, columns, strict=True)}
    per_column = column_mappings or {}
    overrides = []
    for col, _, unit in columns:
        properties: list[Json] = [{"id": "unit", "value": unit}]
        if col in per_column:
            properties.append({"id": "mappings", "value": [per_column[col]]})
        overrides.append({"matcher": {"id": "byName", "options": col}, "properties": properties})
    defaults = {"custom": {"align": "auto"}, "links": list(links), "mappings": list(mappings)}
    options = {"cellHeight": "sm", "showHeader": True}
    panel = _panel("table", title, description, w, h, defaults, options, refs, overrides)
    panel["transformations"] = [
        {"id": "merge", "options": {}},
        {"id": "organize", "options": {"excludeByName": {"Time": True}, "renameByName": rename}},
    ]
    return panel


def value_map(values: dict[str, tuple[str, str]]) -> Json:
    """Map raw values to (text, colour), e.g. ``{"1": ("Met", "green")}``."""
    options = {
        raw: {"color": colour, "index": i, "text": text}
        for i, (raw, (text, colour)) in enumerate(values.items())
    }
    return {"options": options, "type": "value"}


def row(title: str) -> Json:
    """A section header (an expanded row)."""
    return {
        "collapsed": False,
        "gridPos": {"h": 1, "w": GRID_WIDTH, "x": 0, "y": 0},
        "panels": [],
        "title": title,
        "type": "row",
    }


def layout(sections: Sequence[tuple[str, Sequence[Json]]]) -> list[Json]:
    """Place panels left to right under a row per section, wrapping at 24 columns."""
    out: list[Json] = []
    y = 0
    for title, panels in sections:
        out.append(_placed(row(title), 0, y))
        y += 1
        x, row_h = 0, 0
        for panel in panels:
            w, h = panel["gridPos"]["w"], panel["gridPos"]["h"]
            if x + w > GRID_WIDTH:
                x, y, row_h = 0, y + row_h, 0
            out.append(_placed(panel, x, y))
            x, row_h = x + w, max(row_h, h)
        y += row_h
    for i, panel in enumerate(out, start=1):
        panel["id"] = i
    return out


def _placed(panel: Json, x: int, y: int) -> Json:
    return {**panel, "gridPos": {**panel["gridPos"], "x": x, "y": y}}


def datasource_variable() -> Json:
    """The ``$datasource`` picker, limited to Prometheus data sources."""
    return {
        "current": {},
        "hide": 0,
        "includeAll": False,
        "label": "Data source",
        "multi": False,
        "name": "datasource",
        "options": [],
        "query": "prometheus",
        "refresh": 1,
        "regex": "",
        "type": "datasource",
    }


def query_variable(
    name: str, label: str, query: str, *, include_all: bool = False, multi: bool = False
) -> Json:
    """A variable filled from ``label_values(...)``; ``All`` matches ``.*``."""
    var: Json = {
        "current": {"selected": True, "text": "All", "value": "$__all"} if include_all else {},
        "datasource": DATASOURCE,
        "definition": query,
        "hide": 0,
        "includeAll": include_all,
        "label": label,
        "multi": multi,
        "name": name,
        "options": [],
        "query": {"qryType": 1, "query": query, "refId": "PrometheusVariableQueryEditor"},
        "refresh": 2,
        "regex": "",
        "sort": 1,
        "type": "query",
    }
    if include_all:
        var["allValue"] = ".*"
    return var


def prometheus_annotation(name: str, query: Query, *, title: str, text: str) -> Json:
    """Mark the time of every sample of ``query`` on all time series panels."""
    return {
        "datasource": DATASOURCE,
        "enable": True,
        "expr": query.expr,
        "iconColor": "orange",
        "name": name,
        "step": "1m",
        "tagKeys": "direction,reason",
        "textFormat": text,
        "titleFormat": title,
        "useValueForTime": False,
    }


def dashboard(
    *,
    uid: str,
    title: str,
    description: str,
    panels: list[Json],
    variables: list[Json],
    annotations: Sequence[Json] = (),
    links: Sequence[Json] = (),
) -> Json:
    """The dashboard envelope with a fixed ``uid`` (links and provisioning rely on it)."""
    return {
        "annotations": {"list": list(annotations)},
        "description": description,
        "editable": True,
        "fiscalYearStartMonth": 0,
        "graphTooltip": 1,
        "id": None,
        "links": list(links),
        "panels": panels,
        "refresh": "30s",
        "schemaVersion": SCHEMA_VERSION,
        "tags": ["rooftop", "vllm"],
        "templating": {"list": variables},
        "time": {"from": "now-1h", "to": "now"},
        "timepicker": {},
        "timezone": "browser",
        "title": title,
        "uid": uid,
        "version": 1,
        "weekStart": "",
    }


def dashboard_link(title: str, uid: str, *, include_vars: bool) -> Json:
    """A link in the dashboard header to another dashboard, by its fixed uid."""
    return {
        "asDropdown": False,
        "icon": "dashboard",
        "includeVars": include_vars,
        "keepTime": True,
        "tags": [],
        "targetBlank": False,
        "title": title,
        "type": "link",
        "url": f"/d/{uid}/{uid}",
    }


# ---------------------------------------------------------------- shared panel shapes


def latency(
    title: str,
    queries: Sequence[Query],
    *,
    w: int = 8,
    h: int = 8,
    description: str = "",
    dashed: str = "",
) -> Json:
    """Latencies in seconds; a query with legend ``SLO`` (or matching ``dashed``) is drawn
    as a dashed SLO line."""
    return timeseries(title, queries, unit="s", w=w, h=h, description=description, dashed=dashed)


def fraction(title: str, queries: Sequence[Query], *, w: int = 8, description: str = "") -> Json:
    """Ratios between 0 and 1 (cache usage, hit ratio), drawn as 0-100 %."""
    return timeseries(title, queries, unit="percentunit", max_value=1, w=w, description=description)


def over_limit(title: str, query: Query, *, w: int, description: str = "") -> Json:
    """Bars of observed / limit per series: green, orange from 90 %, red from 100 %."""
    steps = thresholds((None, "green"), (0.9, "orange"), (1, "red"))
    return bargauge(title, [query], unit="percentunit", steps=steps, w=w, description=description)


def money(title: str, query: Query, *, w: int = 4, description: str = "") -> Json:
    """One USD-per-hour figure (cost or budget)."""
    return stat(title, [query], unit="currencyUSD", w=w, description=description)


def cost_vs_budget(cost: Query, budget: Query, *, w: int = 8) -> Json:
    return timeseries("Cost vs budget", [cost, budget], unit="currencyUSD", w=w)


def replicas_now(ready: Query, desired: Query, *, w: int) -> Json:
    """Ready and desired replicas as two numbers."""
    return stat("Replicas ready / desired", [ready, desired], w=w)


def replicas(desired: Query, ready: Query, *, w: int) -> Json:
    """Desired and ready replicas over time."""
    return timeseries("Replicas desired / ready", [desired, ready], unit="short", w=w)


def scaling_decisions(query: Query, *, w: int, h: int = 8, description: str = "") -> Json:
    """The operator's scaling decisions per interval, as stacked bars."""
    return timeseries(
        "Scaling decisions", [query], unit="short", bars=True, w=w, h=h, description=description
    )
