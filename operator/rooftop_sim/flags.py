"""Range checks for numeric command-line flags, one message shape for every subcommand
(``simulate``, ``engine-sim``, ``load``): the flag, what it must be, what it got."""

from __future__ import annotations

import math
from collections.abc import Iterable

# (flag, value, lowest allowed, whether the lowest itself is excluded); an int bound
# means the flag takes integers.
Rule = tuple[str, float, float, bool]


def check_ranges(rules: Iterable[Rule]) -> None:
    """ValueError naming the first flag that is NaN, infinite or below its bound."""
    for flag, value, low, strict in rules:
        if not (math.isfinite(value) and (value > low if strict else value >= low)):
            kind = "an integer" if isinstance(low, int) else "a finite number"
            sign = ">" if strict else ">="
            raise ValueError(f"{flag}: must be {kind} {sign} {low:g}, got {value}")
