"""Fixtures for the operator's unit tests, built from ``operator_fakes``.

Test modules import the fakes from ``operator_fakes`` (a unique module name), never from
``conftest``: several test folders have a conftest.py, and which one ``import conftest``
finds depends on collection order.
"""

from __future__ import annotations

import pytest
from operator_fakes import NS, Events, FakeKube, FakePlanner
from prometheus_client import CollectorRegistry

from rooftop_operator.metrics import OperatorMetrics
from rooftop_operator.runtime import Runtime
from rooftop_operator.settings import OperatorConfig
from rooftop_planner.catalog import Catalog, load_catalog


@pytest.fixture(scope="session")
def catalog() -> Catalog:
    return load_catalog()


@pytest.fixture
def kube() -> FakeKube:
    return FakeKube()


@pytest.fixture
def events() -> Events:
    return Events()


@pytest.fixture
def planner() -> FakePlanner:
    return FakePlanner()


@pytest.fixture
def rt(kube: FakeKube, catalog: Catalog, planner: FakePlanner, events: Events) -> Runtime:
    return Runtime(
        kube=kube,
        catalog=catalog,
        plan=planner,
        config=OperatorConfig(namespaces=(NS,)),
        emit=events,
        metrics=OperatorMetrics(CollectorRegistry()),
        now=lambda: "2026-01-01T00:00:00Z",
    )
