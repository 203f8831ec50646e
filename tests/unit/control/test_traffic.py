"""The workload the loop plans for (``traffic``): the declared prior until the served
lengths are known, then those, as a histogram the planner reads like a spec's."""

from __future__ import annotations

import math
from dataclasses import replace
from statistics import NormalDist

import pytest

from rooftop_api.spec import ServingTargetSpec, TokenLengths
from rooftop_control import traffic
from rooftop_control.readings import MetricState, Observation, Reading
from rooftop_control.traffic import Bursts, Lengths, Traffic
from rooftop_planner import drafters
from rooftop_planner.bursts import burst_rate
from rooftop_planner.workload import from_spec

Z = NormalDist()


def ok(value: float) -> Reading:
    return Reading(value, MetricState.OK)


def lognormal(median: float, sigma: float) -> Lengths:
    """Exact mean and quantiles of a log-normal, tokens."""
    knots = tuple(median * math.exp(sigma * Z.inv_cdf(q)) for q in traffic.QUANTILES)
    return Lengths(mean=median * math.exp(sigma**2 / 2), quantiles=knots)


def served(requests: float, prompt: Lengths, output: Lengths) -> Observation:
    figures = {"served_requests": ok(requests)}
    for name, lengths in (("prompt", prompt), ("output", output)):
        figures[f"served_{name}_tokens"] = ok(lengths.mean)
        for q, value in zip((10, 50, 90, 99), lengths.quantiles, strict=True):
            figures[f"served_{name}_tokens_p{q}"] = ok(value)
    return Observation(**figures)  # type: ignore[arg-type]


PROMPT, OUTPUT = lognormal(800.0, 0.9), lognormal(180.0, 0.7)
PRIOR = Traffic(prompt=lognormal(400.0, 0.5), output=lognormal(100.0, 0.5))


def test_too_few_requests_keep_what_the_loop_had() -> None:
    thin = served(traffic.MIN_REQUESTS - 1, PROMPT, OUTPUT)
    assert traffic.update(PRIOR, thin) is PRIOR
    enough = traffic.update(PRIOR, served(traffic.MIN_REQUESTS, PROMPT, OUTPUT))
    assert enough.observed and enough.prompt == PROMPT and enough.output == OUTPUT


def test_missing_lengths_keep_the_last_served_figures() -> None:
    seen = traffic.update(PRIOR, served(500, PROMPT, OUTPUT))
    gap = replace(served(500, PROMPT, OUTPUT), served_output_tokens_p99=Reading())
    assert traffic.update(seen, gap) is seen
    assert traffic.update(seen, Observation()) is seen


def test_quantiles_that_interpolation_made_fall_are_made_non_decreasing() -> None:
    dipped = replace(served(500, PROMPT, OUTPUT), served_prompt_tokens_p90=ok(1.0))
    knots = traffic.update(PRIOR, dipped).prompt.quantiles
    assert list(knots) == sorted(knots)


@pytest.mark.parametrize("q", [0.02, 0.25, 0.75, 0.95, 0.999])
def test_between_and_beyond_the_knots_a_lognormal_is_exact(q: float) -> None:
    median, sigma = 800.0, 0.9
    assert PROMPT.quantile(q) == pytest.approx(median * math.exp(sigma * Z.inv_cdf(q)))


def test_the_planners_histogram_keeps_the_mean_and_the_tail() -> None:
    dist = from_spec(PROMPT.spec())
    assert dist.mean == pytest.approx(PROMPT.mean, rel=0.01)
    assert dist.quantile(0.9) == pytest.approx(PROMPT.p90, rel=0.1)
    assert dist.quantile(0.995) == pytest.approx(PROMPT.quantile(0.995), rel=0.03)


def test_a_spec_given_as_mean_only_is_every_request_that_long() -> None:
    prior = traffic.declared(
        ServingTargetSpec.model_validate(
            {
                "model": "llama-3.1-8b",
                "slo": {"tpotMs": 50},
                "workload": {"requestsPerSecond": 1, "promptTokens": {"mean": 512},
                             "outputTokens": {"mean": 128, "p90": 256}},
                "budget": {"usdPerHour": 10},
            }
        ).workload
    )  # fmt: skip
    assert prior.prompt.quantiles == (512.0,) * 4 and not prior.observed
    assert prior.output.mean == 128.0 and prior.output.p90 == pytest.approx(256.0)


def test_differences_name_the_field_and_the_figure_to_write() -> None:
    seen = Traffic(prompt=PROMPT, output=OUTPUT, observed=True)
    lines = traffic.differences(seen, PRIOR)
    assert any(
        line.startswith("spec.workload.promptTokens.mean is 453 but the traffic's is 1,199")
        and line.endswith("set it to about 1,200")
        for line in lines
    ), lines
    assert traffic.differences(seen, replace(seen, observed=False)) == []


def test_lengths_round_onto_a_grid_for_the_sizing_cache() -> None:
    grid = PROMPT.rounded(0.05)
    assert grid.rounded(0.05) == grid
    pairs = [(grid.mean, PROMPT.mean), *zip(grid.quantiles, PROMPT.quantiles, strict=True)]
    assert all(abs(math.log(a / b)) <= math.log(1.05) / 2 + 1e-9 for a, b in pairs)


def test_token_lengths_accept_the_histogram() -> None:
    assert isinstance(OUTPUT.spec(), TokenLengths) and OUTPUT.spec().histogram


def test_a_p90_within_a_histogram_buckets_reach_is_no_difference() -> None:
    """Every request 64 tokens long: vLLM's buckets 50-100 make the served p90 95."""
    spec = Traffic(prompt=Lengths(64.0, (64.0,) * 4), output=Lengths(32.0, (32.0,) * 4))
    seen = Traffic(
        prompt=Lengths(64.0, (55.0, 75.0, 95.0, 99.5)),
        output=Lengths(32.0, (23.0, 35.0, 47.0, 49.7)),
        observed=True,
    )
    assert traffic.differences(seen, spec) == []
    far = replace(seen, prompt=Lengths(64.0, (55.0, 75.0, 400.0, 900.0)))
    assert [d.split(" is ")[0] for d in traffic.differences(far, spec)] == [
        "spec.workload.promptTokens.p90"
    ]


def test_a_young_range_has_no_burstiness_yet() -> None:
    """75 s of a load at 2 req/s span five 15-s intervals: too few to tell bursts from
    chance (the real-vLLM e2e read 2 there)."""
    assert traffic.update(PRIOR, bursty(150, 2.0, 2.0)).bursts is None
    assert traffic.update(PRIOR, bursty(900, 2.0, 2.0)).bursts == Bursts(2.0, 2.0)


def bursty(requests: float, dispersion: float, rate: float) -> Observation:
    return replace(
        served(requests, PROMPT, OUTPUT),
        served_arrival_dispersion=ok(dispersion),
        served_requests_per_second=ok(rate),
    )


def test_the_served_burstiness_is_planned_at_the_rate_it_was_read_at() -> None:
    """Bursts are sized at the served range's rate, not at one window's (a burst's own
    window would count the burst twice); arrivals smoother than Poisson plan as Poisson."""
    seen = traffic.update(PRIOR, bursty(2000, 63.0, 2.4))
    assert seen.bursts == Bursts(63.0, 2.4)
    workload = seen.workload(9.0)
    assert workload.arrival_dispersion == 63.0 and workload.requests_per_second == 2.4
    assert traffic.update(PRIOR, bursty(2000, 0.7, 2.4)).bursts == Bursts(1.0, 2.4)


def test_a_window_without_bursts_keeps_the_last_ones() -> None:
    seen = traffic.update(PRIOR, bursty(2000, 63.0, 2.4))
    again = traffic.update(seen, served(500, PROMPT, OUTPUT))
    assert again.bursts == Bursts(63.0, 2.4)
    assert traffic.update(PRIOR, served(500, PROMPT, OUTPUT)).bursts is None


def test_the_latency_trim_scales_the_bursts_rate_as_the_windows() -> None:
    seen = traffic.update(PRIOR, bursty(2000, 63.0, 2.4))
    trimmed = seen.trimmed(1.5).bursts
    assert trimmed == Bursts(pytest.approx(94.0), pytest.approx(3.6))
    assert burst_rate(trimmed.requests_per_second, trimmed.dispersion, 0.95) == pytest.approx(
        1.5 * burst_rate(2.4, 63.0, 0.95)
    )
    assert seen.trimmed(1.0) is seen


def test_differences_name_burstiness_only_where_either_side_is_bursty() -> None:
    seen = traffic.update(PRIOR, bursty(2000, 63.0, 2.4))
    lines = traffic.differences(seen, PRIOR)
    assert any(
        line.startswith(
            "spec.workload.arrivalDispersion is 1 but the traffic's 15-s counts vary 63"
        )
        and line.endswith("set it to about 63")
        for line in lines
    ), lines
    declared = replace(PRIOR, bursts=Bursts(50.0, 2.4))  # within 2x: noise, not news
    assert not any("arrivalDispersion" in line for line in traffic.differences(seen, declared))
    near_poisson = traffic.update(PRIOR, bursty(2000, 1.8, 2.4))
    assert not any("arrivalDispersion" in line for line in traffic.differences(near_poisson, PRIOR))


def test_a_declared_burstiness_is_the_prior() -> None:
    spec = ServingTargetSpec.model_validate(
        {
            "model": "llama-3.1-8b",
            "slo": {"tpotMs": 50},
            "workload": {
                "requestsPerSecond": 2.4,
                "promptTokens": {"mean": 2048},
                "outputTokens": {"mean": 28},
                "arrivalDispersion": 63,
            },
            "budget": {"usdPerHour": 10},
        }
    )
    assert traffic.declared(spec.workload).bursts == Bursts(63.0, 2.4)


def test_bursts_are_sized_at_the_window_rate_only_when_it_is_clearly_falling() -> None:
    """The 15-minute mean lags a falling day: a chat target's window well below it is
    news; a code target's lull between bursts is within its window's noise, and a burst
    in the window must not be counted again on top of the bursts' own capacity."""
    chat, code = Bursts(1.5, 5.5), Bursts(63.0, 2.4)
    assert chat.reference(4.0) == 4.0  # below 5.5 by more than 2·√(1.5·5.5/60) ≈ 0.74
    assert chat.reference(5.0) == 5.5
    assert code.reference(0.1) == 2.4  # 2·√(63·2.4/60) ≈ 3.2: a lull, not a fall
    assert code.reference(9.7) == 2.4


def drafting(accepted: float, length: float) -> Observation:
    return replace(
        served(500, PROMPT, OUTPUT),
        served_accepted_per_draft=ok(accepted),
        served_draft_length=ok(length),
    )


@pytest.mark.parametrize(("truth", "k"), [(0.5, 3.0), (0.7, 2.0), (0.9, 5.0)])
def test_the_acceptance_is_solved_from_vllms_counters(truth: float, k: float) -> None:
    """Drafts of K tokens accepted with a per-token chance a keep a (1 - a^K) / (1 - a)
    of them per step (vLLM counts accepted tokens and drafts): the loop reads a back."""
    accepted = truth * (1 - truth**k) / (1 - truth)
    seen = traffic.update(PRIOR, drafting(accepted, k))
    assert seen.acceptance == pytest.approx(truth, abs=traffic.ACCEPTANCE_STEP / 2 + 1e-9)
    assert seen.workload(4.0).acceptance_rate == seen.acceptance


def test_no_drafts_keep_the_acceptance_read_last_and_none_plans_as_declared() -> None:
    seen = traffic.update(PRIOR, drafting(1.2, 3.0))
    assert traffic.update(seen, served(500, PROMPT, OUTPUT)).acceptance == seen.acceptance
    assert traffic.update(PRIOR, served(500, PROMPT, OUTPUT)).acceptance is None


def test_an_acceptance_far_from_the_declared_one_names_the_field_and_the_figure() -> None:
    declared = replace(PRIOR, acceptance=0.7)
    low = traffic.update(declared, drafting(0.5 * (1 - 0.5**3) / 0.5, 3.0))
    (said,) = [d for d in traffic.differences(low, declared) if "acceptanceRate" in d]
    assert "is 0.7 but drafts are accepted at 0.50 per token: the loop plans" in said
    assert "set it to 0.50 so that rooftop plan" in said
    close = traffic.update(declared, drafting(0.65 * (1 - 0.65**3) / 0.35, 3.0))
    assert not [d for d in traffic.differences(close, declared) if "acceptanceRate" in d]


def test_prompt_lookup_acceptance_counts_every_decode_step() -> None:
    """A prompt lookup drafts only where it finds a match: accepted per draft 1.4 of 3
    drafted on 40 % of decode steps is 0.56 accepted per decode step, the acceptance
    the planner prices ngram with (a step without a match, a first draft rejected);
    a model drafter's figure ignores the share (its steps without drafts are the
    schedule's)."""
    seen = replace(drafting(1.4, 3.0), served_drafted_share=ok(0.4))
    per_step = traffic.update(PRIOR, seen, per_decode_step=True).acceptance
    per_draft = traffic.update(PRIOR, seen).acceptance
    assert per_step is not None and per_draft is not None
    expected = drafters.acceptance_from_length(1.0 + 0.56, 3.0)
    assert per_step == pytest.approx(expected, abs=traffic.ACCEPTANCE_STEP / 2 + 1e-9)
    assert per_draft == pytest.approx(
        drafters.acceptance_from_length(2.4, 3.0), abs=traffic.ACCEPTANCE_STEP / 2 + 1e-9
    )
    assert per_step < per_draft - 0.2


def test_prompt_lookup_without_the_drafted_share_keeps_the_last_acceptance() -> None:
    """Without the share (no decode step counted), a lookup's figure is not read as a
    model drafter's: the acceptance read last stays."""
    seen = traffic.update(PRIOR, replace(drafting(1.4, 3.0), served_drafted_share=ok(0.5)), True)
    gap = traffic.update(seen, drafting(2.0, 3.0), per_decode_step=True)
    assert gap.acceptance == seen.acceptance
