"""vLLM's n-gram prompt lookup as host time per engine step, from measured timings.

vLLM's ``ngram`` proposer drafts on the host between steps: for each running request
it scans the request's tokens (prompt and output so far) for the last earlier
occurrence of its latest n-gram, a KMP pass linear in the request's length, on one
numba thread whatever the TP, and the next step waits for it. ``catalog/
ngram_lookup.csv`` times that call (``NgramProposer.propose``) on a CPU over batches of
B requests of L tokens each (``benchmarks/measure_ngram_lookup.py``). Fitted, with
weights 1 / t so that every row counts by its relative error::

    t(B, T) = c0 + c1 · B + c2 · B² + c3 · T      seconds, T = B · L tokens scanned

c1 is the per-request Python work around the scan, c2 its list lookups (quadratic in
the batch), c3 the scan per token. The draft length does not enter: the scan finds the
match before it copies the K tokens after it (the table times K = 1, 3, 5 alike).

The timings are one CPU's (the table's first line names it); a GPU server's host
cores are of the same class. What the table leaves out: vLLM runs ``ngram`` without
async scheduling, so the engine's own scheduling is no longer hidden behind the GPU's
work; the planner does not price that.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

import numpy as np

from rooftop_planner.kernels import FloatArray

TABLE = "ngram_lookup.csv"


@dataclass(frozen=True)
class LookupCost:
    """t(B, T) = c0 + c1 · B + c2 · B² + c3 · T seconds (module docstring), and the
    table's first line (what was timed, where)."""

    coefficients: tuple[float, float, float, float]
    measured_on: str

    def seconds(self, seqs: FloatArray, tokens: FloatArray) -> FloatArray:
        """Host seconds of one lookup over ``seqs`` requests holding ``tokens`` tokens
        in all (arrays of one shape); none for an empty batch."""
        c0, c1, c2, c3 = self.coefficients
        cost = c0 + c1 * seqs + c2 * seqs * seqs + c3 * tokens
        return np.where(seqs > 0, cost, 0.0)


@lru_cache(maxsize=1)
def lookup_cost() -> LookupCost:
    """The fit of the packaged table (``catalog/ngram_lookup.csv``)."""
    text = resources.files("rooftop_planner").joinpath("catalog", TABLE).read_text()
    lines = text.splitlines()
    rows = list(csv.DictReader(line for line in lines if not line.startswith("#")))
    batch = np.array([float(r["batch"]) for r in rows])
    tokens = batch * np.array([float(r["tokens_per_request"]) for r in rows])
    seconds = np.array([float(r["seconds"]) for r in rows])
    return LookupCost(_fit(batch, tokens, seconds), lines[0].lstrip("# "))


def _fit(
    batch: FloatArray, tokens: FloatArray, seconds: FloatArray
) -> tuple[float, float, float, float]:
    """Least squares in relative error (each row weighted 1 / t), every coefficient
    kept at zero or above (a negative one would make some batch cost less than none)."""
    design = np.stack([np.ones_like(batch), batch, batch * batch, tokens], axis=1)
    weight = 1.0 / seconds
    coef, *_ = np.linalg.lstsq(design * weight[:, None], seconds * weight, rcond=None)
    c0, c1, c2, c3 = (max(float(c), 0.0) for c in coef)
    return (c0, c1, c2, c3)


__all__ = ["LookupCost", "lookup_cost"]
