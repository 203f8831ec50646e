"""What a closed-loop benchmark measures: N clients that start together.

``vllm bench serve --max-concurrency N``, genai-perf at a concurrency and most published
serving tables start N clients at once, each sending its next request the moment its
answer ends. ``batching.predict_continuous`` is the steady state of that loop when
requests are spread out (real traffic, or answers of varied lengths); a benchmark with
fixed lengths never reaches it. All N prompts arrive in the same step, so they queue
behind each other's prefill, P' tokens a step (the step's token budget less the
decoding sequences' one token each). The answers then end in the bunches the prefill
finished them in, and each bunch comes back together: every later wave's prompts
arrive P' tokens at a time, each waiting out a step that carries a full budget of
prefill. The TPOT is the same either way (the same prefill work spreads over every
request's answer); the TTFT is not. Against the engine simulator's vLLM scheduler
(benchmarks/bench_continuous.py, TTFT table) the steady-state TTFT is 3-6x short at
fixed lengths and within the simulator's noise with varied ones.

The model (seconds; P' = max(P − d, 1) with d the sequences decoding beside it):

- first wave: n = min(C, running cap) prompts of p tokens at once; prompt i's last
  chunk runs in step ⌈i · p / P'⌉ of steps carrying min(P', n · p) prompt tokens beside
  d = (n − 1)/2 decodes, so TTFT₁ = mean over i of ⌈i · p / P'⌉ · t_full;
- later waves: a prompt arrives with the bunch it finished with and waits one full step
  (⌈p / P'⌉ steps where a prompt outgrows the budget), beside d = n − P/p decodes:
  TTFT₂ = ⌈p / P'⌉ · t_full;
- a run of R requests averages them: (n · TTFT₁ + (R − n) · TTFT₂) / R, plus the queue
  wait of clients beyond the running cap (``batching._steady_state``).

An engine that runs waiting prompts as prefill batches of their own before the next
decode step (SGLang by default: ``EngineLimits.mixed_prefill`` off, its chunk size the
budget) runs a wave's batches back to back with no decodes beside them: d = 0 and
P' = P. Only vLLM's scheduler was checked against (the engine simulator's).

With ``fixed_lengths=False`` (answers of varied lengths) the waves do not last: later
requests see the steady-state TTFT, less the half step a random arrival waits for the
step in progress (a closed loop's request arrives as a step ends).
"""

from __future__ import annotations

import math
from dataclasses import replace

from rooftop_planner import perf
from rooftop_planner.batching import (
    EngineLimits,
    Prediction,
    predict_continuous,
    running_batch,
)
from rooftop_planner.perf import EngineShape

# vllm bench serve's --num-prompts default: a benchmark's requests when it says nothing
DEFAULT_NUM_PROMPTS = 1000


def predict_closed_loop(
    dep: EngineShape,
    concurrency: int,
    isl: float,
    osl: float,
    limits: EngineLimits | None = None,
    num_prompts: int = DEFAULT_NUM_PROMPTS,
    fixed_lengths: bool = True,
) -> Prediction:
    """``predict_continuous`` with the TTFT a closed-loop run of ``num_prompts`` requests
    measures when its ``concurrency`` clients start together (module docstring)."""
    limits = limits or EngineLimits()
    steady = predict_continuous(dep, concurrency, isl, osl, limits)
    if not steady.fits:
        return steady
    running = max(running_batch(dep, concurrency, isl, osl, limits), 1.0)
    n = max(min(int(running), num_prompts), 1)
    first = first_wave_ttft_s(dep, n, isl, limits)
    later = later_wave_ttft_s(dep, n, isl, limits) if fixed_lengths else arriving_ttft(steady)
    mean = (n * first + max(num_prompts - n, 0) * later) / max(num_prompts, n)
    return replace(steady, ttft_s=mean + steady.queue_wait_s)


def arriving_ttft(steady: Prediction) -> float:
    """The steady state's TTFT for a request sent as another's answer ends: without the
    wait of clients beyond the running batch, and without the half of a mean step an
    arrival at a random time waits for the step in progress (it arrives at a step's end)."""
    return steady.ttft_s - steady.queue_wait_s - steady.mean_step_s / 2.0


def first_wave_ttft_s(dep: EngineShape, n: int, isl: float, limits: EngineLimits) -> float:
    """TTFT₁: n prompts at once, each done in step ⌈i · p / P'⌉ (module docstring)."""
    decoding = _beside(limits, (n - 1) / 2.0)  # the wave's prompts done so far
    budget = _prefill_budget(limits, decoding)
    step = _full_step_s(dep, n, decoding, isl, budget)
    steps = sum(max(math.ceil(i * isl / budget), 1) for i in range(1, n + 1))
    return steps / n * step


def later_wave_ttft_s(dep: EngineShape, n: int, isl: float, limits: EngineLimits) -> float:
    """TTFT₂: each prompt waits one step of a full budget, or ⌈p / P'⌉ of them."""
    per_step = max(limits.max_num_batched_tokens / isl, 1.0)
    decoding = _beside(limits, max(n - per_step, 0.0))
    budget = _prefill_budget(limits, decoding)
    return max(math.ceil(isl / budget), 1) * _full_step_s(dep, n, decoding, isl, budget)


def _beside(limits: EngineLimits, decoding: float) -> float:
    """The sequences that decode in a step carrying a wave's prompts: none where the
    engine runs waiting prompts as prefill batches of their own first (SGLang's
    default, ``mixed_prefill`` off), so the wave's batches run back to back."""
    return decoding if limits.mixed_prefill else 0.0


def _prefill_budget(limits: EngineLimits, decoding: float) -> float:
    """P': the step's token budget less one token per decoding sequence."""
    return max(limits.max_num_batched_tokens - decoding, 1.0)


def _full_step_s(dep: EngineShape, n: int, decoding: float, isl: float, budget: float) -> float:
    """One step carrying min(P', n · p) prompt tokens beside ``decoding`` sequences at
    the prompt's context; each prompt token attends half its prompt on average."""
    chunk = min(budget, n * isl)
    context = decoding * perf.cached_tokens(dep.model, isl)
    return perf.forward_time_s(dep, decoding, context, chunk, chunk * isl / 2.0)
