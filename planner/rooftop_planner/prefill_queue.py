"""The TTFT percentile over requests: a prompt's own prefill and the prefill queued ahead.

vLLM schedules prompts first come, first served within a token budget K per step
(``--max-num-batched-tokens``): a prompt arriving while others are still being
prefilled waits until their tokens are through, and a long prompt whose chunks are
under way holds the budget for all of them. The prefill is therefore a single-server
queue of work (an M/G/1 queue: Poisson arrivals at the replica's rate λ, requests/s),
and a request's TTFT is

    TTFT = W + R + own(p)

- own(p): its own prefill, c = ceil(n / K) steps of the decodes plus a chunk of its n
  uncached tokens (the search's step model), for a prompt of p tokens;
- W: the prefill work ahead of it when it arrives, s: the queue's waiting time, where a
  prompt of stratum s brings S_s = c_s · δ_s + (n_s / K) · t_d seconds of work (δ_s what
  one of its chunk steps adds to a decode step t_d; the step's decode part is shared by
  the K tokens it carries, so a prompt pays its tokens' share of it);
- R: the decode step in progress, uniform on [0, t_d].

W's moments are Takács's recurrence for the M/G/1 waiting time, with ρ = λ · E[S] and
a = λ / (1 − ρ):

    E[W]  = a · E[S²] / 2
    E[W²] = a · (E[S²] · E[W] + E[S³] / 3)
    E[W³] = a · (3/2 · E[S²] · E[W²] + E[S³] · E[W] + E[S⁴] / 4)

W is not one smooth variable: most arrivals find the prefill idle (W = 0), and the
rest wait mostly for the rest of the prompt being prefilled, which for a long prompt
is seconds. So W + R is split by what a request arrives into (``wait_states``): an idle
prefill (share 1 − ρ: R only), or stratum j's work under way (share λ · w_j · S_j: R, the
rest of that work, uniform on [0, S_j], and the queue behind it, of mean E[W]).

A burst is the same queue at a higher rate: the search sizes a fleet so that the
rate requests arrive into in a burst (``bursts.burst_rate``) maps to a running batch
whose TTFT still meets the SLO, and the queue's λ grows with the batch.

The percentile over requests is that of the mixture over the request's own prompt
stratum (``TTFT_STRATA``: finer at the top, where a p99 lives) times what it arrives
into, each component by its first three moments (normal-power,
``tail.mixture_quantile``, read in two passes). ``own`` and S are known at the
search's prompt strata and at the percentile's prompt and read linearly in between
(``own_weights``). Against a direct simulation of the same queue (Lindley's recursion)
the p90 and p99 are within 3 % (``tests/unit/planner/test_prefill_queue.py``).
Everything is vectorised over the search's batch grid.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rooftop_planner import tail
from rooftop_planner.kernels import FloatArray

# The TTFT mixture's prompt-length strata (quantile bounds): fine at the top, so that a
# p99 is read between prompts near the 99th percentile, not off a top-5 % mean.
TTFT_STRATA = (0.0, 0.5, 0.8, 0.9, 0.95, 0.98, 0.99, 0.999, 1.0)
TTFT_WEIGHTS = np.diff(np.array(TTFT_STRATA))
# The queue is held below this utilisation: beyond it the prompts arrive faster than
# the budget prefills them and the wait grows without end; the cap keeps the wait
# finite (a hundred times the work's second moment, far beyond any SLO) so that the
# search's grid interpolation stays defined.
MOST_UTILISATION = 0.99
# The mixture's CDF is read twice (``tail.mixture_quantile``): its components lie far
# apart (a short prompt arriving into an idle prefill, a long one behind a long one).
READ_PASSES = 2


def ttft_midpoints() -> tuple[float, ...]:
    """The quantiles at the middle of each ``TTFT_STRATA`` stratum: the mixture's
    prompt lengths are the distribution's quantiles there."""
    bounds = TTFT_STRATA
    return tuple((a + b) / 2.0 for a, b in zip(bounds[:-1], bounds[1:], strict=True))


def own_weights(known: Sequence[float], wanted: Sequence[float]) -> FloatArray:
    """W (len(wanted) × len(known)) with own(wanted) ≈ W · own(known): each wanted
    length read linearly between the two known lengths around it (beyond the ends,
    along the nearest two); a length equal to a known one takes its value."""
    xs = np.asarray(known, dtype=np.float64)
    if len(xs) == 1:
        return np.ones((len(wanted), 1))
    order = np.argsort(xs, kind="stable")
    sorted_xs = xs[order]
    out = np.zeros((len(wanted), len(xs)))
    for row, x in enumerate(wanted):
        hi = int(np.clip(np.searchsorted(sorted_xs, x), 1, len(xs) - 1))
        x0, x1 = sorted_xs[hi - 1], sorted_xs[hi]
        frac = (x - x0) / (x1 - x0) if x1 > x0 else 0.0
        out[row, order[hi - 1]] += 1.0 - frac
        out[row, order[hi]] += frac
    return out


def work_moments(work: FloatArray, weights: FloatArray) -> tuple[FloatArray, ...]:
    """(E[S], E[S²], E[S³], E[S⁴]) of the prefill work per row (s, s², s³, s⁴): ``work``
    S (G × K, s) of each prompt stratum of share ``weights`` (K, normalised here)."""
    w = weights / weights.sum()
    return tuple((w * work**k).sum(axis=1) for k in (1, 2, 3, 4))


def wait_moments(
    rate: FloatArray, work: FloatArray, weights: FloatArray
) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
    """(ρ, mean, variance, third central moment) of the M/G/1 waiting time W (1, s, s²,
    s³) per row: ``rate`` λ (G, requests/s), ``work`` S (G × K, s) of each prompt
    stratum of share ``weights`` (K). Module doc for the recurrence."""
    return _takacs(rate, work_moments(work, weights))


def _takacs(
    rate: FloatArray, moments: tuple[FloatArray, ...]
) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
    """``wait_moments`` from the work's moments (``work_moments``)."""
    m1, m2, m3, m4 = moments
    rho = np.minimum(rate * m1, MOST_UTILISATION)
    a = rate / (1.0 - rho)
    e1 = a * m2 / 2.0
    e2 = a * (m2 * e1 + m3 / 3.0)
    e3 = a * (1.5 * m2 * e2 + m3 * e1 + m4 / 4.0)
    var = np.maximum(e2 - e1**2, 0.0)
    third = e3 - 3.0 * e1 * e2 + 2.0 * e1**3
    return rho, e1, var, third


def wait_states(
    decode_s: FloatArray, rate: FloatArray, work_s: FloatArray
) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
    """What an arrival waits for before its own prefill, as 1 + K states per row (G ×
    (1 + K) arrays of share, mean s, variance s², third central moment s³).

    Every arrival waits out the step in progress, uniform on [0, t_d] at least. State 0:
    the prefill is idle (share 1 − ρ), nothing more. State j: it arrives while a
    stratum-j prompt's work is under way (share λ · w_j · S_j, the time that work takes
    up) and waits out the rest of it, uniform on [0, S_j], and the queue Q behind it.
    Given a busy prefill, Q's mean is E[W] again (E[W]/ρ less the mean rest of the work
    in progress, E[S²]/(2 E[S])); its variance is W's given busy less that rest's, and
    its third moment W's given busy.
    """
    moments = work_moments(work_s, TTFT_WEIGHTS)
    rho, wait, wait_var, wait_third = _takacs(rate, moments)
    busy = rate[:, None] * TTFT_WEIGHTS[None, :] * work_s  # TTFT_WEIGHTS sum to 1
    idle = np.maximum(1.0 - busy.sum(axis=1), 0.0)
    rest_mean = moments[1] / (2.0 * moments[0])
    rest_var = moments[2] / (3.0 * moments[0]) - rest_mean**2
    busy_second = (wait_var + wait**2) / rho
    queue_var = np.maximum(busy_second - (wait / rho) ** 2 - rest_var, 0.0)
    step_mean, step_var = decode_s / 2.0, decode_s**2 / 12.0

    def states(at_idle: FloatArray, at_busy: FloatArray) -> FloatArray:
        return np.concatenate([at_idle[:, None], at_busy], axis=1)

    return (
        states(idle, busy),
        states(step_mean, (step_mean + wait)[:, None] + work_s / 2.0),
        states(step_var, (step_var + queue_var)[:, None] + work_s**2 / 12.0),
        states(np.zeros_like(wait), np.repeat((wait_third / rho)[:, None], work_s.shape[1], 1)),
    )


def ttft_quantile(
    q: float, decode_s: FloatArray, rate: FloatArray, work_s: FloatArray, own_s: FloatArray
) -> FloatArray:
    """The q-quantile over requests of TTFT (s) per grid point (module doc).

    Per grid point (G): the decode step t_d (s) and the rate λ (requests/s); per grid
    point and TTFT stratum (G × K, ``TTFT_WEIGHTS``): ``work_s``, the prefill work S a
    prompt of the stratum queues (s), and ``own_s``, its own prefill (s). The mixture's
    components: the request's own stratum k (share w_k) times the state it arrives into
    (``wait_states``), mean own_k plus the state's wait.
    """
    rows, strata = own_s.shape
    share, wait, var, third = wait_states(decode_s, rate, work_s)

    def per_component(state: FloatArray) -> FloatArray:
        whole = np.broadcast_to(state[:, None, :], (rows, strata, strata + 1))
        return whole.reshape(rows, -1)

    mean = (own_s[:, :, None] + wait[:, None, :]).reshape(rows, -1)
    spread = per_component(var)
    skew = per_component(third) / np.maximum(spread, 1e-30) ** 1.5
    weights = (TTFT_WEIGHTS[None, :, None] * share[:, None, :]).reshape(rows, -1)
    sd = np.sqrt(np.maximum(spread, 1e-30))
    return tail.mixture_quantile(q, mean, sd, np.clip(skew, 0.0, 4.0), weights, READ_PASSES)
