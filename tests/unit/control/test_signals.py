"""Each engine signal is declared once, on its ``Observation`` field (``readings.SIGNALS``),
and everything that asks for, converts, shows or simulates a reading follows those rows."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from rooftop_control.control import Cause, Decision, initial_state
from rooftop_control.readings import QUERY_NAMES, SIGNALS, MetricState, Observation, Reading
from rooftop_operator import loop
from rooftop_operator.metrics_client import TargetMetrics, fleet_queries
from rooftop_sim.window import Gauges, MetricsWindow

READING_FIELDS = {f.name for f in dataclasses.fields(Observation) if f.type == "Reading"}


def test_every_observation_reading_is_a_declared_signal_and_back() -> None:
    assert {s.field for s in SIGNALS} == READING_FIELDS


def test_the_operator_asks_prometheus_exactly_the_declared_queries() -> None:
    asked = set(fleet_queries("1m", 0.9, 0.99, tpot_slo_ms=100.0))
    assert asked == QUERY_NAMES


def test_an_undeclared_query_name_is_an_error_not_a_missing_reading() -> None:
    snap = TargetMetrics({})
    assert snap.get("step_batch").state is MetricState.MISSING  # declared, not answered
    with pytest.raises(KeyError, match="step_bacth"):
        snap.get("step_bacth")


def test_the_observation_converts_each_answer_by_its_row() -> None:
    """Distinct answers per query: each field holds its own query's answer x scale."""
    answers = {s.query: Reading(float(i + 1), MetricState.OK) for i, s in enumerate(SIGNALS)}
    obs = loop.observation(TargetMetrics(answers), ready=2, pending=1)
    for s in SIGNALS:
        assert getattr(obs, s.field).value == pytest.approx(answers[s.query].value * s.scale)
    assert (obs.ready_replicas, obs.pending_replicas) == (2, 1)


def test_a_signal_without_its_own_answer_reads_its_fallback() -> None:
    completions = Reading(3.0, MetricState.OK)
    obs = loop.observation(TargetMetrics({"completions_per_second": completions}), 1, 0)
    assert obs.requests_per_second == completions


def test_a_figure_below_its_least_meaning_reads_as_that() -> None:
    dip = TargetMetrics({"requests_per_second": Reading(-0.4, MetricState.OK)})
    assert loop.observation(dip, 1, 0).requests_per_second.value == 0.0


def test_status_observed_shows_the_rows_that_name_a_key() -> None:
    readings: dict[str, Any] = {s.field: Reading(1.0, MetricState.OK) for s in SIGNALS}
    observed = loop.observed_status(_decision(), Observation(**readings), "t")
    keys = set(observed.model_dump(by_alias=True, exclude_none=True))
    learned = {"calibrationFactor", "calibrationSamples", "latencyTrim", "metricsState", "time"}
    assert keys - learned == {s.status_key for s in SIGNALS if s.status_key}


def _decision() -> Decision:
    return Decision(
        replicas=1,
        max_num_seqs=8,
        reason="",
        conditions=(),
        state=initial_state(1, 8),
        metrics_state=MetricState.OK,
        needed_replicas=1,
        previous_replicas=1,
        previous_max_num_seqs=8,
        cause=Cause.CALIBRATION,
    )


def test_the_simulated_window_produces_every_signal() -> None:
    window = MetricsWindow(60.0, 0.9, 0.9, tpot_slo_ms=100.0)
    window.add_finished(10.0, 0.05, 128, 64)
    window.ttft.append((5.0, 0.2))
    window.add_step(0.02, 8, 10.0, drafts=(8, 24, 13))  # a speculating engine's step
    gauges = Gauges(running=4.0, waiting=1.0, kv_usage_ratio=0.3, ready=1, pending=0)
    # two 15-s intervals: the burstiness compares consecutive counts
    obs = window.observe(30.0, 2.0, gauges)
    assert {s.field: getattr(obs, s.field).state for s in SIGNALS} == {
        s.field: MetricState.OK for s in SIGNALS
    }
