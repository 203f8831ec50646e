"""rooftop_api.vllm_args: extra `vllm serve` arguments read the way vLLM reads them
(the refusals themselves are in test_spec_engine.py; the same rules against the real
parser are in tests/engine/test_vllm_parser.py)."""

from __future__ import annotations

import pytest

from rooftop_api.vllm_args import (
    PLANNED,
    REMOVED,
    RESERVED,
    ExtraArgError,
    ParsedArg,
    load_table,
    resolve,
)


def test_every_dest_rooftop_owns_is_a_dest_of_this_vllm() -> None:
    """A dest renamed in a new vLLM would silently stop being guarded."""
    dests = {flag.dest for flag in load_table().by_option.values()}
    owned = {*PLANNED, *RESERVED} - {"model_tag"}  # the positional: no option sets it
    assert owned <= dests, owned - dests


@pytest.mark.parametrize("flag", sorted(REMOVED))
def test_removed_flags_are_gone_from_this_vllm(flag: str) -> None:
    """Else the hint would be wrong (and a prefix of a real flag would be accepted)."""
    with pytest.raises(ExtraArgError, match="has no flag"):
        resolve([flag, "1"])


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--block_size=32"], [("--block-size", "block_size", ("32",))]),
        (["-O", "3"], [("--optimization-level", "optimization_level", ("3",))]),
        (["-O=2"], [("--optimization-level", "optimization_level", ("2",))]),
        # nargs "+" takes every value up to the next option
        (
            ["--api-key", "a", "b", "--enforce-eager"],
            [("--api-key", "api_key", ("a", "b")), ("--enforce-eager", "enforce_eager", ())],
        ),
        # a negative number is a value, not an option (argparse)
        (["--seed", "-1"], [("--seed", "seed", ("-1",))]),
        # dotted JSON arguments become their base flag, after the others (vLLM moves them)
        (
            ["-cc.mode", "3", "--enforce-eager"],
            [("--enforce-eager", "enforce_eager", ()), ("-cc", "compilation_config", ("{}",))],
        ),
        (["--hf-token"], [("--hf-token", "hf_token", ())]),  # nargs "?": value optional
        (["--max-num-batched-tokens=25.6k"], [("--max-num-batched-tokens",
                                              "max_num_batched_tokens", ("25.6k",))]),
        (["--cpu-offload-gb", "1.5"], [("--cpu-offload-gb", "cpu_offload_gb", ("1.5",))]),
        # vLLM's optional_type reads "None" as None, which is one of the choices here
        (["--dcp-comm-backend", "None"], [("--dcp-comm-backend", "dcp_comm_backend",
                                           ("None",))]),
        (["--no-enable-prefix-caching"], [("--no-enable-prefix-caching",
                                           "enable_prefix_caching", ())]),
    ],
)  # fmt: skip
def test_what_each_argument_sets(
    args: list[str], expected: list[tuple[str, str, tuple[str, ...]]]
) -> None:
    assert [(s.option, s.dest, s.values) for s in resolve(args)] == expected
    assert all(isinstance(s, ParsedArg) for s in resolve(args))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--block-size", "--enforce-eager"], "--block-size expects a value"),
        (["-cc.mode"], "needs a value"),  # vLLM would index past the end
        (["--", "x"], "positional"),
        (["-d", "2"], "ambiguous"),
        (["--max-lora-rank", "eight"], "--max-lora-rank takes an integer, not 'eight'"),
        (["--max-lora-rank", "7"], "not a choice"),
        (["--block-size", "abc"], "takes an integer"),
        (["--seed", "1.5"], "takes an integer"),
        (["--cpu-offload-gb", "x"], "takes a number"),
        (["--max-num-batched-tokens", "8kb"], "suffixes k, M, G"),
        (["--max-num-batched-tokens", "2.5M"], "suffixes"),  # binary suffix: whole numbers
    ],
)
def test_what_vllm_refuses(args: list[str], message: str) -> None:
    with pytest.raises(ExtraArgError, match=message):
        resolve(args)


def test_the_flag_table_is_of_the_vllm_rooftop_deploys() -> None:
    """extraArgs are checked against the flags of the vLLM the pods run (the chart's
    image, the operator's default and install-vllm.sh agree: test_operator_chart.py);
    after a bump, `make vllm-flags` regenerates the table."""
    from rooftop_operator.settings import VLLM_VERSION

    assert load_table().vllm_version == VLLM_VERSION, "run `make vllm-flags`"
