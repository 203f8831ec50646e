"""The workload the loop plans for: the declared one until enough requests were
seen, then the observed one.

Declared workloads are copied from a spreadsheet and are wrong: a chat target declared
at 512/128 mean prompt/output tokens that serves 1,147/260 needs twice the replicas
the declared lengths ask for, and sized with them the loop scales down under load. So
the lengths the planner sizes with are the traffic's own, read from vLLM's length
histograms (``vllm:request_prompt_tokens``, ``vllm:request_generation_tokens``): the
mean and the quantiles ``QUANTILES``, from which the planner gets a histogram.

Why quantiles and not the mean and p90 a spec gives: a log-normal through a mean and
a p90 is ill-conditioned where real length distributions sit. Its p90 / mean ratio
is at most e^(z90²/2) ≈ 2.27, and near it the fitted width jumps (ratio 2.0: σ 0.78;
2.27: σ 1.28). Azure's conversation answers have a ratio of 2.0; one 15-minute stretch
of them read 2.27, the fit's p1 answer fell from 40 to 4 tokens, and the planner's
TPOT tail (short answers carry their neighbours' prefill stalls) asked for twice the
replicas. Between quantiles the shape is read off the data instead: the length is
log-linear in the normal score between knots (exact for a log-normal), the tails
extend the nearest segment, and the histogram is scaled to the observed mean, which
Prometheus knows exactly (the quantiles are interpolated in vLLM's 1-2-5 buckets).

The lengths are read over ``defaults.SERVED_RANGE`` (15 minutes), not the 60 s
window: they are a property of a target's users, stable for hours, while one
minute's p90 swings with a burst of long prompts (1,300 to 4,100 tokens between
minutes of the bundled Azure conversation trace, whose whole-hour p90 is 2,700).
Planned with each window's figures, the fleet chased those swings with batch-cap
rollouts that restart every pod; an average of the windows' p90s is no p90 of the
traffic either (it fell short of it, and the fleet with it). Prometheus answers the
range directly, so a restarted operator has the figures at once. They are used once
the range holds ``MIN_REQUESTS`` finished requests; until then, and while the
metrics are missing, the last figures stay, and before any the declared workload:
the prior a target plans with before it serves.

The prefix cache's hit ratio over the same range (``vllm:prefix_cache_hits`` over
``_queries``) goes with them: it says how much prefill the cache saves, and it depends on
the plan (a session's history hits only on the replica that served it). The planner's
prefix model (``rooftop_planner.prefix``) is fitted to it at the replicas it was seen on
(``fitted_prefix``): the stated shared tokens kept, the session share solved from the
rest; with no ``spec.workload.prefix`` every hit counts as session reuse, the reading
that predicts the fewest hits on more replicas.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from statistics import NormalDist

from rooftop_api.spec import (
    HistogramBin,
    MeasuredLengths,
    MeasuredWorkload,
    PrefixReuse,
    Router,
    TokenLengths,
    Workload,
)
from rooftop_control.defaults import METRICS_WINDOW_S
from rooftop_control.readings import Observation, Reading
from rooftop_control.signals import SERVED_QUANTILES
from rooftop_planner.bursts import BURST_INTERVAL_S
from rooftop_planner.drafters import acceptance_from_length
from rooftop_planner.prefix import PrefixModel
from rooftop_planner.search import prompt_strata
from rooftop_planner.workload import from_spec

# The quantiles the loop reads of each length distribution (readings.served_*).
QUANTILES = SERVED_QUANTILES
# The histogram the planner gets: equal 5 % bins to the p90, then finer toward the
# top, where prefill stalls and KV come from (bin edges as quantiles).
BIN_EDGES = (*(k / 20 for k in range(19)), 0.95, 0.99, 1.0)
_UNIT = NormalDist()
# The knots' normal scores, where the log-length is interpolated between them.
_KNOT_Z = tuple(_UNIT.inv_cdf(q) for q in QUANTILES)

# Finished requests the served range needs before its lengths count: the p90 of 100
# log-normal lengths (sigma 1) is within about 20 % of the true one.
MIN_REQUESTS = 100
# The measured acceptance's grid: the planner's curves are recomputed when it moves a
# step. A hundred requests of a hundred tokens verify thousands of drafts, which pin
# the acceptance within about 0.01.
ACCEPTANCE_STEP = 0.02
# Acceptances further apart than this (per token) are news in WorkloadObserved: a tenth
# moves the tokens a 3-token draft yields by about 15 % around 0.7.
ACCEPTANCE_DIFFERS_BY = 0.1
# Relative gap beyond which a served mean counts as different from the spec's (the
# mean of a few hundred log-normal lengths moves about 10 %; Prometheus has it exactly,
# as a sum over a count).
DIFFERS_BY = 0.25
# A served p90 is interpolated within one of vLLM's 1-2-5 buckets, which span up to
# 2.5x: every request of 64 tokens reads as a p90 of 95. Only a p90 further from the
# spec's than a bucket is news.
P90_DIFFERS_BY = 1.5
# The hit ratio's grid (absolute): sizings are cached by it, and a few hundred requests'
# ratio moves by about this much.
HIT_GRID = 0.02
# Hit ratios further apart than this (absolute) are news in WorkloadObserved.
HITS_DIFFER_BY = 0.1
# Burstiness is news in WorkloadObserved when the served one is this many times the
# spec's, or a fraction of it: the variance of 60 interval counts is itself uncertain by
# about √(2/59) ≈ 18 % for Poisson counts and more for clumped ones.
BURSTS_DIFFER_BY = 2.0
# 15-s intervals the served range must span before its burstiness counts: the variance
# of n counts moves by about √(2/(n − 1)) of itself, 26 % at 30 (a young target's few
# intervals, or a load of a minute, read Poisson traffic as twice as bursty).
MIN_BURST_INTERVALS = 30
# How many standard deviations of a window's rate below the served range's mean say the
# rate is falling, not between two bursts (two: a steady rate's window crosses it on
# about 2 % of ticks).
FALLING_Z = 2.0
# Below this index of dispersion on both sides, arrivals are near enough Poisson that a
# difference changes no plan (the planner's headroom covers it).
BURSTY = 2.0


@dataclass(frozen=True, slots=True)
class Lengths:
    """One token-length distribution: its mean and its ``QUANTILES``, tokens."""

    mean: float
    quantiles: tuple[float, ...]

    @property
    def p90(self) -> float:
        return self.quantiles[QUANTILES.index(0.9)]

    def spec(self) -> TokenLengths:
        """As a spec's ``TokenLengths``: a histogram with a bin per ``BIN_EDGES``
        stratum at its middle quantile, scaled to the mean."""
        middles = [(a + b) / 2 for a, b in zip(BIN_EDGES[:-1], BIN_EDGES[1:], strict=True)]
        weights = [b - a for a, b in zip(BIN_EDGES[:-1], BIN_EDGES[1:], strict=True)]
        tokens = [self.quantile(m) for m in middles]
        scale = self.mean / sum(t * w for t, w in zip(tokens, weights, strict=True))
        bins = [
            HistogramBin(tokens=max(1, round(t * scale)), weight=w)
            for t, w in zip(tokens, weights, strict=True)
        ]
        return TokenLengths(histogram=bins)

    def quantile(self, q: float) -> float:
        """The q-quantile (0 < q < 1), tokens: log-linear in the normal score between
        the knots, the end segments extended beyond them."""
        z = _KNOT_Z
        logs = [math.log(max(v, 1.0)) for v in self.quantiles]
        at = _UNIT.inv_cdf(q)
        i = min(max(sum(at > zk for zk in z) - 1, 0), len(z) - 2)
        slope = (logs[i + 1] - logs[i]) / (z[i + 1] - z[i])
        return math.exp(logs[i] + slope * (at - z[i]))

    def rounded(self, grid: float) -> Lengths:
        """Each figure rounded on a relative grid (0.05: 5 % steps), so sizings cached
        by lengths are found again while the lengths move within their noise."""
        return Lengths(
            mean=_on_grid(self.mean, grid),
            quantiles=tuple(_on_grid(v, grid) for v in self.quantiles),
        )

    def measured(self) -> MeasuredLengths:
        """As ``status.plan.measuredWorkload`` keeps it: the mean and each quantile,
        to a token."""
        p10, p50, p90, p99 = (round(v) for v in self.quantiles)
        return MeasuredLengths(mean=round(self.mean), p10=p10, p50=p50, p90=p90, p99=p99)

    @classmethod
    def of(cls, measured: MeasuredLengths) -> Lengths:
        """Read back what ``measured`` keeps."""
        knots = (measured.p10, measured.p50, measured.p90, measured.p99)
        return cls(mean=measured.mean, quantiles=knots)

    def differs(self, other: Lengths) -> bool:
        """Whether the mean is further from ``other``'s than ``DIFFERS_BY`` or the p90
        than ``P90_DIFFERS_BY`` (``differences``: beyond their noise)."""
        return _beyond(self.mean, other.mean, DIFFERS_BY) or _beyond(
            self.p90, other.p90, P90_DIFFERS_BY
        )

    def near(self, other: Lengths, tolerance: float) -> bool:
        """Every figure within ``tolerance`` of ``other``'s, relative (0.05: 5 %)."""
        return _near(self.mean, other.mean, tolerance) and all(
            _near(a, b, tolerance) for a, b in zip(self.quantiles, other.quantiles, strict=True)
        )


@dataclass(frozen=True, slots=True)
class PrefixHits:
    """The prefix cache's hit ratio over the served range (0..1, on ``HIT_GRID``) and
    the ready replicas it was read on."""

    ratio: float
    replicas: int


@dataclass(frozen=True, slots=True)
class Traffic:
    """Prompt and output lengths the planner sizes with.

    Attributes:
        prompt / output: the length distributions, tokens.
        observed: True once measured traffic replaced the declared prior.
        hits: the prefix cache's observed hits (None: not read yet).
        stated: the prompt reuse ``spec.workload.prefix`` states (the declared prior's).
        bursts: the arrivals' burstiness over the served range (None: not read, or too
            few requests; the declared prior's is ``spec.workload.arrivalDispersion``).
        acceptance: speculative decoding's per-token acceptance the engines met over the
            served range, on a grid of ``ACCEPTANCE_STEP`` (None: they do not speculate,
            or drafted too little; the declared prior's is ``spec.workload.acceptanceRate``).
    """

    prompt: Lengths
    output: Lengths
    observed: bool = False
    hits: PrefixHits | None = None
    stated: PrefixReuse | None = None
    bursts: Bursts | None = None
    acceptance: float | None = None

    def workload(self, requests_per_second: float, prefix: PrefixReuse | None = None) -> Workload:
        """A spec workload with these lengths, prompt reuse and burstiness, at this rate,
        or where bursts were read at the rate to size them at (``Bursts.reference``)."""
        bursts = self.bursts
        rate = requests_per_second
        return Workload(
            requests_per_second=bursts.reference(rate) if bursts else rate,
            prompt_tokens=self.prompt.spec(),
            output_tokens=self.output.spec(),
            prefix=prefix,
            arrival_dispersion=bursts.dispersion if bursts else None,
            acceptance_rate=self.acceptance,
        )

    def trimmed(self, trim: float) -> Traffic:
        """As planned with the loop's latency trim, which scales every rate the planner
        sizes for: the bursts' too. The arrival rate scaled by t has t times the mean
        and t² times the variance, so D − 1 scales by t (D − 1 = variance · τ / mean)
        and the capacity held for the bursts by t exactly."""
        if self.bursts is None or trim == 1.0:
            return self
        b = self.bursts
        bursts = Bursts(1.0 + trim * (b.dispersion - 1.0), b.requests_per_second * trim)
        return replace(self, bursts=bursts)

    def rounded(self, grid: float) -> Traffic:
        """The lengths and bursts on a relative grid (see ``Lengths.rounded``)."""
        return replace(
            self,
            prompt=self.prompt.rounded(grid),
            output=self.output.rounded(grid),
            bursts=self.bursts.rounded(grid) if self.bursts else None,
        )

    def lengths_near(self, other: Traffic, tolerance: float) -> bool:
        """The same lengths and prompt reuse as ``other``'s within ``tolerance``
        (relative, for each length figure; the hit ratio is on its grid already);
        bursts aside."""
        return (
            self.observed == other.observed
            and self.acceptance == other.acceptance
            and self.hits == other.hits
            and self.stated == other.stated
            and self.prompt.near(other.prompt, tolerance)
            and self.output.near(other.output, tolerance)
        )


@dataclass(frozen=True, slots=True)
class Bursts:
    """How bursty the served requests arrive (``rooftop_planner.bursts``): the variance of
    the requests finished per 15-s interval over their mean (1: Poisson; at least 1 as
    planned, a smoother count is planned as Poisson) and their mean rate, req/s."""

    dispersion: float
    requests_per_second: float

    def reference(self, rate: float, window_s: float = METRICS_WINDOW_S) -> float:
        """The rate (req/s) to size the bursts at, given the window's ``rate``: the served
        range's mean, which a burst in one window does not move, unless the window is
        lower by more than ``FALLING_Z`` of its own noise at this burstiness,
        √(D · λ / window) req/s: then the rate is falling and the 15-minute mean lags it
        (a lull between bursts is within that noise)."""
        mean = self.requests_per_second
        noise = math.sqrt(self.dispersion * mean / window_s)
        return rate if rate < mean - FALLING_Z * noise else mean

    def rounded(self, grid: float) -> Bursts:
        step = math.log1p(grid)
        rate = round(math.exp(round(math.log(self.requests_per_second) / step) * step), 6)
        return Bursts(_on_grid(self.dispersion, grid), rate)


def _beyond(seen: float, stated: float, by: float) -> bool:
    """Whether ``seen`` is further from ``stated`` than ``by`` (relative, either way:
    0.25 is 25 % up or down to 1/1.25)."""
    return abs(math.log(seen / stated)) > math.log1p(by)


def _near(a: float, b: float, tolerance: float) -> bool:
    return abs(a - b) <= tolerance * abs(b)


def declared(workload: Workload) -> Traffic:
    """The spec's workload as the prior: each length's mean and ``QUANTILES``, and the
    prompt reuse it states."""
    bursts = None
    if workload.arrival_dispersion is not None:
        bursts = Bursts(workload.arrival_dispersion, workload.requests_per_second)
    return Traffic(
        prompt=_lengths(workload.prompt_tokens),
        output=_lengths(workload.output_tokens),
        stated=workload.prefix,
        bursts=bursts,
        acceptance=workload.acceptance_rate,
    )


def measured_workload(traffic: Traffic) -> MeasuredWorkload:
    """The served lengths as ``status.plan.measuredWorkload`` keeps them."""
    return MeasuredWorkload(
        prompt_tokens=traffic.prompt.measured(), output_tokens=traffic.output.measured()
    )


def with_measured(workload: Workload, measured: MeasuredWorkload | None) -> Workload:
    """``workload`` with the measured lengths in place of its own (None: as written)."""
    if measured is None:
        return workload
    prompt, output = Lengths.of(measured.prompt_tokens), Lengths.of(measured.output_tokens)
    return workload.model_copy(
        update={"prompt_tokens": prompt.spec(), "output_tokens": output.spec()}
    )


def lengths_differ(traffic: Traffic, planned: MeasuredWorkload | Traffic) -> bool:
    """Whether the served prompt or output lengths differ from those a plan was made
    with beyond their noise (``Lengths.differs``): a re-plan with them may choose other
    GPUs or TP."""
    if isinstance(planned, MeasuredWorkload):
        pair = (Lengths.of(planned.prompt_tokens), Lengths.of(planned.output_tokens))
    else:
        pair = (planned.prompt, planned.output)
    return traffic.prompt.differs(pair[0]) or traffic.output.differs(pair[1])


def _lengths(tokens: TokenLengths) -> Lengths:
    dist = from_spec(tokens)
    return Lengths(mean=dist.mean, quantiles=tuple(dist.quantile(q) for q in QUANTILES))


def served_traffic(obs: Observation, per_decode_step: bool = False) -> Traffic | None:
    """The lengths over the served range, or None when it holds too few finished
    requests (or a length reading has no figure); ``per_decode_step``: the engines'
    drafts are prompt lookups (``measured_acceptance``)."""
    prompt, output = obs.served_prompt(), obs.served_output()
    readings = (*prompt, *output)
    if not all(_usable(r) for r in readings) or not obs.served_requests.ok:
        return None
    if obs.served_requests.value < MIN_REQUESTS:
        return None
    return Traffic(
        prompt=_from_readings(prompt),
        output=_from_readings(output),
        observed=True,
        hits=_hits(obs),
        bursts=_bursts(obs),
        acceptance=measured_acceptance(obs, per_decode_step),
    )


def measured_acceptance(obs: Observation, per_decode_step: bool = False) -> float | None:
    """The per-token acceptance a whose chain of K̄ drafts accepts what the engines
    accepted per step over the served range: a (1 − a^K̄) / (1 − a) = accepted per
    step, K̄ the draft tokens per step (``drafters.acceptance_from_length``; exact
    where every step drafts K̄, as a schedule of one length does), on a grid of
    ``ACCEPTANCE_STEP`` so that its noise does not re-plan every tick. None without
    drafts (read once the range holds ``MIN_REQUESTS``, ``served_traffic``).

    ``per_decode_step`` (prompt lookup or suffix trees, which draft only where they find
    a match): accepted per decode step rather than per step that drafted, the accepted
    per draft times the share of decode steps that drafted, as the planner defines an
    ``ngram`` or ``suffix`` acceptance (a step with no match is one whose first draft
    was rejected). Where the
    schedule turns drafting off at the running batch those steps count too, so the
    figure reads low there: it errs towards drafting less."""
    accepted, length = obs.served_accepted_per_draft, obs.served_draft_length
    if not (accepted.ok and length.ok) or length.value < 1.0:
        return None
    per_step = max(accepted.value, 0.0)
    if per_decode_step:
        share = obs.served_drafted_share
        if not share.ok or not share.value > 0.0:
            return None
        per_step *= min(share.value, 1.0)
    tokens = min(1.0 + per_step, 1.0 + length.value)
    rate = acceptance_from_length(tokens, length.value)
    return min(max(round(rate / ACCEPTANCE_STEP) * ACCEPTANCE_STEP, ACCEPTANCE_STEP), 0.99)


def _bursts(obs: Observation) -> Bursts | None:
    """The served range's burstiness and rate, None without both figures or before the
    range holds ``MIN_BURST_INTERVALS`` intervals' worth of requests."""
    dispersion, rate = obs.served_arrival_dispersion, obs.served_requests_per_second
    if not (dispersion.ok and rate.ok) or not (rate.value > 0 and dispersion.value >= 0):
        return None
    intervals = obs.served_requests.value / (rate.value * BURST_INTERVAL_S)
    if intervals < MIN_BURST_INTERVALS:
        return None
    return Bursts(max(dispersion.value, 1.0), rate.value)


def _hits(obs: Observation) -> PrefixHits | None:
    """The served range's hit ratio on ``HIT_GRID`` and the replicas it was read on."""
    ratio = obs.served_prefix_hit_ratio
    if not ratio.ok or not 0.0 <= ratio.value <= 1.0 or obs.ready_replicas < 1:
        return None
    return PrefixHits(round(ratio.value / HIT_GRID) * HIT_GRID, obs.ready_replicas)


def fitted_prefix(
    stated: PrefixReuse | None, traffic: Traffic, affinity: bool
) -> PrefixReuse | None:
    """The prompt reuse to plan with: the stated one, fitted to the observed hit ratio at
    the replicas it was read on (module doc); ``affinity``: the Service pins sessions."""
    hits = traffic.hits
    if hits is None or (stated is None and hits.ratio <= 0.0):
        return stated
    base = stated or PrefixReuse(router=Router.SERVICE)
    model = PrefixModel.from_spec(base)
    if stated is None:  # unstated: all of it session reuse (see the module doc)
        model = PrefixModel(session_share=1.0, client_ip_sessions=False)
    strata, weights = prompt_strata(from_spec(traffic.prompt.spec()))
    fit = model.fitted(hits.ratio, strata, weights, model.same_replica(hits.replicas, affinity))
    # the observed hits already count the sessions the cache evicted: the fitted share is
    # what survives, so the eviction model (the gap) is not applied to it again
    return base.model_copy(
        update={
            "shared_tokens": int(fit.shared_tokens),
            "session_share": round(fit.session_share, 3),
            "session_gap_seconds": None,
        }
    )


def _from_readings(readings: tuple[Reading, ...]) -> Lengths:
    """(mean, *QUANTILES) readings as lengths; quantiles made non-decreasing (an
    interpolated histogram quantile can dip below the one before it)."""
    mean, *knots = (r.value for r in readings)
    rising = [max(knots[: i + 1]) for i in range(len(knots))]
    return Lengths(mean=mean, quantiles=tuple(rising))


def _usable(reading: Reading) -> bool:
    return reading.ok and math.isfinite(reading.value) and reading.value >= 1.0


def update(current: Traffic, obs: Observation, per_decode_step: bool = False) -> Traffic:
    """The lengths to plan with after this observation: the served ones where there
    are enough, else ``current`` (the last served figures, or the declared prior); the
    last bursts and acceptance read stay while a window has none (``per_decode_step``:
    see ``measured_acceptance``)."""
    served = served_traffic(obs, per_decode_step)
    if served is None:
        return current
    if served.bursts is None:
        served = replace(served, bursts=current.bursts)
    if served.acceptance is None:
        served = replace(served, acceptance=current.acceptance)
    return served


def differences(observed: Traffic, prior: Traffic) -> list[str]:
    """Where the observed lengths differ from the spec's beyond their noise, each as
    the spec field, the two figures and the figure to write there."""
    fields = (
        ("promptTokens.mean", observed.prompt.mean, prior.prompt.mean, DIFFERS_BY),
        ("promptTokens.p90", observed.prompt.p90, prior.prompt.p90, P90_DIFFERS_BY),
        ("outputTokens.mean", observed.output.mean, prior.output.mean, DIFFERS_BY),
        ("outputTokens.p90", observed.output.p90, prior.output.p90, P90_DIFFERS_BY),
    )
    lengths = [
        f"spec.workload.{name} is {spec_value:,.0f} but the traffic's is {seen:,.0f}: "
        f"set it to about {significant(seen):,}"
        for name, seen, spec_value, by in fields
        if _beyond(seen, spec_value, by)
    ]
    return (
        lengths
        + _hit_difference(observed, prior.stated)
        + _burst_difference(observed, prior)
        + _acceptance_difference(observed, prior)
    )


def _acceptance_difference(observed: Traffic, prior: Traffic) -> list[str]:
    """Where speculative decoding's drafts are accepted at a per-token rate more than
    ``ACCEPTANCE_DIFFERS_BY`` from spec.workload.acceptanceRate (unset: the drafter's
    published figure is planned with, and the measured one is said). The loop sizes
    replicas with the measured one and, beyond that difference, plans the target again
    with it (``control.Decision.replan_acceptance``); the spec still says otherwise,
    and ``rooftop plan`` or the next edit would start from it."""
    seen = observed.acceptance
    if seen is None:
        return []
    fix = (
        f"the loop plans with the measured one; set it to {seen:.2f} so that rooftop plan "
        "and the next edit of the target start from it"
    )
    stated = prior.acceptance
    if stated is None:
        unset = "spec.workload.acceptanceRate unset"
        return [f"drafts are accepted at {seen:.2f} per token ({unset}): {fix}"]
    if abs(seen - stated) <= ACCEPTANCE_DIFFERS_BY:
        return []
    return [
        f"spec.workload.acceptanceRate is {stated:g} but drafts are accepted at {seen:.2f} "
        f"per token: {fix}"
    ]


def _burst_difference(observed: Traffic, prior: Traffic) -> list[str]:
    """Where the served arrivals are burstier or smoother than ``spec.workload.arrivalDispersion``
    (unset: 1) by over ``BURSTS_DIFFER_BY`` times, and either is bursty at all."""
    if observed.bursts is None:
        return []
    seen = observed.bursts.dispersion
    stated = prior.bursts.dispersion if prior.bursts else 1.0
    if max(seen, stated) < BURSTY or abs(math.log(seen / stated)) <= math.log(BURSTS_DIFFER_BY):
        return []
    return [
        f"spec.workload.arrivalDispersion is {stated:g} but the traffic's 15-s counts vary "
        f"{seen:.0f} times their mean: set it to about {significant(seen):,}"
    ]


def _hit_difference(observed: Traffic, stated: PrefixReuse | None) -> list[str]:
    """Where vLLM's prefix-cache hits differ from what ``stated`` predicts on the replicas
    they were read on by more than ``HITS_DIFFER_BY``, in words with the field to set."""
    hits = observed.hits
    if hits is None:
        return []
    if stated is None:
        if hits.ratio < HITS_DIFFER_BY:
            return []
        return [
            f"vLLM's prefix cache hits {hits.ratio:.0%} of prompt tokens, which "
            "spec.workload.prefix does not state: set sharedTokens (a system prompt every "
            "request starts with) or sessionShare (a conversation's history) so the first "
            "plan counts them"
        ]
    model = PrefixModel.from_spec(stated)
    strata, weights = prompt_strata(from_spec(observed.prompt.spec()))
    # the affinity is unknown here; random spreading is what a stated prefix alone implies
    predicted = model.hit_ratio(strata, weights, model.same_replica(hits.replicas, False))
    if abs(predicted - hits.ratio) < HITS_DIFFER_BY:
        return []
    return [
        f"spec.workload.prefix predicts {predicted:.0%} prefix-cache hits on {hits.replicas} "
        f"replica(s) but vLLM's cache hits {hits.ratio:.0%}: the loop plans with the "
        "observed hits; correct sharedTokens or sessionShare"
    ]


def significant(value: float) -> int:
    """Two significant figures: what a user would write in a spec."""
    if value < 10:
        return max(1, round(value))
    digits = int(math.floor(math.log10(value))) - 1
    return int(round(value, -digits))


def _on_grid(value: float, grid: float) -> float:
    """``value`` rounded to the nearest point of the grid (1 + grid)^k, k integer."""
    if value <= 1.0:
        return 1.0
    step = math.log1p(grid)
    return round(math.exp(round(math.log(value) / step) * step), 3)
