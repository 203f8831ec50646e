"""spec.engine.extraArgs: free `vllm serve` flags, read with vLLM's own parsing rules,
except those that set what the plan sets and those vLLM does not have (the CRD repeats
the exact spellings in CEL: tests/e2e/manifests/invalid/25-*, 26-*, 27-*)."""

from __future__ import annotations

import re

import pytest
from pydantic import ValidationError

from rooftop_api.spec import Engine
from rooftop_api.vllm_args import load_table

# the vLLM the flag table is of, as the messages name it (a bump changes only the table)
VLLM = re.escape(f"vLLM {load_table().vllm_version}")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--max-num-seqs", "512"], r"'--max-num-seqs' sets max_num_seqs.*the feedback loop"),
        # vLLM reads --x_y as --x-y, and argparse takes a unique prefix
        (["--max_num_seqs=512"], r"sets max_num_seqs \(--max-num-seqs\).*the feedback loop"),
        (["--max-num-seq", "512"], r"sets max_num_seqs \(--max-num-seqs\)"),
        (["--tensor_parallel_size", "8"], r"sets tensor_parallel_size.*maxTensorParallel"),
        (["--tensor-parallel-size=4"], r"remove it \(bound it with spec\.constraints\.maxT"),
        (["-tp", "2"], r"'-tp' sets tensor_parallel_size.*maxTensorParallel"),
        (["-t", "2"], r"'-t' sets tensor_parallel_size \(-tp\)"),
        (["-pp", "2"], r"'-pp' sets pipeline_parallel_size.*replicas"),
        (["-dp", "2"], r"'-dp' sets data_parallel_size.*replicas"),
        (["--data-parallel-size-local", "2"], r"sets data_parallel_size_local"),
        (["--config", "file.yaml"], r"'--config' sets config.*can set any flag"),
        (["--dtype", "half"], r"'--dtype' sets dtype.*spec\.constraints\.weightDtypes"),
        (["-qawq"], r"'-qawq' sets quantization \(-q\).*weightDtypes"),
        (["--kv-cache-dtype=fp8"], r"spec\.constraints\.kvDtypes"),
        (["--max-num-batched-tokens=2048"], r"sets max_num_batched_tokens.*chunks of its token"),
        (["--max-model-len", "4096"], r"sets max_model_len.*spec\.engine\.maxModelLen"),
        (["--num-gpu-blocks-override", "100"], r"sets num_gpu_blocks_override.*KV cache"),
        (["--device-memory-utilization", "0.5"], r"sets gpu_memory_utilization"),
        (["--kv-cache-memory-bytes", "8G"], r"sets kv_cache_memory_bytes"),
        (["--model=x"], r"sets model.*spec\.model"),
        (["--port", "9000"], r"the Service and the probes depend on it"),
        (["--host", "127.0.0.1"], r"sets host"),
        (["--help"], r"print its help and exit"),
        # a dotted JSON argument sets its base flag
        (["--max_num_seqs.x", "5"], r"sets max_num_seqs"),
        # flags the pinned vLLM does not have: the engine would exit at start-up
        (["--num-scheduler-steps", "8"], rf"{VLLM} has no flag --num-scheduler-steps"),
        (["--speculative-model", "x"], rf"{VLLM} has no flag.*--speculative-config"),
        (["--swap-space=4"], rf"{VLLM} has no flag --swap-space"),
        (["--disable-log-requests"], r"has no flag --disable-log-requests.*--enable-log-req"),
        (["--enable-prefix-cashing"], r"no flag --enable-prefix-cashing.*did you mean --ena"),
        (["-tp2"], r"has no flag -tp2.*did you mean -tp\?"),  # argparse: not -tp 2
        # argparse refuses an ambiguous prefix
        (["--enable-log"], r"'--enable-log' is ambiguous in vLLM.*--enable-log-outputs"),
        # and a value outside the flag's choices
        (["--max-lora-rank", "7"], r"'7' is not a choice of --max-lora-rank"),
        # vLLM takes one positional, the model: a second one is refused
        (["other-model"], r"'other-model' is a positional argument"),
        (["--block-size"], r"--block-size expects a value"),
        (["--enable-prefix-caching=yes"], r"is a switch and takes no value"),
        (["--block-size", "sixteen"], r"--block-size takes an integer, not 'sixteen'"),
        # a flag the plan owns is named as such, whatever its value
        (["--max-num-seqs", "many"], r"sets max_num_seqs.*the feedback loop"),
        # flags that would blind the loop, kill the API server or crash long contexts
        (["--disable-log-stats"], r"sets disable_log_stats.*read the engine's metrics"),
        (["--headless"], r"sets headless.*runs no API server"),
        (
            ["--no-enable-chunked-prefill"],
            r"sets enable_chunked_prefill.*Rooftop sets from the plan.*needs chunked",
        ),
        (["--shutdown-timeout", "0"], r"sets shutdown_timeout.*in-flight requests finish"),
        # secrets belong in Secrets, not in the resource
        (["--api-key", "sk-1"], r"sets api_key, a secret.*spec\.engine\.apiKeySecretRef"),
        (["--hf_token=hf_x"], r"sets hf_token.*spec\.engine\.hfTokenSecretRef"),
    ],
)
def test_extra_args_that_fight_the_plan_or_crash_the_engine_are_refused(
    args: list[str], message: str
) -> None:
    with pytest.raises(ValidationError, match=message):
        Engine.model_validate({"extraArgs": args})


@pytest.mark.parametrize(
    "args",
    [
        ["--enable-prefix-caching", "--long-prefill-token-threshold=512"],
        ["--no-enable-prefix-caching"],
        ["--block-size", "32"],
        ["--compilation-config.mode", "3"],
        ["-cc.cudagraph_mode=FULL_DECODE_ONLY"],
        ["-O3"],
        ["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3}'],
        ["--model-loader-extra-config", "{}"],  # starts like --model, is another flag
        ["--quantization-config", "{}"],  # starts like --quantization
        ["--enable-log-requests", "--enable_prefix_caching"],
        ["--enable-prefix-cach"],  # a unique prefix of --enable-prefix-caching
        ["--max-lora-rank", "64", "--moe-backend", "Flashinfer-Cutlass"],
    ],
)
def test_other_flags_pass_through(args: list[str]) -> None:
    assert Engine.model_validate({"extraArgs": args}).extra_args == args


@pytest.mark.parametrize(
    ("name", "field"),
    [("HF_TOKEN", "hfTokenSecretRef"), ("HUGGING_FACE_HUB_TOKEN", "hfTokenSecretRef"),
     ("VLLM_API_KEY", "apiKeySecretRef")],
)  # fmt: skip
def test_secret_environment_variables_point_at_their_secret_reference(
    name: str, field: str
) -> None:
    """A token in spec.engine.env is stored in plain text in the resource; the message
    names the field that keeps it in a Secret instead."""
    with pytest.raises(ValidationError, match=rf"{name} carries a secret.*spec\.engine\.{field}"):
        Engine.model_validate({"env": [{"name": name, "value": "x"}]})
