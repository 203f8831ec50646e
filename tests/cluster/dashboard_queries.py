"""Every query of both dashboards, run against a real Prometheus for one target.

dashboards/queries.py holds every panel's PromQL and the Grafana variables' queries;
here each one gets the target's namespace and name filled in and is run, so a test can
say which panels would be empty for that target.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from typing import Any

from dashboards import queries

from tests.cluster.prometheus import PrometheusServer


def label_values_as_promql(expr: str) -> str:
    """Grafana's ``label_values(metric{...}, label)`` as ``count by (label) (metric{...})``."""
    m = re.fullmatch(r"label_values\((.*), (\w+)\)", expr)
    assert m, expr
    return f"count by ({m.group(2)}) ({m.group(1)})"


def run_all(
    prometheus: PrometheusServer, namespace: str, target: str, rate_interval: str
) -> dict[str, dict[str, Any]]:
    """key -> {expr, series (the result), optional} for every panel and variable query."""
    results: dict[str, dict[str, Any]] = {}
    for key, q in queries.ALL.items():
        expr = queries.concrete(q.expr, namespace, target, rate_interval=rate_interval)
        results[key] = {"expr": expr, "series": prometheus.query(expr), "optional": q.optional}
    for expr in queries.VARIABLE_QUERIES:
        promql = label_values_as_promql(queries.concrete(expr, namespace, target))
        results[expr] = {"expr": promql, "series": prometheus.query(promql), "optional": False}
    return results


def empty(results: dict[str, dict[str, Any]], expected: Collection[str] = ()) -> dict[str, str]:
    """The required queries that returned nothing (key -> PromQL), beyond ``expected``."""
    return {k: r["expr"] for k, r in results.items()
            if not r["optional"] and not r["series"] and k not in expected}  # fmt: skip
