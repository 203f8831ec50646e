"""The loop's defaults that the operator and the simulator must share.

A simulated run is only evidence for the deployed loop when both tick, wait for a pod
and roll out alike, so each figure is declared here once: the operator's settings
(``rooftop_operator.settings``), its Deployments (``rooftop_operator.builders``), the
controller (``rooftop_control.control``) and the simulated cluster
(``rooftop_sim.cluster``, ``rooftop_sim.simulate``) read it, and a unit test keeps the
chart's values on the same figures.
"""

from __future__ import annotations

from typing import Final

from rooftop_control.durations import parse_duration_s

# An engine pod's start-up (scheduled to serving) when nothing better is known, s. The
# operator uses each target's own figure (rooftop_planner.lifecycle) when it has one.
STARTUP_S: Final = 120.0
# One loop decision every TICK_S, s; the simulator scrapes and decides on the same beat.
TICK_S: Final = 15.0
# The PromQL range of rates and percentiles (at least 4 scrape intervals), and the same
# in seconds for the controller's own waits.
METRICS_WINDOW: Final = "1m"
METRICS_WINDOW_S: Final = parse_duration_s(METRICS_WINDOW)
# The range the served request lengths are read over: the lengths a target serves are
# a property of its users, and one minute's p90 swings with a burst of long prompts.
SERVED_RANGE: Final = "15m"
SERVED_RANGE_S: Final = parse_duration_s(SERVED_RANGE)
# Readings whose newest sample is older than this are stale (never acted on), s.
STALE_AFTER_S: Final = 60.0
# A rollout starts at most this fraction of the replicas as extra pods (Deployment
# maxSurge), so capacity never drops below the planned fleet while pods are replaced.
ROLLOUT_SURGE: Final = 0.25
