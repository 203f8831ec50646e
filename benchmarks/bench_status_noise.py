"""Status writes a steady target makes from noise alone: the loop's rule against the
counts' noise only, on the simulated engine.

    .venv/bin/python benchmarks/bench_status_noise.py [--hours 1.5] [--seeds 0,1]
        [--rates 1,3] [--warmup-s 1200] [--ramp 1]

Each run replays a steady Poisson stream (the bundled chat example's rate times each of
``--rates``, lengths drawn from its Azure conversation trace) through the simulated
cluster under the operator's controller, then replays the ticks' ``status.observed``
through the status rule three ways: at two deviations of the counts' noise (the rule
before the spread was measured), at three, and at three with the target's measured
spread (the operator's). Writes per hour count only ticks after ``--warmup-s`` (the
served range and the spread fill first) and only figures moving, not decisions.
``--ramp R`` makes the rate climb linearly to R times its start over the run: a status
that follows it stays near the rate as it climbs (the table's last column: the most the
rate shown in status was off the window's rate, as a share of it, with the measured
spread). The loop's replica moves go to stderr with its reasons.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rooftop_control.control import Decision
from rooftop_control.readings import Observation
from rooftop_operator import loop
from rooftop_operator.figure_spread import FigureSpread
from rooftop_sim import simulate
from rooftop_sim.cluster import Cluster, RequestStream
from rooftop_sim.policies import RooftopPolicy

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "simulated-chat.yaml"
TRACE = ROOT / "examples" / "traces" / "azure_conv_excerpt.csv"
Tick = tuple[float, Decision, Observation]
RULES = (("counts, z=2", 2.0, False), ("counts, z=3", 3.0, False), ("measured, z=3", 3.0, True))


def arrivals(rate: float, horizon_s: float, ramp: float, rng: np.random.Generator) -> Any:
    """Poisson arrivals (s) whose rate climbs linearly from ``rate`` to ``ramp``·``rate``
    over ``horizon_s``: unit-rate arrivals u mapped through the inverse of the cumulative
    rate Λ(t) = rate·(t + (ramp − 1)·t²/(2·T))."""
    total = rate * horizon_s * (1.0 + ramp) / 2.0
    u = np.cumsum(rng.exponential(1.0, int(total)))
    if ramp == 1.0:
        return u / rate
    k = (ramp - 1.0) / horizon_s
    return (np.sqrt(1.0 + 2.0 * k * u / rate) - 1.0) / k


def steady_ticks(hours: float, rate_x: float, seed: int, ramp: float = 1.0) -> list[Tick]:
    """The controller's ticks over ``hours`` of Poisson arrivals at ``rate_x`` times the
    example's declared rate (climbing to ``ramp`` times that)."""
    spec = simulate.load_spec(str(EXAMPLE))
    trace = simulate.workload_from_trace(str(TRACE))
    rng = np.random.default_rng(seed)
    rate = spec.workload.requests_per_second * rate_x
    arrived = arrivals(rate, hours * 3600.0, ramp, rng)
    picks = rng.integers(0, len(trace.arrival_s), len(arrived))
    stream = RequestStream(
        arrived,
        trace.prompt_tokens[picks],
        trace.output_tokens[picks],
        f"steady {rate:.1f} req/s",
    )
    scn = simulate.scenario(spec, stream, seed=seed)
    policy, _ = simulate.make_policy(scn, "rooftop")
    assert isinstance(policy, RooftopPolicy)
    ticks: list[Tick] = []
    Cluster(scn.workload, scn.sim).run(_Recording(policy, ticks), None)
    return ticks


@dataclass
class _Recording:
    """The controller, keeping each tick's decision and observation."""

    policy: RooftopPolicy
    ticks: list[Tick]

    @property
    def name(self) -> str:
        return self.policy.name

    def start(self) -> tuple[int, int]:
        return self.policy.start()

    def decide(self, now_s: float, obs: Observation) -> tuple[int, int]:
        out = self.policy.decide(now_s, obs)
        self.ticks.append((now_s, self.policy.decisions[-1], obs))
        return out


@contextmanager
def deviations(z: float) -> Iterator[None]:
    before = loop.OBSERVED_NOISE_Z
    loop.OBSERVED_NOISE_Z = z
    try:
        yield
    finally:
        loop.OBSERVED_NOISE_Z = before


def writes_per_hour(
    ticks: Sequence[Tick], measured: bool, warmup_s: float
) -> tuple[float, Counter[str], float]:
    """Status writes per hour after ``warmup_s``, the figures that made them, and the
    most the rate status showed was off the window's rate (a share of it)."""
    spread, stored, writes, why, off = FigureSpread(), None, 0, Counter[str](), 0.0
    for now_s, d, obs in ticks:
        new = loop.observed_status(d, obs, "")
        noise = spread.noise() if measured else None
        spread.add(loop._figures(new), now_s)
        if now_s < warmup_s:
            stored = new
            continue
        news = loop.observed_news(stored, new, 60.0, noise)
        if news:
            writes, stored = writes + 1, new
            why.update(news)
        shown, now = _rate(stored), _rate(new)
        if shown and now:
            off = max(off, abs(shown - now) / now)
    hours = max(ticks[-1][0] - warmup_s, 1.0) / 3600.0
    return writes / hours, why, off


def _rate(observed: Any) -> float | None:
    rate: float | None = None if observed is None else observed.requests_per_second
    return rate


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hours", type=float, default=1.5)
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--rates", default="1,3", help="multiples of the example's rate")
    ap.add_argument("--warmup-s", type=float, default=1200.0)
    ap.add_argument("--ramp", type=float, default=1.0, help="end rate over start rate")
    args = ap.parse_args(argv)
    names = " | ".join(r[0] for r in RULES)
    print(f"| rate | seed | replicas | {names} | measured / z=2 | rate shown off by |")
    print("|---|---|---|" + "---|" * (len(RULES) + 2))
    for rate_x in (float(r) for r in args.rates.split(",")):
        for seed in (int(s) for s in args.seeds.split(",")):
            began = time.monotonic()
            ticks = steady_ticks(args.hours, rate_x, seed, args.ramp)
            per_hour = []
            for _, z, measured in RULES:
                with deviations(z):
                    rate, why, off = writes_per_hour(ticks, measured, args.warmup_s)
                per_hour.append(rate)
                print(f"  {z=} {measured=}: {why.most_common(4)}", file=sys.stderr)
            replicas = sorted({d.replicas for _, d, _ in ticks})
            for now_s, d, _ in ticks:  # the loop's moves, with its reasons
                if d.replicas != d.previous_replicas:
                    move = f"{d.previous_replicas} -> {d.replicas}"
                    print(f"  {now_s:6.0f} s {move} [{d.cause.value}] {d.reason}", file=sys.stderr)
            cells = " | ".join(f"{w:.1f}/h" for w in per_hour)
            ratio = per_hour[-1] / per_hour[0] if per_hour[0] else float("nan")
            row = f"| {rate_x:g}x | {seed} | {replicas} | {cells} | {ratio:.3f} | {off:.0%} |"
            print(row, flush=True)
            print(f"  ({time.monotonic() - began:.0f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
