"""One exception base per package: ``ApiError`` for the API, ``PlannerError`` for the
planner, ``OperatorError`` for the operator (transient or permanent), ``SimError`` for the
simulator.

A caller that reports a user's input errors (the CLI's exit code 2, the operator's
``Planned=False``) catches the package's base, so every exception class a package defines
must subclass it: a new one that does not would surface as a traceback, and a catch of
``ValueError``/``KeyError`` wholesale would turn a bug into the user's fault.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from types import ModuleType

import pytest

import rooftop_api
import rooftop_operator
import rooftop_planner
import rooftop_sim
from rooftop_api.errors import ApiError
from rooftop_api.spec import ServingTargetSpec
from rooftop_operator.errors import OperatorError
from rooftop_planner.errors import PlannerError
from rooftop_planner.search import plan_target
from rooftop_sim.errors import SimError


def exception_classes(package: ModuleType) -> dict[str, type[BaseException]]:
    """Every exception class a module of ``package`` defines, by ``module.Class``
    (warnings aside: they are shown, not raised)."""
    found: dict[str, type[BaseException]] = {}
    for info in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
        module = importlib.import_module(info.name)
        for name, cls in inspect.getmembers(module, inspect.isclass):
            error = issubclass(cls, BaseException) and not issubclass(cls, Warning)
            if error and cls.__module__ == module.__name__:
                found[f"{module.__name__}.{name}"] = cls
    return found


@pytest.mark.parametrize(
    ("package", "base"),
    [
        (rooftop_planner, PlannerError),
        (rooftop_api, ApiError),
        (rooftop_operator, OperatorError),
        (rooftop_sim, SimError),
    ],
)
def test_every_exception_class_subclasses_its_package_base(
    package: ModuleType, base: type[Exception]
) -> None:
    classes = exception_classes(package)
    assert base in classes.values()  # the walk reached the base's own module
    assert len(classes) > 1  # and the modules that define the rest
    assert [name for name, cls in classes.items() if not issubclass(cls, base)] == []


def spec(**changes: object) -> ServingTargetSpec:
    fields: dict[str, object] = {
        "model": "llama-3.1-8b",
        "slo": {"tpotMs": 50},
        "workload": {
            "requestsPerSecond": 1,
            "promptTokens": {"mean": 512},
            "outputTokens": {"mean": 128},
        },
        "budget": {"usdPerHour": 100},
    }
    return ServingTargetSpec.model_validate({**fields, **changes})


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"model": "no-such-model"}, "unknown model 'no-such-model'"),
        ({"constraints": {"gpuTypes": ["no-such-gpu"]}}, "unknown GPU 'no-such-gpu'"),
    ],
)
def test_planning_an_unknown_model_or_gpu_is_a_planner_error(
    changes: dict[str, object], named: str
) -> None:
    with pytest.raises(PlannerError, match=named):
        plan_target(spec(**changes))
