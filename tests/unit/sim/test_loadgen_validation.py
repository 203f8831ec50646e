"""rooftop load rejects unusable numbers up front, naming the flag (nothing is sent)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from rooftop_sim import loadgen
from rooftop_sim.loadgen import LoadSpec, schedule
from rooftop_sim.traces import Trace


def spec(**kw: Any) -> LoadSpec:
    return LoadSpec("http://127.0.0.1:9", "m", **{"rate": 10.0, "duration_s": 1.0, **kw})


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"rate": float("nan")}, "--rate: must be a finite number > 0, got nan"),
        ({"rate": float("inf")}, "--rate: must be a finite number > 0, got inf"),
        ({"rate": -1.0}, "--rate: must be a finite number > 0, got -1.0"),
        ({"rate": 1e9, "duration_s": 60.0}, "plans over 10,000,000 requests: .*--max-requests"),
        ({"burstiness": float("inf")}, "--burstiness: must be a number from 0.001 to 100"),
        ({"burstiness": float("nan")}, "--burstiness: must be a number from 0.001 to 100"),
        ({"burstiness": 1e-200}, "--burstiness: must be a number from 0.001 to 100"),
        ({"duration_s": -1.0}, "--duration: must be a finite number > 0, got -1.0"),
        ({"duration_s": float("nan")}, "--duration: must be a finite number > 0, got nan"),
        ({"max_requests": 0}, "--max-requests: must be an integer >= 1, got 0"),
        ({"prompt_tokens": 0}, "--prompt-tokens: must be an integer >= 1, got 0"),
        ({"output_tokens": 0}, "--output-tokens: must be an integer >= 1, got 0"),
        ({"drain_timeout_s": float("inf")}, "--drain-timeout: must be a finite number >= 0"),
        ({"seed": -1}, "--seed: must be an integer >= 0, got -1"),
        ({"rate": None}, "give a positive --rate or a --trace"),
    ],
)
def test_schedule_rejects_bad_numbers(kw: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        schedule(spec(**kw))


def test_bounds_still_allow_bursty_and_capped_runs() -> None:
    assert len(schedule(spec(rate=1e9, duration_s=60.0, max_requests=5))) == 5
    assert schedule(spec(burstiness=100.0, max_requests=50))


def test_trace_speedup_must_be_finite() -> None:
    trace = Trace("t", np.array([0.0, 1.0]), np.array([10, 20]), np.array([1, 2]))
    with pytest.raises(ValueError, match="--trace-speedup: must be a finite number > 0, got inf"):
        schedule(spec(rate=None, trace=trace, trace_speedup=float("inf")))


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--rate", "nan"], "--rate: must be a finite number > 0, got nan"),
        (["--rate", "1", "--burstiness", "inf"], "--burstiness: must be a number"),
        (["--rate", "1", "--duration", "-1"], "--duration: must be a finite number > 0"),
        (["--rate", "1", "--max-requests", "0"], "--max-requests: must be an integer >= 1"),
        (["--rate", "1", "--prompt-tokens", "0"], "--prompt-tokens: must be an integer >= 1"),
    ],
)
def test_cli_exits_2_with_the_reason(
    argv: list[str],
    message: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from rooftop_cli.main import main

    async def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("bad flags must stop rooftop load before it sends anything")

    monkeypatch.setattr(loadgen, "run_load", refuse)
    assert main(["load", "--model", "m", "--url", "http://127.0.0.1:9", "--quiet", *argv]) == 2
    assert capsys.readouterr().err.startswith(f"rooftop load: {message}")
