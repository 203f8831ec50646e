"""The simulator's Prometheus: the step readings the calibration compares."""

from __future__ import annotations

import pytest

from rooftop_control.readings import MetricState
from rooftop_sim.window import Gauges, MetricsWindow

GAUGES = Gauges(running=4.0, waiting=0.0, kv_usage_ratio=0.1, ready=1, pending=0)


def test_step_batch_is_decode_tokens_per_iteration_over_the_window() -> None:
    """Two steps of 8 decodes (20 ms) and one prompt-only step, then the window moves
    on: the step batch counts the prompt-only step as vLLM's iteration histogram does,
    the step time weighs each decoded token by its step, and both forget old steps."""
    w = MetricsWindow(60.0, 0.9, 0.9, 100.0)
    for tokens in (8, 8, 0):
        w.add_step(0.020, tokens)
    obs = w.observe(15.0, 1.0, GAUGES)
    assert obs.step_batch.value == pytest.approx(16 / 3)
    assert obs.step_ms.value == pytest.approx(20.0)
    w.add_step(0.050, 2)
    assert w.observe(90.0, 1.0, GAUGES).step_batch.value == pytest.approx(2.0)
    assert w.observe(160.0, 1.0, GAUGES).step_batch.state is MetricState.NAN  # no steps


def test_prefix_hit_ratio_is_tokens_found_over_tokens_looked_up_in_the_served_range() -> None:
    """vLLM's prefix_cache_hits over _queries, over the 15-minute served range (not
    the 60 s window): 100 of 1000 tokens, then 900 of 1000 more, then only the second
    once the first has left the range; NaN when nothing was looked up, as 0 / 0 is in
    Prometheus (an engine with the cache off looks nothing up)."""
    w = MetricsWindow(60.0, 0.9, 0.9, 100.0)
    w.add_finished(10.0, 0.05, 1000, 10, 1000, 100)
    assert w.observe(15.0, 1.0, GAUGES).served_prefix_hit_ratio.value == pytest.approx(0.1)
    w.add_finished(400.0, 0.05, 1000, 10, 1000, 900)
    assert w.observe(405.0, 1.0, GAUGES).served_prefix_hit_ratio.value == pytest.approx(0.5)
    assert w.observe(915.0, 1.0, GAUGES).served_prefix_hit_ratio.value == pytest.approx(0.9)
    off = MetricsWindow(60.0, 0.9, 0.9, 100.0)
    off.add_finished(10.0, 0.05, 1000, 10, 0, 0)
    assert off.observe(15.0, 1.0, GAUGES).served_prefix_hit_ratio.state is MetricState.NAN
    empty = MetricsWindow(60.0, 0.9, 0.9, 100.0).observe(15.0, 1.0, GAUGES)
    assert empty.served_prefix_hit_ratio.state is MetricState.NAN
