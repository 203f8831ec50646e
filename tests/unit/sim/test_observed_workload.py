"""The loop plans for the traffic it serves. Declared as a spreadsheet would have it
(512/128 mean prompt/output tokens where the bundled chat example's trace, Azure's
conversations, has 1,147/260), the loop planned with the declared lengths, scaled 3 -> 1
under steady load and kept 76 % of requests within a p90 TPOT bound; with the served
lengths it keeps the percentile. The example itself declares its trace's workload, and
its plan's price is what the loop spends on it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rooftop_api.spec import aimed_share
from rooftop_control import control, traffic
from rooftop_control.calibration import TrimConfig
from rooftop_control.readings import MetricState, Observation, Reading
from rooftop_control.traffic import Lengths, Traffic
from rooftop_planner import tail
from rooftop_sim import simulate

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "simulated-chat.yaml"
TRACE = ROOT / "examples" / "traces" / "azure_conv_excerpt.csv"


# What a spreadsheet would declare for the example's trace: 4 req/s of 512/128 tokens.
SPREADSHEET = {
    "requests_per_second": 4.0,
    "prompt_tokens": {"mean": 512, "p90": 1024},
    "output_tokens": {"mean": 128, "p90": 256},
}


@pytest.fixture(scope="module")
def scn() -> simulate.SimScenario:
    """The bundled example on its trace, as declared."""
    spec = simulate.load_spec(str(EXAMPLE))
    return simulate.scenario(spec, simulate.workload_from_trace(str(TRACE)), seed=0)


@pytest.fixture(scope="module")
def short() -> simulate.SimScenario:
    """The example declaring ``SPREADSHEET``'s workload on the same trace."""
    spec = simulate.load_spec(str(EXAMPLE))
    workload = spec.workload.model_validate({**spec.workload.model_dump(), **SPREADSHEET})
    spec = spec.model_copy(update={"workload": workload})
    return simulate.scenario(spec, simulate.workload_from_trace(str(TRACE)), seed=0)


def test_the_bundled_example_keeps_its_percentile_at_the_plans_price(
    scn: simulate.SimScenario,
) -> None:
    _, summary = simulate.run(scn, "rooftop")
    assert summary["slo_attainment_tpot"] >= scn.spec.slo.tpot_percentile.quantile
    spent = summary["usd"] / (summary["horizon_s"] / 3600.0)
    assert spent <= 1.15 * scn.plan.usd_per_hour


def test_a_spreadsheets_workload_still_keeps_the_percentile(short: simulate.SimScenario) -> None:
    _, summary = simulate.run(short, "rooftop")
    assert summary["slo_attainment_tpot"] >= short.spec.slo.tpot_percentile.quantile


def test_the_loop_ends_planning_with_the_traces_lengths(short: simulate.SimScenario) -> None:
    scn = short
    policy, _ = simulate.make_policy(scn, "rooftop")
    simulate.Cluster(scn.workload, scn.sim).run(policy)
    last = policy.decisions[-1]
    seen = last.state.traffic
    assert seen is not None and seen.observed
    # the trace's own means over the last 15 minutes (the whole 10-minute excerpt)
    assert seen.prompt.mean == pytest.approx(float(scn.workload.prompt_tokens.mean()), rel=0.1)
    assert seen.output.mean == pytest.approx(float(scn.workload.output_tokens.mean()), rel=0.1)
    (workload,) = [c for c in last.conditions if c.type == "WorkloadObserved"]
    assert workload.reason == "DiffersFromSpec"
    assert "spec.workload.promptTokens.mean is 512" in workload.message


def _served(requests: float, prompt: Lengths, output: Lengths) -> Observation:
    figures = {"served_requests": Reading(requests, MetricState.OK)}
    for name, lengths in (("prompt", prompt), ("output", output)):
        figures[f"served_{name}_tokens"] = Reading(lengths.mean, MetricState.OK)
        for q, value in zip((10, 50, 90, 99), lengths.quantiles, strict=True):
            figures[f"served_{name}_tokens_p{q}"] = Reading(value, MetricState.OK)
    return Observation(**figures)  # type: ignore[arg-type]


def test_longer_served_answers_make_the_planner_ask_for_more_replicas(
    short: simulate.SimScenario,
) -> None:
    """The real planner, pinned to the short declaration's shape: twice the answers'
    length is twice the decode work per request."""
    scn = short
    declared = traffic.declared(scn.spec.workload)
    doubled = Traffic(
        prompt=declared.prompt,
        output=Lengths(declared.output.mean * 2, tuple(2 * v for v in declared.output.quantiles)),
        observed=True,
    )
    at_declared = scn.planner.size(8.0, 1.0)
    at_served = scn.planner.size(8.0, 1.0, traffic=doubled)
    assert at_served.replicas > at_declared.replicas


def test_decide_sizes_with_the_served_lengths_once_enough_requests_finished(
    short: simulate.SimScenario,
) -> None:
    scn = short
    cfg = control.config_from_spec(scn.spec, scn.planner, scn.usd_per_replica_hour)
    long = Lengths(1200.0, (300.0, 800.0, 2400.0, 6000.0))
    longer_answers = Lengths(260.0, (40.0, 200.0, 450.0, 1000.0))
    base = Observation(
        requests_per_second=Reading(8.0, MetricState.OK),
        running=Reading(20.0, MetricState.OK),
        waiting=Reading(0.0, MetricState.OK),
        kv_usage_ratio=Reading(0.3, MetricState.OK),
        ready_replicas=2,
    )
    served = _served(500, long, longer_answers)
    figures = {f: getattr(served, f) for f in served.__dataclass_fields__ if f.startswith("served")}
    observed = Observation(**{**base.__dict__, **figures})
    state = control.initial_state(2, 32)
    declared = control.decide(state, base, 1_000.0, cfg)
    planned = control.decide(state, observed, 1_000.0, cfg)
    assert declared.state.traffic is not None and not declared.state.traffic.observed
    assert planned.state.traffic is not None and planned.state.traffic.observed
    assert planned.needed_replicas > declared.needed_replicas


@pytest.mark.parametrize(("percentile", "target"), [(0.5, 0.75), (0.9, 0.95), (0.99, 0.995)])
def test_the_loops_aim_follows_the_targets_percentile(percentile: float, target: float) -> None:
    assert aimed_share(percentile) == pytest.approx(target)
    trim = TrimConfig.for_percentile(percentile)
    assert trim.target == pytest.approx(target) and target < trim.slack < 1.0


def test_the_example_loop_and_its_oracle_aim_at_the_example_percentile(
    scn: simulate.SimScenario,
) -> None:
    cfg = control.config_from_spec(scn.spec, scn.planner, scn.usd_per_replica_hour)
    assert cfg.trim.target == pytest.approx(0.95)  # p90: 90 % plus half the 10 % allowed
    assert scn.oracle_config().tpot_share == pytest.approx(0.9)


def test_the_tail_weighs_the_shortest_answers() -> None:
    """Equal sixths put the shortest component at the p8 answer; the strata reach p1."""
    points = tail.output_points(lambda q: 1000.0 * q)
    assert points[0] == pytest.approx(10.0) and tail.OUTPUT_WEIGHTS[0] == pytest.approx(0.02)
    assert tail.OUTPUT_WEIGHTS.sum() == pytest.approx(1.0)


def test_simulate_reports_the_plans_price_against_what_the_run_spent(
    short: simulate.SimScenario,
) -> None:
    """The plan prices one replica for the declared 512/128 tokens; the loop serving the
    trace's 1,150/260 spends more, and the report says how much."""
    scn = short
    _, summary = simulate.run(scn, "rooftop")
    assert summary["plan_usd_per_hour"] == pytest.approx(scn.plan.usd_per_hour, abs=1e-3)
    spent = summary["usd"] / (summary["horizon_s"] / 3600.0)
    (note,) = [n for n in summary["notes"] if n.startswith("the plan costs")]
    assert f"this run spent ${spent:.2f}/h, {spent / scn.plan.usd_per_hour:.2f}x the plan" in note
    assert spent > scn.plan.usd_per_hour


# A 70B declared with 24k-token prompts at 2 req/s: four B200s a pod, their batch cap
# planned for prompts twenty times longer than the excerpt's. The served lengths change
# the cap, whose rollout (no surge room at the budget) replaces one pod at a time.
LONG_PROMPTS = """\
apiVersion: rooftop.dev/v1alpha1
kind: ServingTarget
metadata:
  name: long-declared
spec:
  model: llama-3.1-70b
  mode: simulated
  slo: {tpotMs: 50, tpotPercentile: p90, ttftMs: 2000, ttftPercentile: p90}
  workload:
    requestsPerSecond: 2
    promptTokens: {mean: 24000, p90: 32000}
    outputTokens: {mean: 260, p90: 432}
  budget: {usdPerHour: 200}
"""


def test_a_budget_bound_cap_rollout_gives_back_the_pods_the_planner_does_not_need(
    tmp_path: Path,
) -> None:
    """Holding every pod while the rollout ran kept 7 (6.91 on average over the ten
    minutes, $30.26) where the served traffic needs 1: the rollout takes a pod's
    start-up per pod. Scaling down on top of the pod it holds out of service keeps the
    percentile and ends on the one pod."""
    manifest = tmp_path / "long.yaml"
    manifest.write_text(LONG_PROMPTS)
    spec = simulate.load_spec(str(manifest))
    scn = simulate.scenario(spec, simulate.workload_from_trace(str(TRACE)), seed=0)
    assert (scn.plan.gpu, scn.plan.tp) == ("b200", 4)
    result, summary = simulate.run(scn, "rooftop")
    assert summary["slo_attainment_tpot"] >= 0.9
    assert summary["mean_replicas"] < 5.0
    assert result.timeline[-1].replicas <= 2
