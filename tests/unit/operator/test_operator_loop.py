"""The feedback loop's glue: metric readings in, status out (no cluster, no Prometheus)."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from operator_fakes import make_plan

from rooftop_api.conditions import Condition
from rooftop_api.spec import ServingTargetStatus
from rooftop_control import control
from rooftop_control.calibration import CalibrationConfig, TrimConfig
from rooftop_control.readings import MetricState, Observation, Reading
from rooftop_control.traffic import Bursts, Lengths, Traffic
from rooftop_operator import loop
from rooftop_operator.metrics_client import TargetMetrics
from rooftop_operator.specs import TargetRef, parse_spec
from rooftop_planner.catalog import load_catalog
from rooftop_planner.plan import Plan


def snapshot(**readings: Reading) -> TargetMetrics:
    return TargetMetrics(readings)


@pytest.mark.parametrize(
    ("raw", "state", "value"),
    [
        (Reading(0.05, MetricState.OK), MetricState.OK, 50.0),  # s -> ms
        (Reading(math.inf, MetricState.OK), MetricState.OK, loop.INF_MS),
        (Reading(math.nan, MetricState.NAN), MetricState.NAN, None),
        (Reading(math.nan, MetricState.STALE), MetricState.STALE, None),
        (Reading(), MetricState.MISSING, None),  # unknown stays unknown
    ],
)
def test_latencies_become_ms(raw: Reading, state: MetricState, value: float | None) -> None:
    got = loop.observation(snapshot(tpot_s=raw), 1, 0).tpot_ms
    assert got.state is state
    assert got.value == pytest.approx(value) if value is not None else math.isnan(got.value)


def test_observation_falls_back_to_completions() -> None:
    ok = Reading(1.0, MetricState.OK)
    snap = snapshot(
        ttft_s=Reading(0.4, MetricState.OK),
        requests_per_second=Reading(math.nan, MetricState.NAN),
        completions_per_second=Reading(3.0, MetricState.OK),
        running=ok, waiting=ok, kv_usage_ratio=ok,
    )  # fmt: skip
    obs = loop.observation(snap, 2, 1)
    assert obs.requests_per_second.value == 3.0  # deriv needs two samples; completions do
    assert obs.ttft_ms.value == pytest.approx(400.0)
    assert (obs.ready_replicas, obs.pending_replicas) == (2, 1)
    assert obs.tpot_ms.state is MetricState.MISSING


def test_the_step_batch_is_a_count_ratio_passed_on_as_read() -> None:
    batch = Reading(12.5, MetricState.OK)
    assert loop.observation(snapshot(step_batch=batch), 2, 0).step_batch == batch
    assert loop.observation(snapshot(), 2, 0).step_batch.state is MetricState.MISSING


def test_a_draining_queue_is_no_negative_rate() -> None:
    snap = snapshot(requests_per_second=Reading(-0.5, MetricState.OK))
    assert loop.observation(snap, 1, 0).requests_per_second.value == 0.0


def test_pod_counts() -> None:
    dep = {"spec": {"replicas": 4}, "status": {"readyReplicas": 3}}
    assert loop.pod_counts(dep) == (4, 3, 1)
    assert loop.pod_counts(None) == (0, 0, 0)


def test_outdated_pods_are_those_a_rollout_has_yet_to_replace() -> None:
    # A surge rollout of 4 replicas: 2 new pods (1 still starting) beside 3 old ones,
    # every desired pod ready. Pending by the desired count says 0; the old template's
    # pods say a rollout runs.
    rolling = {"spec": {"replicas": 4},
               "status": {"replicas": 5, "updatedReplicas": 2, "readyReplicas": 4}}  # fmt: skip
    assert loop.pod_counts(rolling) == (4, 4, 0)
    assert loop.outdated_pods(rolling) == 3
    # A scale-up's new pods run the current template: no rollout.
    scaling = {"spec": {"replicas": 6},
               "status": {"replicas": 6, "updatedReplicas": 6, "readyReplicas": 4}}  # fmt: skip
    assert loop.outdated_pods(scaling) == 0
    assert loop.outdated_pods({"spec": {"replicas": 1}}) == 0
    assert loop.outdated_pods(None) == 0
    assert loop.observation(snapshot(), 4, 0, 3).outdated_replicas == 3


def test_status_update_is_json_clean() -> None:
    plan = make_plan(
        gpu="l4",
        tp=8,
        replicas=2,
        max_num_seqs=64,
        weight_dtype="fp8",
        kv_dtype="fp8",
        max_model_len=8192,
        usd_per_hour=12.8,
    )
    status = ServingTargetStatus(plan=plan.to_status())
    obs = Observation(tpot_ms=Reading(), ready_replicas=2)
    d = _decision(replicas=3)
    out = loop.status_update(status, d, obs, plan, "2026-01-01T00:00:00Z", 60.0).stored()
    json.dumps(out, allow_nan=False)
    assert out["plan"]["replicas"] == 3 and out["plan"]["usdPerHour"] == pytest.approx(19.2)
    assert "tpotMs" not in out["observed"]  # missing stays missing, not 0
    assert {c["type"] for c in out["conditions"]} == {"SLOMet", "WithinBudget"}


def test_status_shows_the_served_workload_and_rewrites_it_only_when_it_moves() -> None:
    """``status.observed.workload``: what the loop plans with; a 15-minute figure's drift
    within its noise (5 %) does not rewrite status every tick."""
    served = Traffic(
        prompt=Lengths(1146.6, (240.0, 884.0, 2221.0, 4051.0)),
        output=Lengths(260.3, (47.0, 211.0, 432.0, 1012.0)),
        observed=True,
    )
    d = _decision(replicas=2)
    d = replace(d, state=replace(d.state, traffic=served))
    out = loop.observed_status(d, Observation(), "t").model_dump(by_alias=True)
    assert out["workload"] == {
        "promptTokens": {"mean": 1147.0, "p50": 884.0, "p90": 2221.0, "p99": 4051.0},
        "outputTokens": {"mean": 260.0, "p50": 211.0, "p90": 432.0, "p99": 1012.0},
        "requests": None,
        "arrivalDispersion": None,
    }
    before = loop.observed_status(d, Observation(), "t")

    def with_prompt_p90(p90: float) -> Any:
        prompt = Lengths(1151.0, (241.0, 880.0, p90, 4060.0))
        moved = replace(d, state=replace(d.state, traffic=replace(served, prompt=prompt)))
        return loop.observed_status(moved, Observation(), "t2")

    assert not loop.observed_changed(before, with_prompt_p90(2300.0), 60.0)  # within 5 %
    assert loop.observed_changed(before, with_prompt_p90(2500.0), 60.0)
    # the debug log names the figure that moved, not the others rewritten with it
    moved = loop.observed_news(before, with_prompt_p90(2500.0), 60.0)
    assert moved == ["observed.workload.promptTokens.p90"]
    assert loop.observed_status(_decision(2), Observation(), "t").workload is None


def test_a_served_length_is_rewritten_beyond_the_noise_of_the_requests_that_set_it() -> None:
    """Over 2,700 served requests the mean rests on all of them and moves by about
    3·√(2/2700) = 8.2 % by chance; the p99 rests on the 27 beyond it and moves by about
    3·√(2/27) = 82 %: a steady target's p99 wandering by half is no news."""
    served = Traffic(
        prompt=Lengths(1000.0, (700.0, 1000.0, 2300.0, 4600.0)),
        output=Lengths(250.0, (170.0, 250.0, 580.0, 1150.0)),
        observed=True,
    )
    d = _decision(replicas=2)

    def status(mean: float, p99: float, requests: float = 2700.0) -> Any:
        prompt = Lengths(mean, (700.0, 1000.0, 2300.0, p99))
        moved = replace(d, state=replace(d.state, traffic=replace(served, prompt=prompt)))
        obs = Observation(served_requests=Reading.of(requests))
        return loop.observed_status(moved, obs, "t")

    before = status(1000.0, 4600.0)
    assert before.workload is not None and before.workload.requests == 2700
    assert loop.observed_news(before, status(1000.0, 6900.0), 60.0) == []
    assert loop.observed_news(before, status(1000.0, 8900.0), 60.0) == [
        "observed.workload.promptTokens.p99"
    ]
    assert loop.observed_news(before, status(1100.0, 4600.0), 60.0) == [
        "observed.workload.promptTokens.mean"
    ]
    few = status(1000.0, 4600.0, requests=300.0)
    assert loop.observed_news(few, status(1100.0, 4600.0, requests=300.0), 60.0) == []  # 24 %


def test_a_condition_message_is_rewritten_when_its_words_change_not_its_figures() -> None:
    """On a quiet tick (no figure beyond its noise) a condition keeps its stored
    message while only its numbers moved; a message that gains a clause (the prefix
    cache's hit ratio, once the loop plans with it) is written all the same."""
    plan = make_plan(gpu="l4", replicas=1, usd_per_hour=0.8)
    served = "served over 15m: prompts 64 tokens mean, outputs 32"

    def decided(message: str) -> control.Decision:
        workload = Condition(type="WorkloadObserved", status="True", reason="AsDeclared",
                             message=f"{message}; within 25% of spec.workload")  # fmt: skip
        d = _decision(replicas=1)
        return replace(d, conditions=(*d.conditions, workload), previous_replicas=1)

    obs = Observation(ready_replicas=1)
    first = loop.status_update(ServingTargetStatus(plan=plan.to_status()), decided(served),
                               obs, plan, "t0", 60.0)  # fmt: skip

    def message(status: ServingTargetStatus) -> str | None:
        found = next(c for c in status.conditions or [] if c.type == "WorkloadObserved")
        return found.message

    moved = served.replace("64", "65")
    assert message(loop.status_update(first, decided(moved), obs, plan, "t1", 60.0)) == (
        message(first)
    )
    hits = f"{served}, 50% of prompt tokens prefix-cache hits"
    assert "prefix-cache hits" in str(
        message(loop.status_update(first, decided(hits), obs, plan, "t1", 60.0))
    )


def test_status_shows_the_served_burstiness_and_rewrites_it_beyond_its_noise() -> None:
    """The variance of 60 interval counts moves by about √(2/59) of itself between two
    ranges: a steady bursty target's status must not follow that, a change of burstiness
    must show."""
    served = Traffic(
        prompt=Lengths(2048.0, (300.0, 1500.0, 5188.0, 9000.0)),
        output=Lengths(28.0, (5.0, 20.0, 55.0, 200.0)),
        observed=True,
        bursts=Bursts(63.27, 2.4),
    )
    d = _decision(replicas=5)

    def status(dispersion: float) -> Any:
        bursts = Bursts(dispersion, 2.4)
        moved = replace(d, state=replace(d.state, traffic=replace(served, bursts=bursts)))
        return loop.observed_status(moved, Observation(), "t")

    before = status(63.27)
    assert before.workload is not None and before.workload.arrival_dispersion == 63.0
    assert not loop.observed_changed(before, status(80.0), 60.0)  # within its noise
    assert loop.observed_changed(before, status(120.0), 60.0)


def test_status_changes_names_what_a_write_changes() -> None:
    """The debug log says which figures made a tick write status."""
    old = ServingTargetStatus.read(
        {
            "observed": {"tpotMs": 30.0, "running": 4.0},
            "conditions": [{"type": "SLOMet", "status": "True", "reason": "SLOMet",
                            "message": "TPOT 30 ms"}],
        }
    )  # fmt: skip
    new = ServingTargetStatus.read(
        {
            "observed": {"tpotMs": 36.0, "running": 4.0, "waiting": 1.0},
            "conditions": [{"type": "SLOMet", "status": "True", "reason": "SLOMet",
                            "message": "TPOT 36 ms"}],
        }
    )  # fmt: skip
    assert loop.status_changes(old, new) == [
        "conditions.SLOMet.message",
        "observed.tpotMs",
        "observed.waiting",
    ]
    assert loop.status_changes(old, old) == []


def _decision(replicas: int) -> control.Decision:
    conds = (
        Condition(type="SLOMet", status="Unknown", reason="MetricsUnavailable"),
        Condition(type="WithinBudget", status="True", reason="WithinBudget"),
    )
    state = control.initial_state(replicas, 64)
    return control.Decision(replicas, 64, "scale up 2 -> 3: TPOT 120 ms > SLO 100 ms", conds,
                            state, MetricState.OK, replicas, 2, 64,
                            cause=control.Cause.SLO_VIOLATION)  # fmt: skip


def test_decision_labels() -> None:
    assert loop.decision_labels(_decision(3)) == ("up", "slo_violation")
    assert loop.decision_labels(replace(_decision(2), cause=control.Cause.CALIBRATION)) == (
        "replan", "calibration"
    )  # fmt: skip


def test_unavailable_metrics_say_why_and_that_replicas_hold() -> None:
    d = loop.explain_unavailable(
        _decision(3), ["prometheus unreachable: ConnectionRefused"], "http://prom:9090"
    )
    slo = next(c for c in d.conditions if c.type == "SLOMet")
    assert "Prometheus at http://prom:9090: prometheus unreachable" in slo.message
    assert "holding 3 replica(s)" in slo.message
    budget = next(c for c in d.conditions if c.type == "WithinBudget")
    assert budget.message == ""  # other conditions untouched


def test_silent_engines_are_told_apart_from_a_down_prometheus() -> None:
    d = loop.explain_unavailable(_decision(2), [], "http://prom:9090")
    slo = next(c for c in d.conditions if c.type == "SLOMet")
    assert "no engine series" in slo.message and "Prometheus at" not in slo.message


def test_silent_engines_name_the_pod_monitor_label_to_set() -> None:
    """A default kube-prometheus-stack selects PodMonitors by `release`; an unlabelled
    engine PodMonitor is never scraped and the loop is blind: the condition says which
    chart value fixes it."""
    ref = TargetRef(name="chat", namespace="ns", uid="u", generation=1)
    hint = loop.scrape_hint(ref, {})
    d = loop.explain_unavailable(_decision(2), [], "http://prom:9090", hint)
    slo = next(c for c in d.conditions if c.type == "SLOMet")
    assert "PodMonitor ns/chat-engine" in slo.message
    assert "engine.podMonitor.labels" in slo.message and "release=" in slo.message
    labelled = loop.scrape_hint(ref, {"release": "kps"})
    assert "labels release=kps" in labelled and "engine.podMonitor.labels" not in labelled


def _chat_target() -> tuple[Any, TargetRef, Plan]:
    """The simulated chat example's spec, a reference to it and a 1x L4 plan."""
    doc = yaml.safe_load((Path(__file__).parents[3] / "examples/simulated-chat.yaml").read_text())
    body = {**doc, "metadata": {"namespace": "ns", "name": "chat", "uid": "u1", "generation": 1}}
    plan = make_plan(
        gpu="l4",
        tp=1,
        replicas=1,
        max_num_seqs=64,
        weight_dtype="bf16",
        kv_dtype="auto",
        max_model_len=8192,
        usd_per_hour=0.8,
    )
    return parse_spec(doc["spec"]), TargetRef.from_body(body), plan


def test_an_operator_restart_resumes_what_the_loop_learned() -> None:
    """The trim is learned over many windows (near 1.6 where the planner is 1.3x
    optimistic); a restart that started it over at 1 would under-serve until relearned.
    The factor keeps its weight: with none, the first window would replace it."""
    spec, ref, plan = _chat_target()
    learned = _decision(replicas=3)
    calibration = replace(learned.state.calibration, factor=1.2, samples=40)
    learned = replace(learned, state=replace(learned.state, trim=1.6, calibration=calibration))
    empty = ServingTargetStatus()
    status = loop.status_update(empty, learned, Observation(), plan, "2026-01-01T00:00Z", 60.0)
    stored = ServingTargetStatus.read(status.stored())  # as a restarted operator reads it
    assert stored.observed is not None and stored.observed.latency_trim == 1.6
    restarted = loop._memory({}, ref, spec, plan, stored, 3, load_catalog())
    assert restarted.state.trim == 1.6
    assert (restarted.state.calibration.factor, restarted.state.calibration.samples) == (1.2, 40)
    fresh = loop._memory({}, ref, spec, plan, empty, 3, load_catalog())
    assert (fresh.state.trim, fresh.state.calibration.samples) == (1.0, 0)


@pytest.mark.parametrize(
    ("value", "samples"), [(None, 0), (-3, 0), (2.5, 0), (True, 0), ("7", 0), (7, 7)]
)
def test_calibration_samples_from_status_are_a_count_or_nothing(
    value: object, samples: int
) -> None:
    assert loop.resumed_samples(value) == samples


@pytest.mark.parametrize(
    ("value", "trim"),
    [(None, 1.0), ("junk", 1.0), (math.nan, 1.0), (math.inf, 1.0), (0.01, 0.5), (9.0, 2.0),
     (1.25, 1.25), ("1.25", 1.25)],
)  # fmt: skip
def test_a_trim_edited_into_status_is_kept_within_its_bounds(value: object, trim: float) -> None:
    assert loop.resumed(value, TrimConfig()) == trim


@pytest.mark.parametrize(("value", "factor"), [("abc", 1.0), ([], 1.0), (0.1, 0.5), (7, 3.0)])
def test_a_factor_edited_into_status_cannot_stop_the_loop(value: object, factor: float) -> None:
    """It used to be float(value): a string there raised on every tick."""
    assert loop.resumed(value, CalibrationConfig()) == factor
    status = ServingTargetStatus.read({"observed": {"calibrationFactor": value}})
    spec, ref, plan = _chat_target()
    mem = loop._memory({}, ref, spec, plan, status, 1, load_catalog())
    assert mem.state.calibration.factor == factor


def test_each_target_projects_demand_over_its_own_start_up() -> None:
    """A pod of a 70B model downloads 141 GB before it serves; one chart-wide 120 s
    would have the loop add it far too late. Each target's memory holds its own
    figure (rooftop_planner.lifecycle); a simulated engine starts in seconds."""
    spec, ref, plan = _chat_target()
    real = parse_spec({**spec.model_dump(by_alias=True, exclude_none=True), "mode": "vllm"})
    big = parse_spec({**real.model_dump(by_alias=True, exclude_none=True),
                      "model": "llama-3.1-70b"})  # fmt: skip
    catalog = load_catalog()
    empty = ServingTargetStatus()
    sim = loop._memory({}, ref, spec, plan, empty, 1, catalog)
    small = loop._memory({}, ref, real, plan, empty, 1, catalog)
    ref70 = replace(ref, uid="u70")
    large = loop._memory({}, ref70, big, replace(plan, tp=4), empty, 1, catalog)
    assert sim.startup_s < 10 < small.startup_s < 300 < large.startup_s
