"""Parsing a ServingTarget body into typed values."""

from __future__ import annotations

import pytest
from operator_fakes import SPEC, UID, target_body

from rooftop_operator.specs import SpecError, TargetRef, parse_spec, slo_text


def test_target_ref_from_body() -> None:
    ref = TargetRef.from_body(target_body())
    assert (ref.name, ref.namespace, ref.uid, ref.generation) == ("chat", "team-a", UID, 1)
    assert ref.owner_reference()["controller"] is True


def test_parse_spec_applies_model_defaults() -> None:
    spec = parse_spec(SPEC)
    assert spec.constraints.min_replicas == 1
    assert spec.mode.value == "vllm"


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ({"slo": {"tpotMs": 0}}, "spec.slo.tpotMs"),
        ({"budget": {}}, "spec.budget.usdPerHour"),
        ({"constraints": {"weightDtypes": ["bf16", "fp7"]}}, "spec.constraints.weightDtypes[1]"),
        ({"bogus": 1}, "spec.bogus"),
    ],
)
def test_errors_name_the_field(patch: dict[str, object], field: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_spec({**SPEC, **patch})
    assert field in str(err.value)


def test_slo_text() -> None:
    assert slo_text(parse_spec(SPEC)) == "p90 TPOT<=50ms, p90 TTFT<=1000ms"
    only_tpot = {**SPEC, "slo": {"tpotMs": 25.5, "tpotPercentile": "p99"}}
    assert slo_text(parse_spec(only_tpot)) == "p99 TPOT<=25.5ms"
