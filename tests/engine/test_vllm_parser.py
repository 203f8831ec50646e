"""rooftop_api.vllm_args against the real `vllm serve` parser: every argument list
the checker resolves, vLLM parses, setting the same dests; every one the checker
refuses as vLLM would (unknown, ambiguous, missing value, not a choice, positional),
vLLM refuses too. Policy refusals (a dest the plan owns) are not parse errors, so the
cases below use check-free ``resolve``; values are valid for their types (the checker
leaves types other than choices to vLLM)."""

from __future__ import annotations

import pytest

from rooftop_api.vllm_args import ExtraArgError, resolve
from tests.engine.conftest import RunCases

pytestmark = pytest.mark.vllm

CASES: list[list[str]] = [
    ["--max_num_seqs=512"],
    ["--max-num-seq", "512"],
    ["--tensor_parallel_size", "8"],
    ["-pp", "2"],
    ["-dp", "2"],
    ["-t", "2"],
    ["-qawq"],
    ["--dtype", "half"],
    ["--num-gpu-blocks-override", "100"],
    ["--device-memory-util", "0.5"],
    ["--enable-prefix-caching"],
    ["--no-enable-prefix-caching"],
    ["--enable-prefix-cach"],
    ["--block-size", "32"],
    ["--compilation-config.mode", "3"],
    ["-cc.mode=3"],
    ["-O3"],
    ["-O", "3"],
    ["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3, '
     '"prompt_lookup_max": 4}'],
    ["--seed", "-1"],
    ["--api-key", "a", "b", "--enforce-eager"],
    ["--kv-cache-dtype", "fp8"],
    ["--max-lora-rank", "8"],
    ["--moe-backend", "Flashinfer-Cutlass"],
    ["--dcp-comm-backend", "a2a"],
    ["--gpu_memory_utilization=0.5"],
    ["--max-num-batched-tokens", "8k"],
    ["--max-num-batched-tokens=25.6k"],
    ["--cpu-offload-gb", "1.5"],
    # refused by both
    ["--block-size", "abc"],
    ["--seed", "1.5"],
    ["--cpu-offload-gb", "x"],
    ["--max-num-batched-tokens", "8kb"],
    ["--max-num-batched-tokens", "2.5M"],
    ["--num-scheduler-steps", "8"],
    ["--swap-space", "4"],
    ["--disable-log-requests"],
    ["-tp2"],
    ["--enable-log"],
    ["-d", "2"],
    ["--max-lora-rank", "7"],
    ["--moe-backend", "bogus"],
    ["stray"],
    ["--block-size"],
    ["--block-size", "--enforce-eager"],
    ["--enable-prefix-caching=yes"],
    ["--", "x"],
    ["-cc.mode"],
    ["--enable-prefix-cashing"],
]  # fmt: skip


def checker(args: list[str]) -> set[str] | None:
    """The dests the checker says ``args`` set, or None where it says vLLM refuses."""
    try:
        return {setting.dest for setting in resolve(args)}
    except ExtraArgError:
        return None


def test_the_checker_reads_arguments_as_vllm_does(run_cases: RunCases) -> None:
    cases = [{"id": str(i), "argv": ["some/model", *args]} for i, args in enumerate(CASES)]
    real = run_cases(cases)
    wrong = []
    for i, args in enumerate(CASES):
        result, ours = real[str(i)], checker(args)
        theirs = None
        if result["verdict"] == "ok":
            theirs = set(result["dests"]) - {"model", "model_tag"}
        if ours != theirs:
            wrong.append(f"{args}: checker {ours}, vLLM {theirs} {result.get('message', '')}")
    assert not wrong, "\n".join(wrong)
