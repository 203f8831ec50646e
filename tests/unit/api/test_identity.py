"""The resource's identity (group, version, kind, plural) has one home, rooftop_api.spec."""

from __future__ import annotations

from typing import get_args

import yaml

from rooftop_api import crd, spec
from rooftop_operator import kube, settings


def test_the_manifest_model_accepts_exactly_the_declared_identity() -> None:
    fields = spec.ServingTarget.model_fields
    assert get_args(fields["api_version"].annotation) == (spec.API_VERSION,)
    assert get_args(fields["kind"].annotation) == (spec.KIND,)


def test_the_crd_the_operator_and_its_annotations_use_it() -> None:
    names = yaml.safe_load(crd.DEFAULT_OUTPUT.read_text())["spec"]["names"]
    declared = (spec.KIND, spec.PLURAL, spec.SINGULAR)
    assert (names["kind"], names["plural"], names["singular"]) == declared
    assert kube.TARGET_GVP == (spec.GROUP, spec.VERSION, spec.PLURAL)
    assert settings.ANNOTATION_PREFIX == spec.GROUP
