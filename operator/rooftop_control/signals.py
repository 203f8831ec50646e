"""How an engine signal is declared: where Prometheus finds it and how the loop reads it.

A signal is one ``Reading`` of an ``Observation``, and it is declared where that field is
(``rooftop_control.readings``: ``tpot_ms: Reading = signal(...)``). Its row says how
Prometheus answers it (``Query``: a quantile, a ratio of rates, a gauge...), the unit it
converts to, whether and how ``status.observed`` shows it, and in words how the
simulated cluster produces it (``rooftop_sim.window``). The operator's queries
(``rooftop_operator.metrics_client``), its observation and ``status.observed``
(``rooftop_operator.loop``) are all built by walking ``readings.SIGNALS``, so no reading
is spelled anywhere else; a query name that is not declared is an error instead of a
reading that is silently missing.

Adding a signal: a field with its row in ``readings.Observation`` and its figure in
``rooftop_sim.window``; ``tests/unit/control/test_signals.py`` names whichever is
forgotten. A new kind of query (beyond those below) also takes its renderer in
``metrics_client``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Final, Literal, TypeVar

# vLLM's per-request TPOT histogram: what a TPOT SLO bounds (a request's mean gap between
# output tokens), unlike the per-token inter-token latency, which also carries every
# prefill stall; the mean of the latter is the mean step time the calibration compares.
REQUEST_TPOT_HISTOGRAM: Final = "vllm:request_time_per_output_token_seconds"
ITL_HISTOGRAM: Final = "vllm:inter_token_latency_seconds"
TTFT_HISTOGRAM: Final = "vllm:time_to_first_token_seconds"
# Observed once per engine step (prefill-only steps too): its count over the inter-token
# latency's count is the window's mean decode batch, the batch of the steps whose mean
# the calibration compares.
ITERATION_TOKENS_HISTOGRAM: Final = "vllm:iteration_tokens_total"
RUNNING_GAUGE: Final = "vllm:num_requests_running"
WAITING_GAUGE: Final = "vllm:num_requests_waiting"
SUCCESS_COUNTER: Final = "vllm:request_success_total"
# Per-request prompt and output lengths, tokens, observed when a request finishes.
PROMPT_TOKENS_HISTOGRAM: Final = "vllm:request_prompt_tokens"
OUTPUT_TOKENS_HISTOGRAM: Final = "vllm:request_generation_tokens"
# Prompt tokens looked up in, and found in, vLLM's prefix cache (counters, tokens).
PREFIX_QUERIES_COUNTER: Final = "vllm:prefix_cache_queries_total"
PREFIX_HITS_COUNTER: Final = "vllm:prefix_cache_hits_total"
# Speculative decoding (vllm/v1/spec_decode/metrics.py, counters): verification steps
# that carried drafts (one per request and step), the draft tokens they carried and
# those accepted.
SPEC_DRAFTS_COUNTER: Final = "vllm:spec_decode_num_drafts_total"
SPEC_DRAFT_TOKENS_COUNTER: Final = "vllm:spec_decode_num_draft_tokens_total"
SPEC_ACCEPTED_COUNTER: Final = "vllm:spec_decode_num_accepted_tokens_total"
# The quantiles of each served length distribution the loop reads (``Served``).
SERVED_QUANTILES: Final = (0.1, 0.5, 0.9, 0.99)


@dataclass(frozen=True)
class Quantile:
    """The SLO's percentile (of TPOT or of TTFT) of a histogram over the window, s."""

    histogram: str
    percentile_of: Literal["tpot", "ttft"]


@dataclass(frozen=True)
class Served:
    """What a histogram says over the long ``SERVED_RANGE`` rather than the window:
    its mean (``of="mean"``), a quantile (0..1) or the count of its observations.
    For what describes the users (request lengths), not the last minute's load."""

    histogram: str
    of: Literal["mean", "count"] | float


@dataclass(frozen=True)
class Ratio:
    """sum(rate(numerator)) / sum(rate(denominator)) over the window: a mean. Over
    ``SERVED_RANGE`` instead when ``served``: a share of what the users send (the prefix
    cache's hit ratio), not of the last minute's load."""

    numerator: str
    denominator: str
    served: bool = False


@dataclass(frozen=True)
class Gauge:
    """A gauge now, summed (or the largest) over the target's engines."""

    series: str
    aggregate: Literal["sum", "max"] = "sum"


@dataclass(frozen=True)
class Rate:
    """sum(rate(counter)) over the window, per second."""

    counter: str


@dataclass(frozen=True)
class Arrivals:
    """Requests arriving per second: completions plus the growth of what the engines
    hold (deriv of the gauges' sum), so a queue building up counts as load."""

    completions: str
    held: tuple[str, ...]


@dataclass(frozen=True)
class Attainment:
    """The share of requests whose histogram value is within the TPOT bound: the bucket
    at the bound over the count (asked only where a bucket sits at the bound)."""

    histogram: str


@dataclass(frozen=True)
class IntervalCounts:
    """A counter's increase in each scrape interval (``BURST_INTERVAL_S``) over the long
    ``SERVED_RANGE``: their mean (``of="mean"``: the served rate, per interval) or their
    variance over their mean (``of="dispersion"``: how bursty arrivals are, 1 for
    Poisson; ``rooftop_planner.bursts``)."""

    counter: str
    of: Literal["mean", "dispersion"]


Query = Quantile | Served | Ratio | Gauge | Rate | Arrivals | Attainment | IntervalCounts


@dataclass(frozen=True)
class Fallback:
    """A query asked beside a signal's own, read only when that has no figure."""

    query: str
    promql: Query


# What a figure's sampling noise scales with: the requests the window saw (a percentile
# or a rate of them: ``requestsPerSecond`` x the window), the requests running (what the
# KV cache holds), or the figure itself (a count of requests, such as ``running``).
NoiseCount = Literal["window_requests", "running", "itself"]


@dataclass(frozen=True)
class Signal:
    """One reading of the loop.

    Attributes:
        query: the name of the Prometheus query that answers it.
        promql: how Prometheus answers it, in Prometheus' units.
        scale: the reading = the query's answer x ``scale`` (1e3: seconds to ms).
        unit: the reading's unit.
        simulated: how ``rooftop_sim.window`` produces it from the simulated engines.
        status_key: its key in ``status.observed`` (None: not shown there).
        status_noise_floor: the least absolute change that rewrites ``status.observed``
            (besides a relative 5 %), in ``unit``; keeps near-zero figures quiet.
        status_noise_count: the count of events whose sampling noise the figure carries
            (``NoiseCount``; None: only the 5 % and the floor), so a window of few
            requests does not rewrite status on every tick.
        at_least: the lowest figure that means something; below it reads as this
            (None: any figure).
        fallback: asked beside it, read when it has no figure (None: none).
        field: the ``Observation`` attribute that declares it (set by ``declared``).
    """

    query: str
    promql: Query
    scale: float
    unit: str
    simulated: str
    status_key: str | None = None
    status_noise_floor: float = 0.0
    status_noise_count: NoiseCount | None = None
    at_least: float | None = None
    fallback: Fallback | None = None
    field: str = ""


_ROW: Final = "rooftop.signal"
T = TypeVar("T")


def signal(
    default: T,
    *,
    query: str,
    promql: Query,
    scale: float,
    unit: str,
    simulated: str,
    status_key: str | None = None,
    status_noise_floor: float = 0.0,
    status_noise_count: NoiseCount | None = None,
    at_least: float | None = None,
    fallback: Fallback | None = None,
) -> T:
    """A dataclass field holding ``default`` and declaring its ``Signal`` (the arguments
    are the row's, see ``Signal``). Typed as the default: a dataclass takes the field
    object it is at run time for the field's declaration."""
    row = Signal(
        query=query,
        promql=promql,
        scale=scale,
        unit=unit,
        simulated=simulated,
        status_key=status_key,
        status_noise_floor=status_noise_floor,
        status_noise_count=status_noise_count,
        at_least=at_least,
        fallback=fallback,
    )
    declaration: T = dataclasses.field(default=default, metadata={_ROW: row})
    return declaration


def declared(observation: type) -> tuple[Signal, ...]:
    """The signals a dataclass declares with ``signal``, in field order."""
    return tuple(
        dataclasses.replace(f.metadata[_ROW], field=f.name)
        for f in dataclasses.fields(observation)
        if _ROW in f.metadata
    )


def query_names(signals: tuple[Signal, ...]) -> frozenset[str]:
    """Every query name a snapshot may be asked for: the signals' and their fallbacks'."""
    fallbacks = {s.fallback.query for s in signals if s.fallback is not None}
    return frozenset({s.query for s in signals} | fallbacks)
