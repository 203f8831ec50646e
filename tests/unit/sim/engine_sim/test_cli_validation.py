"""engine-sim rejects bad flags with one line naming the flag, before it binds a port."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from rooftop_sim.engine import server
from rooftop_sim.engine.server import EngineSim, config_from_args


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    server.add_arguments(parser)
    return parser.parse_args(list(argv))


@pytest.fixture
def no_serving(monkeypatch: pytest.MonkeyPatch) -> None:
    """``run`` must stop before serving; reaching ``web.run_app`` fails the test."""

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("engine-sim started serving")

    monkeypatch.setattr(server.web, "run_app", refuse)


def engine(*argv: str) -> EngineSim:
    """Build the engine (no server, no port) from flags, as ``run`` does."""
    return EngineSim(config_from_args(parse(*argv)))


@pytest.mark.parametrize("port", ["99999", "-1", "0"])
def test_port_out_of_range(port: str) -> None:
    with pytest.raises(ValueError, match=f"--port: must be an integer from 1 to 65535, got {port}"):
        config_from_args(parse("--port", port))


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--max-num-seqs", "0"), "--max-num-seqs: must be an integer >= 1, got 0"),
        (("--max-num-batched-tokens", "0"), "--max-num-batched-tokens: must be an integer >= 1"),
        (("--max-model-len", "0"), "--max-model-len: must be an integer >= 1, got 0"),
        (("--kv-capacity-tokens", "-5"), "--kv-capacity-tokens: must be an integer >= 0, got -5"),
        (("--tp", "0"), "--tp: must be an integer >= 1, got 0"),
        (("--time-scale", "nan"), "--time-scale: must be a finite number > 0, got nan"),
        (("--time-scale", "0"), "--time-scale: must be a finite number > 0, got 0.0"),
        (("--reality-factor", "inf"), "--reality-factor: must be a finite number > 0, got inf"),
        (("--noise", "nan"), "--noise: must be a finite number >= 0, got nan"),
        (("--seed", "-1"), "--seed: must be an integer >= 0, got -1"),
        (("--gpu-memory-utilization", "nan"), r"--gpu-memory-utilization: .* \(0, 1\], got nan"),
        (("--weight-dtype", "fp9"), "--weight-dtype: unknown dtype 'fp9'; use one of bf16"),
        (("--kv-dtype", "fp9"), "--kv-dtype: unknown dtype 'fp9'; use one of auto"),
        (("--acceptance-rate", "1"), r"--acceptance-rate: must be a number in \(0, 1\), got 1"),
        (("--speculative-config", "{"), "--speculative-config: not JSON"),
        (
            ("--speculative-config", '{"method": "medusa", "num_speculative_tokens": 2}'),
            "--speculative-config: method must be one of ngram, suffix, mtp, eagle3, draft_model",
        ),
        (
            ("--speculative-config", '{"method": "ngram", "num_speculative_tokens": 0}'),
            "num_speculative_tokens must be an integer >= 1, got 0",
        ),
        (
            (
                "--speculative-config",
                '{"method": "eagle3", "model": "x/y", "num_speculative_tokens": 2}',
            ),
            r"times the drafters the catalog lists for llama-3.1-8b \(eagle3: yuhuili/",
        ),
        (
            (
                "--speculative-config",
                '{"method": "ngram", "num_speculative_tokens": 2, '
                '"num_speculative_tokens_per_batch_size": [[1, 8]]}',
            ),
            "must be \\[first, last, K\\] ranges",
        ),
    ],
)
def test_bad_settings_name_the_flag(argv: tuple[str, ...], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        engine(*argv)


def test_tp_uses_the_planners_rule() -> None:
    with pytest.raises(ValueError, match=r"--tp: TP 3 does not divide 32 .*use one of 1, 2, 4, 8"):
        engine("--model", "llama-3.1-8b", "--tp", "3")
    assert engine("--model", "llama-3.1-8b", "--tp", "2").cfg.tp == 2


def test_dtypes_reach_the_timing_model_normalized() -> None:
    sim = engine("--weight-dtype", "FP8", "--kv-dtype", "fp8_e4m3")
    assert (sim.truth.dep.weight_dtype, sim.truth.dep.kv_dtype) == ("fp8", "fp8")


def test_small_kv_override_names_its_own_flag() -> None:
    with pytest.raises(ValueError, match="raise --kv-capacity-tokens or lower --max-model-len"):
        engine("--kv-capacity-tokens", "100")


@pytest.mark.parametrize(
    ("argv", "start"),
    [
        (("--model", "foo"), "engine-sim: unknown model 'foo'; known: "),
        (("--gpu", "foo"), "engine-sim: unknown GPU 'foo'; known GPU ids: "),
        (("--port", "99999"), "engine-sim: --port: must be an integer from 1 to 65535"),
        (("--tp", "3"), "engine-sim: --tp: TP 3 does not divide"),
    ],
)
@pytest.mark.usefixtures("no_serving")
def test_run_prints_one_plain_line_and_exits_2(
    argv: tuple[str, ...], start: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert server.run(parse(*argv)) == 2
    err = capsys.readouterr().err
    assert err.startswith(start) and '"' not in err and err.count("\n") == 1


def test_port_in_use_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def busy(*args: Any, **kwargs: Any) -> None:
        raise OSError(98, "error while attempting to bind: address already in use")

    monkeypatch.setattr(server.web, "run_app", busy)
    assert server.run(parse("--port", "8123")) == 1
    lines = capsys.readouterr().err.splitlines()
    # the only line: the "serving on" banner waits for the bind that failed
    assert len(lines) == 1
    assert lines[0].startswith("engine-sim: cannot listen on 127.0.0.1:8123: [Errno 98] ")


def test_the_banner_comes_once_the_socket_is_bound(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def bound(*args: Any, **kwargs: Any) -> None:
        kwargs["print"]("======== Running on http://127.0.0.1:8123 ========")  # as aiohttp does

    monkeypatch.setattr(server.web, "run_app", bound)
    assert server.run(parse("--port", "8123")) == 0
    assert capsys.readouterr().err.startswith("engine-sim: serving ")


def test_a_catalog_drafter_drafts_and_takes_kv_room() -> None:
    flags = ("--model", "llama-3.1-8b", "--gpu", "h100-sxm")
    head = '{"method": "eagle3", "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", '
    speculating = engine(*flags, "--speculative-config", head + '"num_speculative_tokens": 3}')
    plain = engine(*flags)
    spec = speculating.engine.config.speculation
    assert spec is not None and spec.draft_length(1) == 3 and spec.positions == 3
    assert speculating.engine.config.kv_capacity_tokens < plain.engine.config.kv_capacity_tokens
