"""Durations as Prometheus spells them ("90s", "1m30s", "2h"): the one grammar for every
duration setting, so the PromQL range, the seconds the controller computes with and
the chart's values schema always accept the same text and read it the same way.

Prometheus' own rule (``model.ParseDuration``): one or more ``<integer><unit>`` terms,
units from ``y w d h m s ms`` (a year is 365 days, a week 7), each at most once and
largest first. "1m30s" is 90 s; "30s1m" and "1m1m" are refused, as Prometheus refuses
them in a query. Prometheus also takes a bare "0", which no setting here can use.
"""

from __future__ import annotations

import re
from typing import Final

_UNIT_S: Final = {
    "y": 365 * 86400.0,
    "w": 7 * 86400.0,
    "d": 86400.0,
    "h": 3600.0,
    "m": 60.0,
    "s": 1.0,
    "ms": 1e-3,
}
# Prometheus' duration regexp without its bare "0". It also matches the empty string,
# which parse_duration_s and the chart's schema (minLength) refuse apart: no lookahead,
# because Helm checks the schema with Go's regexp. The chart carries this exact pattern
# (a unit test compares them).
PATTERN: Final = "^" + "".join(f"([0-9]+{u})?" for u in _UNIT_S) + "$"
_DURATION: Final = re.compile(PATTERN)


def parse_duration_s(text: str) -> float:
    """``text`` in seconds; ValueError with an example when it is not a duration.

    Example: ``parse_duration_s("1m30s") == 90.0``.
    """
    match = _DURATION.match(text) if text else None
    if match is None:
        raise ValueError(
            f"{text!r} is not a PromQL duration: give integers with units from y, w, d, h, m, "
            "s, ms, largest first, such as 90s, 1m30s or 2h"
        )
    terms = (group for group in match.groups() if group)
    return sum(float(term.rstrip("ywdhms")) * _UNIT_S[term.lstrip("0123456789")] for term in terms)
