"""What an open-loop benchmark measures: requests arriving at a Poisson rate.

``vllm bench serve --request-rate R`` (and real traffic, roughly) sends requests at
random times, whatever the engine is doing. One replica then settles where the rate
it serves equals the rate sent: the running batch B solves

    λ = B / (prefill time + (osl − 1) · t̄(B))        (Little's law, requests/s)

with t̄(B) the mean step of ``batching.predict_continuous`` at B sequences. A prompt
arrives at a random time and waits out the step in progress: E[t²] / (2 · E[t]), more
than half a mean step, as an arrival is likelier to land in a long step, one carrying
another prompt's chunk. It then rides in its chunk steps,
and shares the step it arrives for with the prompts that arrive during the same step: a
request is more likely to land in a step where others landed too, so its step carries
1 + λ · t̄ prompts on average (the Poisson count seen by an arrival), not one. Above
the rate the engine serves at its running cap the queue grows without end: the TTFT is
then unbounded and the prediction says so.
"""

from __future__ import annotations

import math
from dataclasses import replace

from rooftop_planner import perf
from rooftop_planner.batching import (
    EngineLimits,
    Prediction,
    admissions_per_step,
    predict_continuous,
    prompt_chunks,
)
from rooftop_planner.perf import EngineShape

# Bisection steps on the running batch: 2⁻⁴⁰ of the cap, far finer than a sequence
_BISECTIONS = 40


def predict_open_loop(
    dep: EngineShape,
    rate: float,
    isl: float,
    osl: float,
    limits: EngineLimits | None = None,
) -> Prediction:
    """One replica under Poisson arrivals at ``rate`` requests/s (module docstring)."""
    limits = limits or EngineLimits()
    top = predict_continuous(dep, float(limits.max_num_seqs), isl, osl, limits)
    if not top.fits:
        return top
    most = served_rate(top, osl)
    if rate >= most:
        reason = (
            f"overloaded: {rate:g} requests/s is more than the {most:.3g} this engine serves "
            f"at {top.batch:.0f} running sequences of {isl:.0f}/{osl:.0f} tokens; its queue "
            "grows without end"
        )
        return replace(top, ttft_s=math.inf, reason=reason, queue_wait_s=math.inf)
    batch = _batch_serving(dep, rate, isl, osl, limits, top.batch)
    steady = predict_continuous(dep, batch, isl, osl, limits)
    waits = residual_step_s(dep, isl, osl, steady, limits) - steady.mean_step_s / 2.0
    waits += shared_step_s(dep, rate, isl, steady, limits)
    return replace(steady, ttft_s=steady.ttft_s + waits)


def served_rate(prediction: Prediction, osl: float) -> float:
    """Requests per second a steady state completes: its output tokens/s over osl."""
    return prediction.output_tok_s / max(osl, 1.0)


def _batch_serving(
    dep: EngineShape, rate: float, isl: float, osl: float, limits: EngineLimits, top: float
) -> float:
    """The running batch B whose steady state serves ``rate``, by bisection on [0, top]
    (the served rate grows with B)."""
    low, high = 0.0, top
    for _ in range(_BISECTIONS):
        mid = (low + high) / 2.0
        if served_rate(predict_continuous(dep, mid, isl, osl, limits), osl) < rate:
            low = mid
        else:
            high = mid
    return high


def shared_step_s(
    dep: EngineShape, rate: float, isl: float, steady: Prediction, limits: EngineLimits
) -> float:
    """What the prompts arriving in the same step add to a prompt's own chunk step: the
    λ · t̄ others an arrival sees, each up to the step's budget, carried beside the
    running batch (s)."""
    others = rate * steady.mean_step_s * isl
    room = max(limits.max_num_batched_tokens - steady.batch - isl, 0.0)
    extra = min(others, room)
    if extra <= 0:
        return 0.0
    context = steady.batch * perf.cached_tokens(dep.model, isl)
    with_own = perf.forward_time_s(dep, steady.batch, context, isl, isl * isl / 2.0)
    with_all = perf.forward_time_s(
        dep, steady.batch, context, isl + extra, (isl + extra) * isl / 2.0
    )
    return with_all - with_own


def residual_step_s(
    dep: EngineShape, isl: float, osl: float, steady: Prediction, limits: EngineLimits
) -> float:
    """The step in progress that a random arrival waits out, E[t²] / (2 · E[t]) (s): an
    arrival is likelier to land in a long step. A share f = min(a · c, 1) of the steps
    carry a prompt's chunk (a = B / (osl + 1.5) admissions per step, c chunks each) and
    take t_c, the rest are plain decode steps t_d."""
    batch = steady.batch
    context = batch * perf.cached_tokens(dep.model, isl + osl / 2.0)
    decode = perf.forward_time_s(dep, batch, context)
    chunks, carrying_step = prompt_chunks(dep, batch, context, isl, limits)
    with_chunk = carrying_step.total_s
    carrying = min(admissions_per_step(batch, osl) * chunks, 1.0)
    mean = (1.0 - carrying) * decode + carrying * with_chunk
    square = (1.0 - carrying) * decode**2 + carrying * with_chunk**2
    return square / (2.0 * mean) if mean > 0 else 0.0
