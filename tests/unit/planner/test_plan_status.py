"""``status.plan`` keeps every field of a plan but the ones ``NOT_IN_STATUS`` names: a plan
field added without its status field fails here instead of resetting on the operator's
next read (as ``gpu_memory_utilization`` did, which then rendered vLLM's default)."""

from __future__ import annotations

import dataclasses
import json

from rooftop_api.spec import MeasuredLengths, MeasuredWorkload
from rooftop_planner.plan import (
    ENGINE_FIELDS_TRANSLATED,
    INPUT_FIELDS,
    NOT_IN_STATUS,
    OUTCOME_FIELDS,
    SCALE_FIELDS,
    SHAPE_FIELDS,
    VLLM_FLAGS,
    Plan,
)

PLAN = Plan(
    gpu="h100-sxm",
    tp=2,
    replicas=3,
    max_num_seqs=48,
    weight_dtype="fp8",
    kv_dtype="fp8",
    max_model_len=16384,
    gpu_memory_utilization=0.85,
    tpot_ms=41.25,
    ttft_ms=812.5,
    output_tok_s=2950.5,
    usd_per_hour=31.875,
    capacity_rps=4.2,
    summary="h100-sxm x2 ...",
    checkpoint="neuralmagic/Meta-Llama-3.1-70B-Instruct-FP8",
    weights_note="an FP8 checkpoint",
    context_note="capped by the KV cache",
    session_affinity="ClientIP",
    prefix_hit_ratio=0.125,
    max_num_batched_tokens=2048,
    speculative_config='{"method":"eagle3","model":"head","num_speculative_tokens":3}',
    speculative_note="speculative decoding with eagle3 ...",
    measured_acceptance=0.62,
    measured_workload=MeasuredWorkload(
        prompt_tokens=MeasuredLengths(mean=1147, p10=120, p50=700, p90=2800, p99=9000),
        output_tokens=MeasuredLengths(mean=260, p10=12, p50=150, p90=640, p99=1500),
    ),
)
# A mixed fleet: the plan above sizes it, beside a pool of another GPU type. Its pools
# keep what the plan keeps (the declared losses left at their defaults here), but the
# measured lengths, which the whole fleet was planned with and its plan keeps.
_KEPT = dataclasses.replace(
    PLAN,
    capacity_rps=0.0,
    weights_note="",
    context_note="",
    speculative_note="",
    measured_workload=None,
)
POOL = dataclasses.replace(_KEPT, gpu="l40s", replicas=2, usd_per_hour=3.9)
PLAN = dataclasses.replace(PLAN, pools=(dataclasses.replace(_KEPT, replicas=1), POOL))


def test_the_plan_here_sets_every_field_away_from_its_default() -> None:
    """Otherwise a new field that the status drops would read back as the default it was
    given here, and the round trip below could not see the loss."""
    at_default = {
        f.name
        for f in dataclasses.fields(Plan)
        if f.default is not dataclasses.MISSING and getattr(PLAN, f.name) == f.default
    }
    assert at_default == set()


def _through_status(plan: Plan) -> Plan:
    """As the operator stores it (camelCase JSON) and reads it back."""
    stored = json.loads(plan.to_status().model_dump_json(by_alias=True, exclude_none=True))
    return Plan.from_status(stored)


def test_every_plan_field_survives_the_status_but_the_declared_ones() -> None:
    back = _through_status(PLAN)
    lost = {
        f.name for f in dataclasses.fields(Plan) if getattr(back, f.name) != getattr(PLAN, f.name)
    }
    assert lost == set(NOT_IN_STATUS)


def test_an_older_status_without_the_memory_share_reads_as_vllms_default() -> None:
    stored = json.loads(PLAN.to_status().model_dump_json(by_alias=True, exclude_none=True))
    del stored["gpuMemoryUtilization"]
    assert Plan.from_status(stored).gpu_memory_utilization == 0.9


def test_every_plan_field_is_shape_scale_input_or_outcome_once() -> None:
    """A field added to the plan must say whether it changes the engine (``shape``: a
    rollout, a PlanChanged event, the loop's memory starting over), is what the loop
    scales, what the plan was made from, or follows from those; forgetting it fails
    here instead of a rollout the loop's memory and events do not notice."""
    declared = [*SHAPE_FIELDS, *SCALE_FIELDS, *INPUT_FIELDS, *OUTCOME_FIELDS]
    assert sorted(declared) == sorted(f.name for f in dataclasses.fields(Plan))


def test_a_new_checkpoint_is_a_new_shape_and_a_rescale_is_not() -> None:
    assert PLAN.rescaled(5, 64).shape == PLAN.shape
    other = dataclasses.replace(PLAN, checkpoint="meta-llama/Llama-3.1-70B-Instruct")
    assert other.shape != PLAN.shape and other.scale == PLAN.scale


def test_every_engine_field_reaches_vllm_as_a_flag_or_by_translation() -> None:
    """A shape or scale field that is neither a ``vllm serve`` flag nor translated where
    the engine is built would be planned for and never deployed."""
    engine = {*SHAPE_FIELDS, *SCALE_FIELDS}
    assert set(VLLM_FLAGS) | set(ENGINE_FIELDS_TRANSLATED) == engine
    assert not set(VLLM_FLAGS) & set(ENGINE_FIELDS_TRANSLATED)
