"""vLLM's host work per engine step, its own and its host-side drafters' (n-gram prompt
lookup and suffix trees), from measured timings.

Every vLLM step does host work besides the GPU's: the scheduler picks the batch, the
model runner updates its persistent batch and builds the step's inputs and attention
metadata, turns the sampled ids into lists, and the scheduler appends them and checks
for stops, most of it Python per running request (``catalog/vllm_host_step.csv``,
``benchmarks/measure_vllm_host_step.py``: the real vLLM on its tests' tiny model, the
forward and the sampler taken off). With async scheduling, vLLM's default, that work
overlaps the GPU's step before, so a step takes the longer of the two
(``vllm_step_host_s``); without it the GPU waits for it, and the two add up.

Two of vLLM's speculative methods draft on the host between steps, and the next step
waits for them (and vLLM turns async scheduling off for them):

- ``ngram`` (``NgramProposer.propose``): for each running request, a scan of its tokens
  (prompt and output so far) for the last earlier occurrence of its latest n-gram, a
  KMP pass linear in the request's length, on one numba thread whatever the TP;
- ``suffix`` (``SuffixDecodingProposer.propose``, Arctic Inference's suffix trees): for
  each running request, its new token appended to its prompt's tree and to the global
  tree of past answers, and a walk of both for a draft, bounded by the trees' depth;
  a request's first call also builds its prompt's tree, once.

``catalog/ngram_lookup.csv`` and ``catalog/suffix_lookup.csv`` time those calls on a CPU
over batches of B requests of L tokens each (``benchmarks/measure_ngram_lookup.py``,
``benchmarks/measure_suffix_lookup.py``). Fitted, with weights 1 / t so that every row
counts by its relative error::

    t(B, T, P) = c0 + c1 · B + c2 · B² + c3 · T + c4 · P      seconds

T = B · L tokens the requests hold, P the prompt tokens whose trees the step builds
(``suffix`` only: the table's ``start_seconds`` over B · L; 0 for ``ngram``). c1 is the
per-request Python work, c2 its list and set lookups (quadratic in the batch), c3 the
scan per token (n-gram), c4 a prompt tree's building per token (suffix). The draft length
does not enter: the walk or scan finds the match before it copies the K tokens after it
(the tables time K = 1, 3, 5 alike).

The engine's table is fitted the same way, T = B · C for B running requests of C
tokens each, P = 0.

The timings are one CPU's (each table's first line names it); a GPU server's host
cores are of the same class. The engine's table was timed on vLLM's CPU build, whose
attention backend builds its own metadata rather than FlashAttention's; the rest is the
code a GPU server runs.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

import numpy as np

from rooftop_planner.kernels import FloatArray

# The measured table of each host-side method (``catalog/``).
TABLES = {"ngram": "ngram_lookup.csv", "suffix": "suffix_lookup.csv"}
# vLLM's own host work per step (``catalog/``).
ENGINE_TABLE = "vllm_host_step.csv"
# Engines whose own host work per step is measured (``vllm_step_host_s``).
HOST_TIMED_ENGINES = frozenset({"vllm"})
# Rows whose prompt trees are too small to time apart from a step (B · L tokens).
MIN_START_TOKENS = 16384


@dataclass(frozen=True)
class LookupCost:
    """t(B, T, P) = c0 + c1 · B + c2 · B² + c3 · T + c4 · P seconds (module docstring),
    and the table's first line (what was timed, where)."""

    coefficients: tuple[float, float, float, float]
    measured_on: str
    per_prompt_token_s: float = 0.0

    def seconds(
        self, seqs: FloatArray, tokens: FloatArray, prompt_tokens: FloatArray | float = 0.0
    ) -> FloatArray:
        """Host seconds of one drafting call over ``seqs`` requests holding ``tokens``
        tokens in all (arrays of one shape), building the trees of ``prompt_tokens``
        prompt tokens; none for an empty batch."""
        c0, c1, c2, c3 = self.coefficients
        cost = c0 + c1 * seqs + c2 * seqs * seqs + c3 * tokens
        return np.where(seqs > 0, cost, 0.0) + self.per_prompt_token_s * prompt_tokens


def lookup_cost(method: str = "ngram") -> LookupCost:
    """The fit of the packaged table of ``method`` (``ngram`` or ``suffix``)."""
    return table_cost(TABLES[method])


def vllm_step_cost() -> LookupCost:
    """The fit of vLLM's own host work per step (``ENGINE_TABLE``)."""
    return table_cost(ENGINE_TABLE)


def vllm_step_host_s(seqs: FloatArray, tokens: FloatArray) -> FloatArray:
    """Host seconds of one vLLM step of ``seqs`` running requests holding ``tokens`` tokens
    in all (arrays of one shape); none for an empty step."""
    return vllm_step_cost().seconds(seqs, tokens)


@dataclass(frozen=True)
class MeasuredRows:
    """One packaged table of host seconds: its rows as arrays and its first line."""

    batch: FloatArray
    tokens: FloatArray  # B · tokens per request
    seconds: FloatArray
    start_seconds: FloatArray  # empty where the table times no first call
    measured_on: str


def measured_rows(table: str) -> MeasuredRows:
    """The rows of ``catalog/<table>``."""
    text = resources.files("rooftop_planner").joinpath("catalog", table).read_text()
    lines = text.splitlines()
    rows = list(csv.DictReader(line for line in lines if not line.startswith("#")))
    batch = np.array([float(r["batch"]) for r in rows])
    return MeasuredRows(
        batch=batch,
        tokens=batch * np.array([float(r["tokens_per_request"]) for r in rows]),
        seconds=np.array([float(r["seconds"]) for r in rows]),
        start_seconds=np.array([float(r["start_seconds"]) for r in rows if r.get("start_seconds")]),
        measured_on=lines[0].lstrip("# "),
    )


@lru_cache(maxsize=len(TABLES) + 1)
def table_cost(table: str) -> LookupCost:
    """The fit of one packaged table of host seconds (``catalog/<table>``)."""
    t = measured_rows(table)
    per_token = _per_prompt_token(t.tokens, t.start_seconds) if t.start_seconds.size else 0.0
    return LookupCost(_fit(t.batch, t.tokens, t.seconds), t.measured_on, per_token)


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


def _per_prompt_token(tokens: FloatArray, start_seconds: FloatArray) -> float:
    """c4: the median of the first call's extra seconds per prompt token, over the rows
    that build at least ``MIN_START_TOKENS`` tokens of trees (below that the difference
    of two timings is mostly the timer's)."""
    large = tokens >= MIN_START_TOKENS
    return float(np.median(start_seconds[large] / tokens[large]))


__all__ = [
    "ENGINE_TABLE",
    "HOST_TIMED_ENGINES",
    "LookupCost",
    "MeasuredRows",
    "TABLES",
    "lookup_cost",
    "measured_rows",
    "table_cost",
    "vllm_step_cost",
    "vllm_step_host_s",
]
