"""Suffix decoding (vLLM's ``suffix``) as a planned speculative method: no drafter model,
its host time (the steps' walks and each prompt's tree) from its own measured table,
one draft length at every batch, its acceptance stated per decode step."""

from __future__ import annotations

import csv
import json
import statistics
from importlib import resources

import numpy as np
import pytest
from tests.unit.planner.test_speculative import target

from rooftop_planner import drafters, host_time, perf, speculative
from rooftop_planner.catalog import load_catalog
from rooftop_planner.efficiency import load_efficiency
from rooftop_planner.perf import EngineShape
from rooftop_planner.search import plan_target

CATALOG = load_catalog()


def engine(acceptance: float = 0.6, k: int = 3) -> tuple[EngineShape, speculative.Speculation]:
    """Llama-3-70B fp8 on 4 H100s, drafting ``k`` tokens by suffix decoding."""
    model, gpu = CATALOG.model("llama-3-70b"), CATALOG.gpus["h100-sxm"]
    eff = load_efficiency().lookup(gpu, "vllm")
    dep = EngineShape(model, gpu, 4, weight_dtype="fp8", kv_dtype="fp8", efficiency=eff)
    found, problems = speculative.options(model, ["suffix"], acceptance, CATALOG)
    assert not problems
    return dep, next(s for s in found if s.max_draft_tokens == k)


def table_rows() -> list[dict[str, str]]:
    text = resources.files("rooftop_planner").joinpath("catalog", "suffix_lookup.csv").read_text()
    return list(csv.DictReader(line for line in text.splitlines() if not line.startswith("#")))


def test_the_fit_follows_the_measured_steps_and_tree_building() -> None:
    """The step walks within 20 % of the median row; a prompt's tree costs what the
    table's first calls add per prompt token, within 25 % of the median row."""
    cost = host_time.lookup_cost("suffix")
    rows = table_rows()
    batch = np.array([float(r["batch"]) for r in rows])
    tokens = batch * np.array([float(r["tokens_per_request"]) for r in rows])
    measured = np.array([float(r["seconds"]) for r in rows])
    ratio = cost.seconds(batch, tokens) / measured
    assert statistics.median(abs(r - 1.0) for r in ratio) < 0.2
    starts = np.array([float(r["start_seconds"]) for r in rows])
    large = tokens >= host_time.MIN_START_TOKENS
    built = cost.per_prompt_token_s * tokens[large] / starts[large]
    assert statistics.median(abs(r - 1.0) for r in built) < 0.25
    assert "SuffixDecodingProposer" in cost.measured_on and "Arctic Inference" in cost.measured_on


def test_prompt_lookup_pays_no_tree_building() -> None:
    assert host_time.lookup_cost("ngram").per_prompt_token_s == 0.0
    assert host_time.lookup_cost("suffix").per_prompt_token_s > 0.0


def test_without_an_acceptance_suffix_is_not_an_option_and_the_fix_is_named() -> None:
    model = CATALOG.model("llama-3-70b")
    found, problems = speculative.options(model, ["suffix"], None, CATALOG)
    assert not found
    assert problems[0].startswith("suffix: how often suffix decoding drafts right")
    assert "set spec.workload.acceptanceRate" in problems[0]
    assert drafters.planned_acceptance(target(), "suffix") is None
    result = plan_target(target(constraints={"speculative": ["suffix"]}))
    assert any("constraints.speculative: suffix" in r for r in result.reasons)


def test_each_draft_length_is_an_option_of_its_own() -> None:
    """vLLM's suffix proposer takes one K at every batch, so the search weighs each."""
    model = CATALOG.model("llama-3-70b")
    found, _ = speculative.options(model, ["suffix"], 0.7, CATALOG)
    assert [s.max_draft_tokens for s in found] == list(range(1, speculative.MAX_DRAFT_TOKENS + 1))
    assert all(s.fixed and s.draft is None and s.method == "suffix" for s in found)


@pytest.mark.parametrize("k", [1, 3, 5])
def test_the_draft_length_is_the_same_at_every_batch(k: int) -> None:
    """Even where verifying K drafts costs more than it saves (a large batch at a low
    acceptance), the step verifies K: vLLM cannot turn suffix drafts off by batch."""
    dep, spec = engine(acceptance=0.2, k=k)
    seqs = np.array([1.0, 16.0, 256.0])
    context = seqs * 1500.0
    zero = np.zeros_like(seqs)
    steps = speculative.steps(dep, spec, seqs, context, zero, zero)
    assert steps.draft_tokens.tolist() == [float(k)] * 3
    assert speculative.schedule(dep, spec, 512, 1500.0) == [(1, 512, k)]


def test_a_step_carrying_a_prompt_chunk_pays_its_tree() -> None:
    """What a 4,096-token chunk adds to a drafting step, beyond the same step without
    suffix drafts, includes building those tokens' trees."""
    dep, spec = engine()
    seqs, context = np.array([8.0]), np.array([8.0 * 1500.0])
    chunk, attended = np.array([4096.0]), np.array([4096.0 * 2048.0])
    with_chunk, _ = speculative._every_length(
        dep, None, "suffix", 1, seqs, context, chunk, attended
    )
    no_chunk, _ = speculative._every_length(
        dep, None, "suffix", 1, seqs, context, np.zeros(1), np.zeros(1)
    )
    plain, _ = speculative._every_length(dep, None, "ngram", 1, seqs, context, chunk, attended)
    cost = host_time.lookup_cost("suffix")
    tree = cost.per_prompt_token_s * 4096.0
    walks = (
        cost.seconds(seqs, context)[0] - host_time.lookup_cost("ngram").seconds(seqs, context)[0]
    )
    assert with_chunk[1, 0] - plain[1, 0] == pytest.approx(tree + walks, rel=1e-9)
    assert with_chunk[1, 0] - no_chunk[1, 0] > tree
    assert with_chunk[0, 0] == plain[0, 0]  # no drafts, no host lookup


def test_vllm_is_given_one_draft_length_and_no_model() -> None:
    dep, spec = engine(k=4)
    planned = speculative.planned(dep, spec, 1500.0, 4.0)
    assert planned is not None
    config = json.loads(planned.config)
    assert config == {"method": "suffix", "num_speculative_tokens": 4}
    assert "vLLM's suffix decoding" in planned.note
    assert "draft tokens 4 at every batch (one length, as vLLM drafts suffix)" in planned.note
    assert speculative.drafter_bytes_per_gpu(dep, spec) == 0.0
    assert speculative.kv_capacity_tokens(dep, spec, 8192) == perf.kv_capacity_tokens(
        dep, max_num_batched_tokens=8192
    )


def test_a_fast_70b_target_is_planned_cheaper_with_suffix_decoding() -> None:
    """At 70 output tokens/s per user, suffix drafts accepted 0.7 per decode step
    (agents' repeated calls, code edits) make a cheaper plan with one draft length;
    at 0.1 they never pay and the plan does not speculate."""
    without = plan_target(target()).plan
    suffix = plan_target(
        target(constraints={"speculative": ["suffix"]}, workload={"acceptanceRate": 0.7})
    ).plan
    assert without is not None and suffix is not None
    config = json.loads(suffix.speculative_config)
    assert config["method"] == "suffix" and "num_speculative_tokens_per_batch_size" not in config
    assert suffix.usd_per_hour < 0.75 * without.usd_per_hour
    seldom = plan_target(
        target(constraints={"speculative": ["suffix"]}, workload={"acceptanceRate": 0.1})
    ).plan
    assert seldom is not None and not seldom.speculative_config


def test_suffix_names_no_drafter() -> None:
    drafter = {"method": "suffix", "model": "x"}
    with pytest.raises(ValueError, match="suffix looks tokens up on the host"):
        target(
            workload={"acceptanceRate": 0.7},
            constraints={"speculative": ["suffix"]},
            engine={"drafter": drafter},
        )


def test_vllm_refuses_async_scheduling_beside_suffix_decoding() -> None:
    both = {"speculative": ["ngram", "suffix"]}
    with pytest.raises(ValueError, match="refuses beside ngram and suffix drafts"):
        target(
            workload={"acceptanceRate": 0.7},
            constraints=both,
            engine={"extraArgs": ["--async-scheduling"]},
        )
    target(
        workload={"acceptanceRate": 0.7},
        constraints={"speculative": ["suffix"]},
        engine={"extraArgs": ["--no-async-scheduling"]},
    )
