"""Lulls a target's traffic has shown the fleet it must ride out.

The scale-down window (a pod's start-up plus one metrics window, ``control``) rides out
any lull shorter than itself: a pod given back there could not be back before the load
that needs it returns. Some traffic idles for longer and comes back all the same. In
Azure's 2023 code trace, re-timed into a day, two-minute counts run 650, 310, 0, 558
requests: a fleet that gives pods back after three quiet minutes is two pods strong
when the next burst lands, and misses a third of it while the pods it asked back
start. No fixed window suits both that and a day's slow fall, where holding pods for
minutes after each step down only pays for capacity the load has left.

So the loop learns the lulls from its own mistakes. It remembers each give-back (time,
replicas after, the window it waited out). When a window keeps fewer of its requests
within the TPOT bound than the SLO's percentile while pods it asked for are still
starting, the fleet was short for want of pods it had: the run of give-backs that took
the fleet below that count was regretted (``Lulls.regretted`` says which runs count).
The time from the recommendation's first fall to the rise that asked the pods back is
a lull this traffic has, and for ``LULL_MEMORY_S`` the scale-down window stretches to
cover the longest such lull (``Lulls.hold_s``).

A lull is load that left and came back. A fleet asked back at the rate it gave pods
back at was sized short, not caught by returning load: the calibration and the trim
answer for that, and an hour of held pods would not. So a run is learnt only if the
rate at the rise, or at a window within a metrics window of it that regrets it, is
above the rate at the give-back that took the fleet below what it wants, by more than
the two rates' own noise (``load_returned``). The window after the rise counts because a
burst's first window reads it low: the loop rises on the burst's queue before a
minute's rate sees it. Later windows do not: on a day's slow climb they read the climb,
and a give-back the recommendation's noise made on the way up, asked back at the rate
it left at, would be learnt as a lull and hold the afternoon's fall for an hour.

Only lulls up to ``defaults.SERVED_RANGE_S`` (15 min) are learnt: the planner already
holds capacity for the bursts around the served range's mean rate
(``rooftop_planner.bursts``), and a load that returns later than that is the day's drift,
which the window rate follows. What a learnt lull costs is bounded: after each real
fall the fleet stays at its level for at most one learnt lull.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from rooftop_control import defaults

# How long a learnt lull stretches the scale-down window, s: traffic changes character
# over a day (bursty working hours, a quiet night), and an hour keeps the lesson for the
# bursts of the same stretch of it without holding pods through the next.
LULL_MEMORY_S = 3600.0
# The longest lull learnt, s (module doc).
MAX_LULL_S = defaults.SERVED_RANGE_S
# How many standard deviations of the two windows' Poisson noise the rate at the rise
# must be above the rate at the give-back for the load to have come back: about a 1 in
# 40 chance that a steady load reads as returned.
RETURNED_Z = 2.0


@dataclass(frozen=True)
class GiveBack:
    """One scale-down: when (s), the replicas after it, the scale-down window it
    waited out (s): the recommendation had been lower that long already, and the
    window's rate then (req/s; None when unknown)."""

    t_s: float
    after: int
    window_s: float
    rate_rps: float | None = None


@dataclass(frozen=True)
class Rise:
    """The rise that ended a run of give-backs: when (s) and the window's rate then
    (req/s; None when unknown)."""

    t_s: float
    rate_rps: float | None = None


def load_returned(before: float | None, after: float | None, window_s: float) -> bool:
    """Whether a window's rate ``after`` (req/s) is above an earlier window's ``before``
    by more than ``RETURNED_Z`` standard deviations of their difference. Each rate counts
    the requests of a ``window_s`` window, about Poisson: the difference's deviation is
    √((before + after) / window_s) req/s. Unknown rates count as returned: the lesson
    the SLO's miss taught is kept when nothing says otherwise."""
    if before is None or after is None:
        return True
    noise = math.sqrt(max(before + after, 0.0) / window_s)
    return after - before > RETURNED_Z * noise


@dataclass(frozen=True)
class Lulls:
    """What the loop remembers of its give-backs and the lulls they taught it.

    Attributes:
        falling: the give-backs since the desired replicas last rose, oldest first.
        returned: the give-backs the last rise ended, while a window may still
            regret them, and that rise.
        learnt: (time learnt s, lull s) within ``LULL_MEMORY_S``.
    """

    falling: tuple[GiveBack, ...] = ()
    returned: tuple[tuple[GiveBack, ...], Rise] | None = None
    learnt: tuple[tuple[float, float], ...] = ()

    def hold_s(self, now_s: float) -> float:
        """The longest lull learnt within ``LULL_MEMORY_S`` of ``now_s``, s (0: none)."""
        return max((lull for t, lull in self.learnt if now_s - t < LULL_MEMORY_S), default=0.0)

    def moved(
        self,
        before: int,
        after: int,
        now_s: float,
        window_s: float,
        rate_rps: float | None = None,
    ) -> Lulls:
        """The record after the desired replicas went from ``before`` to ``after`` at
        ``now_s``, a give-back having waited out ``window_s``, on a window whose rate
        was ``rate_rps``."""
        if after < before:
            give_back = GiveBack(now_s, after, window_s, rate_rps)
            return replace(self, falling=(*self.falling, give_back))
        if after > before and self.falling:
            return replace(self, falling=(), returned=(self.falling, Rise(now_s, rate_rps)))
        return self

    def regretted(
        self,
        desired: int,
        now_s: float,
        startup_s: float,
        metrics_window_s: float,
        rate_rps: float | None = None,
    ) -> Lulls:
        """The record once a window broke the SLO's percentile while ``desired`` pods,
        more than were ready, were wanted.

        If the last rise, at most a start-up and a metrics window ago (the window can
        still describe the fleet it found), ended a run of give-backs that took the
        fleet below ``desired``, and the fleet had stayed smaller for at least a pod's
        start-up (``startup_s``) and at most ``MAX_LULL_S``, that run was a lull to
        hold through: from the recommendation's first fall (the run's first give-back less
        the window it waited) to the rise. It is learnt once, and only if the load came
        back: the rise's rate, or this window's (``rate_rps``) within a metrics window of
        the rise, is above that of the give-back that took the fleet below ``desired``
        (``load_returned`` over a ``metrics_window_s`` window).

        A rise sooner than a start-up after the give-back is the recommendation
        moving with the rate's noise around a level, which the scale-down window is
        sized for: the pod would have been asked back before its replacement could
        serve either way, and an hour of longer holds costs more than that dip did.
        """
        if self.returned is None:
            return self
        run, rise = self.returned
        first = run[0]
        down_s = rise.t_s - first.t_s
        if now_s - rise.t_s > startup_s + metrics_window_s or run[-1].after >= desired:
            return self
        if not startup_s <= down_s <= MAX_LULL_S:
            return self
        below = next(g for g in run if g.after < desired)
        if now_s - rise.t_s > metrics_window_s:  # the climb's, not the burst's (module doc)
            rate_rps = None
        known = [r for r in (rise.rate_rps, rate_rps) if r is not None]
        back = max(known) if known else None
        if not load_returned(below.rate_rps, back, metrics_window_s):
            return self
        lull = down_s + first.window_s
        kept = tuple((t, s) for t, s in self.learnt if now_s - t < LULL_MEMORY_S)
        return replace(self, returned=None, learnt=(*kept, (now_s, lull)))
