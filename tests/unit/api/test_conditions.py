"""Condition bookkeeping: transition times move only when the status does."""

from __future__ import annotations

import re

from rooftop_api import conditions as cnd
from rooftop_api.conditions import Condition
from rooftop_api.spec import ConditionStatus

T0, T1 = "2026-01-01T00:00:00Z", "2026-01-01T01:00:00Z"


def test_new_condition_gets_now() -> None:
    (ready,) = cnd.merge(None, [Condition("Ready", "False", "Deploying", "0/1")], now=T0)
    assert ready == ConditionStatus(
        type="Ready", status="False", reason="Deploying", message="0/1", last_transition_time=T0
    )


def test_same_status_keeps_transition_time_but_updates_reason_and_message() -> None:
    first = cnd.merge(None, [Condition("Ready", "False", "Deploying", "0/2")], now=T0)
    (second,) = cnd.merge(first, [Condition("Ready", "False", "RollingOut", "1/2")], now=T1)
    assert second.last_transition_time == T0
    assert (second.reason, second.message) == ("RollingOut", "1/2")


def test_status_change_moves_transition_time() -> None:
    first = cnd.merge(None, [Condition("Ready", "False", "Deploying")], now=T0)
    (second,) = cnd.merge(first, [Condition("Ready", "True", "EngineReady")], now=T1)
    assert second.last_transition_time == T1


def test_other_types_are_kept_and_order_is_stable() -> None:
    current = [
        ConditionStatus(type="Custom", status="True", reason="X"),
        ConditionStatus(type="SLOMet", status="True", reason="Met"),
    ]
    merged = cnd.merge(current, [Condition("Planned", "True", "Planned")], now=T0, generation=4)
    assert [c.type for c in merged] == ["Planned", "SLOMet", "Custom"]
    assert merged[0].observed_generation == 4 and merged[2] is current[0]
    slo_met = cnd.find(merged, "SLOMet")
    assert slo_met is not None and slo_met.status == "True" and cnd.find(merged, "Ready") is None


def test_merge_is_idempotent() -> None:
    updates = [
        Condition("Planned", "True", "Planned", "ok"),
        Condition("Ready", "False", "Deploying"),
    ]
    once = cnd.merge(None, updates, now=T0, generation=1)
    assert cnd.merge(once, updates, now=T1, generation=1) == once


def test_now_is_rfc3339_utc_seconds() -> None:
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", cnd.now_iso())
