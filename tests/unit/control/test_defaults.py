"""The operator, the simulator and the chart start from the same loop figures
(rooftop_control.defaults): a simulated run is evidence for the deployed loop only then."""

from __future__ import annotations

import argparse
import dataclasses
import inspect
from pathlib import Path

import yaml

from rooftop_control import defaults
from rooftop_control.control import ControllerConfig
from rooftop_operator import builders
from rooftop_operator.metrics_client import MetricsClient
from rooftop_operator.settings import LoopSettings
from rooftop_sim.cluster import ClusterConfig
from rooftop_sim.simulate import register

VALUES = Path(__file__).resolve().parents[3] / "charts" / "rooftop" / "values.yaml"


def _default(cls: type, name: str) -> object:
    return next(f.default for f in dataclasses.fields(cls) if f.name == name)


def _sim_default(name: str) -> object:
    return _default(ClusterConfig, name)


def test_the_operator_and_the_simulator_tick_wait_and_roll_out_alike() -> None:
    loop = LoopSettings()
    assert loop.interval_s == _sim_default("scrape_s") == defaults.TICK_S
    window_s = _default(ControllerConfig, "metrics_window_s")
    assert loop.window_s == window_s == _sim_default("window_s") == defaults.METRICS_WINDOW_S
    startup_s = _default(ControllerConfig, "startup_s")
    assert startup_s == _sim_default("startup_s") == defaults.STARTUP_S
    assert builders.ROLLOUT_SURGE == _sim_default("surge") == defaults.ROLLOUT_SURGE


def test_the_simulate_command_starts_from_the_same_figures() -> None:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(["simulate", "target.yaml", "--trace", "t.csv"])
    expected = (defaults.STARTUP_S, defaults.TICK_S, defaults.METRICS_WINDOW_S)
    assert (args.startup_s, args.scrape_s, args.window_s) == expected


def test_stale_readings_mean_the_same_age_everywhere() -> None:
    client_default = inspect.signature(MetricsClient).parameters["stale_after_s"].default
    assert LoopSettings().stale_after_s == client_default == defaults.STALE_AFTER_S


def test_the_charts_values_are_the_shared_figures() -> None:
    loop = yaml.safe_load(VALUES.read_text())["loop"]
    assert loop["intervalSeconds"] == defaults.TICK_S
    assert loop["window"] == defaults.METRICS_WINDOW
    assert loop["staleAfterSeconds"] == defaults.STALE_AFTER_S
