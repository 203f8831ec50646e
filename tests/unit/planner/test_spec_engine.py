"""spec.engine.extraArgs: free vLLM flags, except those the plan sets and those vLLM
0.33 removed (the CRD repeats the rule in CEL: tests/e2e/manifests/invalid/25-*, 26-*)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from rooftop_planner.spec import Engine


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--max-num-seqs", "512"], r"'--max-num-seqs' sets --max-num-seqs.*the feedback loop"),
        (["--tensor-parallel-size=4"], r"remove it \(bound it with spec\.constraints\.maxT"),
        (["-tp", "2"], r"'-tp' sets -tp"),
        (["--kv-cache-dtype=fp8"], r"spec\.constraints\.kvDtypes"),
        (["--port", "9000"], r"the Service and the probes depend on it"),
        (["--speculative-model", "x"], r"does not exist in vLLM 0\.33.*--speculative-config"),
        (["--swap-space=4"], r"--swap-space does not exist in vLLM 0\.33"),
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
        ["--enable-prefix-caching", "--max-num-batched-tokens=8192"],
        ["--speculative-config", '{"method": "eagle3", "num_speculative_tokens": 3}'],
        ["--model-loader-extra-config", "{}"],  # starts like --model, is another flag
        ["--quantization-config", "{}"],  # starts like --quantization
    ],
)
def test_other_flags_pass_through(args: list[str]) -> None:
    assert Engine.model_validate({"extraArgs": args}).extra_args == args
