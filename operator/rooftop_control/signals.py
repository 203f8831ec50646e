"""The engine signals the loop reads, each declared once.

A signal is one figure of an ``Observation`` (``rooftop_control.readings``). Its row
says which Prometheus query answers it (``rooftop_operator.metrics_client`` builds one
PromQL expression per query name, in Prometheus' units), how to convert that answer to
the controller's unit, whether and how ``status.observed`` shows it, and how the
simulated cluster produces it (``rooftop_sim.window``). The operator builds the
observation and ``status.observed`` by walking this table, so no reading is spelled as
a string anywhere else; unit tests hold the queries, the ``Observation`` fields and the
simulator's window to the same rows, and a query name that is not declared here is an
error instead of a reading that is silently missing.

Adding a signal: a row here, a field on ``Observation``, its PromQL in
``metrics_client._queries`` and its figure in ``rooftop_sim.window``; the tests name
whichever is forgotten.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final


@dataclass(frozen=True)
class Signal:
    """One reading of the loop.

    Attributes:
        field: the ``Observation`` attribute, in ``unit``.
        query: the name of the Prometheus query that answers it.
        scale: ``field`` = the query's answer x ``scale`` (1e3: seconds to ms).
        unit: the unit of ``field``.
        status_key: its key in ``status.observed`` (None: not shown there).
        status_noise_floor: the least absolute change that rewrites ``status.observed``
            (besides a relative 5 %), in ``unit``; keeps near-zero figures quiet.
        simulated: how ``rooftop_sim.window`` produces it from the simulated engines.
        at_least: the lowest figure that means something; below it reads as this
            (None: any figure).
    """

    field: str
    query: str
    scale: float
    unit: str
    status_key: str | None
    simulated: str
    status_noise_floor: float = 0.0
    at_least: float | None = None


SIGNALS: Final = (
    Signal(
        field="tpot_ms",
        query="tpot_s",
        scale=1e3,
        unit="ms",
        status_key="tpotMs",
        simulated="the SLO quantile of the window's finished requests' TPOT",
    ),
    Signal(
        field="ttft_ms",
        query="ttft_s",
        scale=1e3,
        unit="ms",
        status_key="ttftMs",
        simulated="the SLO quantile of the window's first tokens' TTFT",
    ),
    Signal(
        field="requests_per_second",
        query="requests_per_second",
        scale=1.0,
        unit="req/s",
        status_key="requestsPerSecond",
        simulated="the arrival rate over the window",
        # completions + deriv(in the engines): a draining queue dips it below zero
        at_least=0.0,
    ),
    Signal(
        field="running",
        query="running",
        scale=1.0,
        unit="requests",
        status_key="running",
        simulated="running requests summed over ready replicas",
        status_noise_floor=1.0,
    ),
    Signal(
        field="waiting",
        query="waiting",
        scale=1.0,
        unit="requests",
        status_key="waiting",
        simulated="queued requests summed over ready replicas",
        status_noise_floor=1.0,
    ),
    Signal(
        field="kv_usage_ratio",
        query="kv_usage_ratio",
        scale=1.0,
        unit="ratio",
        status_key="kvCacheUsageRatio",
        simulated="the fullest replica's KV-cache usage",
        status_noise_floor=0.02,
    ),
    Signal(
        field="step_ms",
        query="step_s",
        scale=1e3,
        unit="ms",
        status_key=None,
        simulated="decoded tokens' mean wait for their step over the window",
    ),
    Signal(
        field="step_batch",
        query="step_batch",
        scale=1.0,
        unit="tokens/step",
        status_key=None,
        simulated="decoded tokens per engine iteration over the window",
    ),
    Signal(
        field="tpot_attainment",
        query="tpot_attainment",
        scale=1.0,
        unit="ratio",
        status_key=None,
        simulated="share of the window's finished requests within the TPOT bound",
    ),
    Signal(
        field="prompt_tokens",
        query="prompt_tokens",
        scale=1.0,
        unit="tokens",
        status_key=None,
        simulated="mean prompt length of the window's finished requests",
    ),
    Signal(
        field="output_tokens",
        query="output_tokens",
        scale=1.0,
        unit="tokens",
        status_key=None,
        simulated="mean output length of the window's finished requests",
    ),
)
# Asked beside the signals, read only when a signal cannot be: the arrival estimate
# needs two samples in the window (deriv), completions alone do not.
FALLBACKS: Final = {"requests_per_second": "completions_per_second"}
# Every query name a snapshot may be asked for.
QUERY_NAMES: Final = frozenset({s.query for s in SIGNALS} | set(FALLBACKS.values()))
