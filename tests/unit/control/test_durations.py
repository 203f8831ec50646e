"""One duration grammar: what Prometheus accepts in a range, the seconds the loop uses,
and the chart's values schema agree on every text."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from rooftop_control.durations import PATTERN, parse_duration_s
from rooftop_operator.metrics_client import check_window
from rooftop_operator.settings import LoopSettings, configured, read_settings

SCHEMA = Path(__file__).resolve().parents[3] / "charts" / "rooftop" / "values.schema.json"
GOOD = {"90s": 90.0, "1m30s": 90.0, "2d": 172800.0, "1h1m1s5ms": 3661.005, "250ms": 0.25}
# out of order, repeated, fractional, unitless, empty: Prometheus refuses each in a query
BAD = ["30s1m", "1m1m", "1.5m", "10", "m", "", " 1m"]


def loop_settings(environ: dict[str, str]) -> LoopSettings:
    """The loop's settings the operator reads from ``environ``."""
    return configured(read_settings(environ)).loop


@pytest.mark.parametrize(("text", "seconds"), GOOD.items())
def test_a_duration_reads_as_prometheus_reads_it(text: str, seconds: float) -> None:
    assert parse_duration_s(text) == pytest.approx(seconds)


@pytest.mark.parametrize(("text", "seconds"), GOOD.items())
def test_the_loop_computes_with_the_window_promql_uses(text: str, seconds: float) -> None:
    settings = loop_settings({"ROOFTOP_LOOP_WINDOW": text})
    assert settings.window == text and settings.window_s == pytest.approx(seconds)


@pytest.mark.parametrize("text", [t for t in BAD if t])
def test_a_bad_window_stops_the_operator_naming_the_variable(text: str) -> None:
    with pytest.raises(ValueError, match="ROOFTOP_LOOP_WINDOW.*largest first"):
        loop_settings({"ROOFTOP_LOOP_WINDOW": text})


def test_a_zero_window_is_refused() -> None:
    with pytest.raises(ValueError, match="longer than zero"):
        check_window("0s")


def _schema_accepts(field: str, text: str) -> bool:
    schema = json.loads(SCHEMA.read_text())
    loop = {"loop": {field: text}} if field == "window" else {}
    monitor = {"metrics": {"podMonitor": {field: text}}} if field == "interval" else {}
    validator = jsonschema.Draft7Validator(schema)
    return validator.is_valid(loop | monitor)


@pytest.mark.parametrize("field", ["window", "interval"])
@pytest.mark.parametrize("text", [*GOOD, *BAD])
def test_the_chart_accepts_exactly_what_the_operator_accepts(field: str, text: str) -> None:
    try:
        parse_duration_s(text)
        accepted = True
    except ValueError:
        accepted = False
    assert _schema_accepts(field, text) is accepted


def test_the_chart_carries_the_same_pattern() -> None:
    """One definition, which every duration of the chart's values refers to."""
    text = SCHEMA.read_text()
    assert json.loads(text)["definitions"]["duration"]["pattern"] == PATTERN
    assert text.count(json.dumps(PATTERN)) == 1
    # loop.window, metrics.podMonitor.interval, the five prometheusRule.for holds
    assert text.count('"$ref": "#/definitions/duration"') == 7
