"""Small builders that emit Grafana dashboard JSON (schemaVersion 39) as plain dicts.

Every query-bearing panel and every target carries ``DATASOURCE``, a reference to the
``$datasource`` variable, so the dashboards work with whatever Prometheus the Grafana
they are loaded into calls its own. Panels are built with a width and height only;
``layout`` places them left to right in sections and numbers them.
"""

from __future__ import annotations

from collections.abc import Sequence
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


def _panel(kind: str, title: str, description: str, w: int, h: int) -> Json:
    return {
        "datasource": DATASOURCE,
        "description": description,
        "gridPos": {"h": h, "w": w, "x": 0, "y": 0},
        "title": title,
        "type": kind,
    }


def _slo_override() -> Json:
    """Draw the SLO as a dashed red line without fill."""
    return {
        "matcher": {"id": "byFrameRefID", "options": SLO_REF},
        "properties": [
            {"id": "color", "value": {"fixedColor": "red", "mode": "fixed"}},
            {"id": "custom.lineStyle", "value": {"dash": [10, 10], "fill": "dash"}},
            {"id": "custom.fillOpacity", "value": 0},
        ],
    }


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
) -> Json:
    """A time series panel; a query with legend ``SLO`` is drawn as a dashed line."""
    panel = _panel("timeseries", title, description, w, h)
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
    slo = any(q.legend == SLO_REF for q in queries)
    panel["fieldConfig"] = {"defaults": defaults, "overrides": [_slo_override()] if slo else []}
    panel["options"] = {
        "legend": {"calcs": [], "displayMode": "list", "placement": "bottom", "showLegend": True},
        "tooltip": {"mode": "multi", "sort": "desc"},
    }
    panel["targets"] = targets(queries)
    return panel


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
    panel = _panel("stat", title, description, w, h)
    defaults: Json = {
        "mappings": list(mappings),
        "thresholds": steps or thresholds((None, "green")),
        "unit": unit,
    }
    if decimals is not None:
        defaults["decimals"] = decimals
    panel["fieldConfig"] = {"defaults": defaults, "overrides": []}
    panel["options"] = {
        "colorMode": "value",
        "graphMode": "none",
        "justifyMode": "auto",
        "orientation": "auto",
        "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
        "textMode": text_mode,
    }
    panel["targets"] = targets(queries)
    return panel


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
    panel = _panel("bargauge", title, description, w, h)
    defaults: Json = {
        "min": 0,
        "thresholds": steps or thresholds((None, "green")),
        "unit": unit,
    }
    if max_value is not None:
        defaults["max"] = max_value
    panel["fieldConfig"] = {"defaults": defaults, "overrides": []}
    panel["options"] = {
        "displayMode": "gradient",
        "orientation": "horizontal",
        "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
        "showUnfilled": True,
    }
    panel["targets"] = targets(queries)
    return panel


def table(
    title: str,
    columns: Sequence[tuple[str, Query, str]],
    *,
    description: str = "",
    w: int = 24,
    h: int = 8,
    mappings: Sequence[Json] = (),
    links: Sequence[Json] = (),
) -> Json:
    """A table of instant queries merged on their shared labels.

    Args:
        columns: (column title, query, unit) per value column; label columns come
            from the queries' ``by`` clauses.
        links: data links on every cell (e.g. to the per-target dashboard).
    """
    panel = _panel("table", title, description, w, h)
    refs = targets([q for _, q, _ in columns], instant=True)
    rename = {f"Value #{t['refId']}": col for t, (col, _, _) in zip(refs, columns, strict=True)}
    panel["fieldConfig"] = {
        "defaults": {"custom": {"align": "auto"}, "links": list(links), "mappings": list(mappings)},
        "overrides": [
            {
                "matcher": {"id": "byName", "options": col},
                "properties": [{"id": "unit", "value": u}],
            }
            for col, _, u in columns
        ],
    }
    panel["options"] = {"cellHeight": "sm", "showHeader": True}
    panel["targets"] = refs
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
