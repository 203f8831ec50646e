"""The loop's scheduling: one task ticks every target kopf runs a ``presence`` daemon
for, instead of a kopf timer per target."""

from __future__ import annotations

import asyncio
import contextvars
from types import SimpleNamespace
from typing import Any

import kopf
import pytest

from rooftop_operator import loop, wiring
from rooftop_operator.runtime import Runtime
from rooftop_operator.settings import LoopSettings, OperatorConfig

RUNTIME = SimpleNamespace(alive=lambda uid: True)  # what ``tick`` asks of the runtime


def member(name: str, runtime: Any = RUNTIME) -> loop.Member:
    memo = SimpleNamespace(runtime=runtime)
    return loop.Member({"metadata": {"name": name, "namespace": "ns"}}, memo, {})


@pytest.fixture
def decided(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The targets ``feedback`` was called for, in order; a target named ``bad`` fails."""
    calls: list[str] = []

    async def feedback(body: Any, memo: Any, engine_deployments: Any) -> None:
        calls.append(body["metadata"]["name"])
        if body["metadata"]["name"] == "bad":
            raise RuntimeError("a bug")
        await asyncio.sleep(0)

    monkeypatch.setattr(loop, "feedback", feedback)
    return calls


async def test_a_tick_decides_once_for_every_member(decided: list[str]) -> None:
    members = loop.Members()
    for i in range(25):
        members.join(f"uid-{i}", member(f"t{i}"))
    assert await loop.tick(members, workers=4) == 25
    assert sorted(decided) == sorted(f"t{i}" for i in range(25))


async def test_each_decision_runs_in_its_daemons_context(monkeypatch: pytest.MonkeyPatch) -> None:
    """kopf.event posts through a queue kopf sets in a context variable of each object's
    task; the loop's own task lacks it, so Scaled events would be lost without this."""
    queue: contextvars.ContextVar[str] = contextvars.ContextVar("queue")
    seen: dict[str, str | None] = {}

    async def feedback(body: Any, memo: Any, engine_deployments: Any) -> None:
        seen[body["metadata"]["name"]] = queue.get(None)

    monkeypatch.setattr(loop, "feedback", feedback)
    members = loop.Members()
    for name in ("a", "b"):
        token = queue.set(f"queue of {name}")
        members.join(name, member(name))  # presence captures the context it runs in
        queue.reset(token)
    await loop.tick(members)
    assert seen == {"a": "queue of a", "b": "queue of b"} and queue.get(None) is None


async def test_a_tick_lets_kopfs_other_work_run_between_decisions(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Decisions that never suspend (most of them) must not hold the event loop, where
    kopf processes the watches, for a whole tick."""
    order: list[str] = []

    async def feedback(body: Any, memo: Any, engine_deployments: Any) -> None:
        order.append("decision")

    async def watch() -> None:
        for _ in range(30):
            order.append("watch")
            await asyncio.sleep(0)

    monkeypatch.setattr(loop, "feedback", feedback)
    members = loop.Members()
    for i in range(30):
        members.join(f"uid-{i}", member(f"t{i}"))
    watching = asyncio.create_task(watch())
    await loop.tick(members, workers=1)
    await watching
    first_watch, last_decision = order.index("watch"), len(order) - order[::-1].index("decision")
    assert first_watch < last_decision - 20  # the watch ran while the tick went on


async def test_one_failing_target_costs_only_its_own_decision(
    decided: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    members = loop.Members()
    for name in ("a", "bad", "c"):
        members.join(f"uid-{name}", member(name))
    assert await loop.tick(members, workers=1) == 3
    assert decided == ["a", "bad", "c"]
    assert "feedback ns/bad failed" in caplog.text and "a bug" in caplog.text


async def test_a_target_whose_deletion_arrived_is_not_decided(decided: list[str]) -> None:
    runtime = Runtime(kube=Any, catalog=Any, plan=Any)
    members = loop.Members()
    members.join("uid-gone", member("gone", runtime))
    members.join("uid-kept", member("kept", runtime))
    runtime.deleted.add("uid-gone")
    await loop.tick(members)
    assert decided == ["kept"]


async def test_presence_is_membership_until_kopf_stops_the_daemon() -> None:
    """kopf stops the daemons of a standby replica (peering) and of a deleted target:
    the loop then has nothing to decide for them."""
    from kopf._cogs.aiokits import aioenums
    from kopf._core.intents import stoppers

    runtime = Runtime(kube=Any, catalog=Any, plan=Any)
    members = runtime.loop.members
    stopper = stoppers.DaemonStopper()
    stopped = aioenums.AsyncFlagWaiter(stopper)  # what kopf hands an async daemon
    body = kopf.Body({"metadata": {"name": "t", "namespace": "ns", "uid": "u1"}})
    memo = kopf.Memo(runtime=runtime)
    daemon = asyncio.create_task(
        loop.presence(body=body, memo=memo, uid="u1", stopped=stopped, engine_deployments={})
    )
    await asyncio.sleep(0)
    assert [uid for uid, _ in members.snapshot()] == ["u1"]
    assert members.snapshot()[0][1].body is body  # kopf's live view, not a copy
    stopper.set(reason=stoppers.DaemonStoppingReason.OPERATOR_PAUSING)
    await asyncio.wait_for(daemon, 1.0)
    assert len(members) == 0


def test_a_leaving_daemon_does_not_remove_its_successor() -> None:
    """kopf spawns a target's daemon again after a pause; the old one's exit must not
    take the new one's membership with it."""
    members = loop.Members()
    old, new = member("t"), member("t")
    members.join("u1", old)
    members.join("u1", new)
    members.leave("u1", old)
    assert members.snapshot() == [("u1", new)]


async def test_the_loop_ticks_every_interval_and_a_slow_tick_delays_the_next(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ticks: list[float] = []
    clock = asyncio.get_running_loop().time

    async def slow_tick(members: loop.Members) -> int:
        ticks.append(clock())
        await asyncio.sleep(0.15 if len(ticks) == 2 else 0)
        return 0

    monkeypatch.setattr(loop, "tick", slow_tick)
    start = clock()
    task = asyncio.create_task(loop.run_loop(0.1, loop.Members()))
    await asyncio.sleep(0.55)
    task.cancel()
    gaps = [b - a for a, b in zip([start, *ticks], ticks, strict=False)]
    assert gaps[0] == pytest.approx(0.1, abs=0.04)  # one interval after start
    assert gaps[2] == pytest.approx(0.15, abs=0.04)  # after the slow one ends, not two at once
    assert len(ticks) in (4, 5)


def test_the_loop_registers_one_daemon_without_finalizer_and_no_timer() -> None:
    registry = kopf.OperatorRegistry()
    wiring.register_handlers(OperatorConfig(loop=LoopSettings(interval_s=3.0)), registry)
    spawning = registry._spawning.get_all_handlers()
    daemons = [(h.id, h.requires_finalizer) for h in spawning if h.id != "replan_waiting"]
    assert daemons == [("presence", False)]  # the one timer is the inventory's replan
    assert {h.id for h in registry._activities.get_all_handlers()} >= {"feedback_loop"}
