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


def test_the_drafted_share_is_drafted_steps_over_every_decode_step_served() -> None:
    """As vLLM's num_drafts over the inter-token latency's count: 6 of the 8 requests
    drafted in the first step, none of 8 in the next (a lookup that found nothing),
    4 of 4 in the third: 10 / 20. Steps before any draft are not the engine's
    speculation (a pod that does not speculate reads NaN)."""
    w = MetricsWindow(60.0, 0.9, 0.9, 100.0)
    w.add_step(0.02, 8, 1.0)
    assert w.observe(2.0, 1.0, GAUGES).served_drafted_share.state is MetricState.NAN
    w.add_step(0.02, 8, 3.0, (6, 18, 9))
    w.add_step(0.02, 8, 4.0)
    w.add_step(0.02, 4, 5.0, (4, 12, 8))
    obs = w.observe(10.0, 1.0, GAUGES)
    assert obs.served_drafted_share.value == pytest.approx(10 / 20)
    assert obs.served_accepted_per_draft.value == pytest.approx(17 / 10)
    assert obs.served_draft_length.value == pytest.approx(30 / 10)
