"""The TPOT percentile over requests (``tail.py``) against a Monte Carlo of its own model.

The model: a request with o output tokens sees N ~ Poisson(λ · t̄ · (o − 1)) prompt
admissions during its decode steps, each adding Δ to one step, and a batch deviation
averaged over its life; its TPOT is t_d + s · ε + Δ · N / (o − 1). A prompt in c chunks
adds δ = Δ / c to each of c consecutive steps, of which the request shares those in its
life. The closed-form mixture quantile must match sampling that model, and behave as the
tail should.
"""

from __future__ import annotations

import numpy as np
import pytest

from rooftop_planner import tail

ONE = np.ones(1)


def quantile(q: float, outputs: list[float], extra_s: float = 0.03, rate: float = 4.0,
             slope_s: float = 2e-4, batch: float = 20.0, chunks: int = 1) -> float:  # fmt: skip
    """The model's quantile for one prompt stratum whose prefill adds ``extra_s`` in all,
    in ``chunks`` steps."""
    outs = np.array(outputs, dtype=float)
    value = tail.tpot_quantile(
        q, ONE * 0.02, ONE * slope_s, ONE * batch, ONE * rate, ONE * 0.025,
        ONE * extra_s, np.full((1, 1), extra_s / chunks), np.full((1, 1), float(chunks)),
        ONE, outs, float(outs.mean()),
    )  # fmt: skip
    return float(value[0])


def sampled(q: float, outputs: list[float], extra_s: float = 0.03, rate: float = 4.0,
            slope_s: float = 2e-4, batch: float = 20.0, chunks: int = 1) -> float:  # fmt: skip
    """Sampled: admissions start their run of chunk steps at every step from c − 1
    before the request's first decode step to its last, Poisson at λ · t̄ per step."""
    rng = np.random.default_rng(0)
    n = 400_000
    o = rng.choice(np.array(outputs, dtype=float), n)
    life = o - 1.0
    mean_o = float(np.mean(outputs))
    admissions = rng.poisson(rate * 0.025 * (life + chunks - 1))
    owner = np.repeat(np.arange(n), admissions)
    start = rng.integers(0, (life + chunks - 1).astype(np.int64)[owner]) - (chunks - 1)
    shared = np.minimum(start + chunks, life[owner]) - np.maximum(start, 0)
    steps_shared = np.bincount(owner, weights=shared, minlength=n)
    spread = rng.normal(0.0, np.sqrt(batch * mean_o / (mean_o + o)))
    tpot = 0.02 + slope_s * spread + extra_s / chunks * steps_shared / life
    return float(np.quantile(tpot, q))


@pytest.mark.parametrize("q", [0.5, 0.9, 0.99])
@pytest.mark.parametrize("outputs", [[200.0], [20.0, 60.0, 150.0, 400.0], [8.0, 500.0]])
def test_the_mixture_quantile_matches_sampling_the_model(q: float, outputs: list[float]) -> None:
    # within 1 ms of 20-60 ms: the moments-based components are approximations
    assert quantile(q, outputs) == pytest.approx(sampled(q, outputs), abs=1.2e-3)


def test_short_answers_widen_the_tail_at_the_same_mean() -> None:
    long_only = quantile(0.99, [400.0])
    mixed = quantile(0.99, [10.0, 400.0])
    assert mixed > long_only + 5e-3


def test_percentiles_rise_and_no_admissions_means_the_decode_step() -> None:
    values = [quantile(q, [20.0, 100.0, 300.0]) for q in (0.5, 0.9, 0.99)]
    assert values == sorted(values) and values[0] < values[-1]
    still = quantile(0.99, [20.0, 100.0], extra_s=0.0, slope_s=0.0)
    assert still == pytest.approx(0.02, abs=1e-6)


@pytest.mark.parametrize("q", [0.9, 0.99])
@pytest.mark.parametrize("chunks", [2, 8, 40])
@pytest.mark.parametrize("outputs", [[6.0, 30.0], [4.0, 20.0, 150.0, 400.0]])
def test_chunked_prompts_are_never_under_sampling_the_model(
    q: float, chunks: int, outputs: list[float]
) -> None:
    """The variance's bound (``chunks_seen``) errs high: at most 2 ms over 25-35 ms."""
    got, want = quantile(q, outputs, chunks=chunks), sampled(q, outputs, chunks=chunks)
    assert want - 3e-4 <= got <= want + 2e-3


def test_smaller_chunks_narrow_short_answers_tail_not_long_ones() -> None:
    """The same prefill work split over more steps than a 5-token answer lives: it
    shares a slice of it; a long answer all of it (so the long answers' tail stays)."""
    short = [quantile(0.99, [5.0, 400.0], chunks=c) for c in (1, 16, 64)]
    assert short[0] > short[1] + 5e-3 and short[1] > short[2] + 2e-3
    long_only = [quantile(0.99, [400.0], chunks=c) for c in (1, 4)]
    assert long_only[0] == pytest.approx(long_only[1], abs=2e-4)


def test_the_overlap_bound_holds_and_is_tight_at_either_end() -> None:
    """Against Σk² of the overlap k of a run of c steps with L steps, by brute force over
    the run's starts: never under it, equal for one-step prompts, within 2 % for runs
    much longer than the life."""

    def exact(life: int, c: int) -> int:
        return sum((min(s + c, life) - max(s, 0)) ** 2 for s in range(-(c - 1), life))

    def bound(life: int, c: int) -> float:
        seen = tail.chunks_seen(np.array([float(life)]), np.array([float(c)]))
        return float(life * c * c * seen[0])

    for life, c in [(1, 1), (5, 1), (5, 3), (3, 5), (7, 7), (2, 9), (30, 4), (4, 30)]:
        assert bound(life, c) >= exact(life, c)
    assert bound(40, 1) == exact(40, 1)
    assert bound(2, 200) <= 1.02 * exact(2, 200)
