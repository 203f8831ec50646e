"""How far each ``status.observed`` figure of one target wanders by itself: measured.

The loop rewrites a target's status only when a figure moves beyond its noise. The noise
modelled from counts (``loop._sampling_noise``: a figure of n independent events moves
by about √(2/n) of itself) holds for a rate, not for what the loop also shows: a TTFT
percentile of requests that queue behind each other, a gauge read at one instant, the
fullest replica's KV usage, a median of lengths that cluster. On a steady simulated hour
those moved by twice their modelled noise and rewrote status fifty times an hour. So
the loop also measures how far each figure moves on the target itself over one metrics
window, and a figure is news only beyond both.

Differences a window apart, not the spread around a running mean: two windows that do
not overlap differ by √2·σ of the noise, plus what a trend moves in one window (little),
where the spread around a mean would count a day's ramp as noise and stop status
following it. A figure read over the served range (the workload's lengths, the prefix
cache's hit ratio) is compared with its value a range (15 min) before, for the same
reason. The squares are averaged with exponential weights, a half-life of the served
range. Kept in memory: an operator restarts with the counts' model alone until it has
seen a window (a range) of figures again.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rooftop_control.defaults import METRICS_WINDOW_S, SERVED_RANGE_S
from rooftop_control.readings import SIGNALS
from rooftop_control.signals import Ratio

# The weight of a squared difference falls by half over this many seconds of later ones.
SPREAD_HALF_LIFE_S = SERVED_RANGE_S
# Figures read over the served range: the workload's, and the signals read over it.
SERVED_FIGURES = ("observed.workload.",) + tuple(
    f"observed.{s.status_key}"
    for s in SIGNALS
    if s.status_key and isinstance(s.promql, Ratio) and s.promql.served
)


@dataclass
class _Lagged:
    """Past figures, to find those ``lag_s`` before now: a snapshot kept at most every
    ``every_s`` (s), older ones dropped once a newer one is ``lag_s`` old."""

    lag_s: float
    every_s: float = 0.0
    _history: deque[tuple[float, dict[str, float]]] = field(default_factory=deque)

    def before(self, now_s: float) -> dict[str, float]:
        """The newest figures at least ``lag_s`` older than ``now_s`` ({} before any)."""
        due = now_s - self.lag_s
        while len(self._history) > 1 and self._history[1][0] <= due:
            self._history.popleft()
        if self._history and self._history[0][0] <= due:
            return self._history[0][1]
        return {}

    def keep(self, now_s: float, figures: dict[str, float]) -> None:
        if not self._history or now_s - self._history[-1][0] >= self.every_s:
            self._history.append((now_s, figures))


@dataclass
class FigureSpread:
    """Per figure (dotted path such as ``observed.ttftMs``), the weighted mean square of
    its moves over ``lag_s`` (the metrics window; the served range for
    ``SERVED_FIGURES``): what it moves by itself."""

    lag_s: float = METRICS_WINDOW_S
    half_life_s: float = SPREAD_HALF_LIFE_S
    range_s: float = SERVED_RANGE_S
    _squares: dict[str, float] = field(default_factory=dict)
    _window: _Lagged = field(init=False)
    _range: _Lagged = field(init=False)
    _last_s: float | None = None

    def __post_init__(self) -> None:
        self._window = _Lagged(self.lag_s)
        # one snapshot a window finds the served figures a range before within a window
        self._range = _Lagged(self.range_s, every_s=self.lag_s)

    def add(self, figures: Mapping[str, Any], now_s: float, path: str = "observed.") -> None:
        """Fold one tick's figures (``status.observed`` as stored, nested) in at
        ``now_s`` (s, monotonic).

        Each figure's move d = x(t) − x(t − lag), against the newest earlier tick at
        least a lag old; its square joins an exponentially weighted mean with a
        gap-dependent weight α = 1 − 2^(−Δt / half-life): s ← s + α·(d² − s).
        """
        leaves = _leaves(figures, path)
        gap_s = 0.0 if self._last_s is None else max(now_s - self._last_s, 0.0)
        self._last_s = now_s
        weight = 1.0 - 2.0 ** (-gap_s / self.half_life_s)
        windowed, ranged = self._window.before(now_s), self._range.before(now_s)
        for key, value in leaves.items():
            before = ranged if key.startswith(SERVED_FIGURES) else windowed
            if key not in before:
                continue
            square = (value - before[key]) ** 2
            held = self._squares.get(key)
            self._squares[key] = square if held is None else held + weight * (square - held)
        self._window.keep(now_s, leaves)
        self._range.keep(now_s, {k: v for k, v in leaves.items() if k.startswith(SERVED_FIGURES)})

    def noise(self) -> dict[str, float]:
        """Per figure, the root mean square of its moves over its lag, in its unit: for
        noise of deviation σ, √2·σ."""
        return {key: math.sqrt(square) for key, square in self._squares.items()}


def _leaves(figures: Mapping[str, Any], path: str) -> dict[str, float]:
    """The numeric leaves of nested figures by dotted path (booleans and states are
    not figures)."""
    out: dict[str, float] = {}
    for key, value in figures.items():
        if isinstance(value, Mapping):
            out |= _leaves(value, f"{path}{key}.")
        elif (
            isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        ):
            out[path + key] = float(value)
    return out
