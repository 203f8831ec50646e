"""rooftop load: arrival schedules, client-side timings against engine-sim, bounds."""

from __future__ import annotations

import io
import time
from collections.abc import AsyncIterator

import numpy as np
import pytest
from aiohttp.test_utils import TestServer

from rooftop_sim import loadgen
from rooftop_sim.engine.prefix_cache import chain_hashes
from rooftop_sim.engine.server import EngineSimConfig, build_app
from rooftop_sim.loadgen import LoadSpec, run_load, schedule
from rooftop_sim.traces import Trace

NAME = "sim"


@pytest.fixture
async def server() -> AsyncIterator[TestServer]:
    srv = TestServer(build_app(EngineSimConfig(model_name=NAME, time_scale=20.0, max_num_seqs=64)))
    await srv.start_server()
    yield srv
    await srv.close()


def url(srv: TestServer) -> str:
    return str(srv.make_url("")).rstrip("/")


def test_schedule_gamma_burstiness_and_bounds() -> None:
    for cv in (1.0, 3.0):
        plan = schedule(LoadSpec("u", "m", rate=100.0, burstiness=cv, duration_s=300.0))
        gaps = np.diff([p[0] for p in plan])
        assert len(plan) == pytest.approx(30_000, rel=0.1)
        assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.1)
    capped = schedule(LoadSpec("u", "m", rate=1000.0, duration_s=60.0, max_requests=7))
    assert len(capped) == 7
    short = schedule(LoadSpec("u", "m", rate=10.0, duration_s=1.0))
    assert all(t < 1.0 for t, _, _ in short)
    with pytest.raises(ValueError):
        schedule(LoadSpec("u", "m"))


def test_schedule_from_trace() -> None:
    trace = Trace("t", np.array([0.0, 2.0, 4.0, 6.0]), np.array([10, 20, 30, 40]),
                  np.array([1, 0, 3, 4]))  # fmt: skip
    plan = schedule(LoadSpec("u", "m", trace=trace, trace_speedup=2.0, duration_s=2.5))
    assert plan == [(0.0, 10, 1), (1.0, 20, 1), (2.0, 30, 3)]  # 0 output clamped to 1


async def test_run_load_against_engine_sim(server: TestServer) -> None:
    spec = LoadSpec(url(server), NAME, rate=100.0, prompt_tokens=64, output_tokens=8,
                    duration_s=5.0, max_requests=20)  # fmt: skip
    seen: list[int] = []
    report = await run_load(spec, progress=lambda s, p, f, e, t: seen.append(f))
    assert report.sent == 20 and report.completed == 20 and report.errors == 0
    assert report.output_tok_s > 0 and seen[-1] == 20
    assert set(report.ttft_s) == {"p50", "p90", "p99", "mean"}
    # engine-sim at time scale 20: an 8B decode step (~6.5 ms on an H100) takes ~0.3 ms of
    # wall time; client-side timing jitters, so the bounds only rule out no wait at all
    # and a stall
    assert 0.0001 < report.tpot_s["p50"] < 0.01
    assert report.ttft_s["p50"] <= report.ttft_s["p99"]


async def test_errors_are_reported_not_raised(server: TestServer) -> None:
    bad_model = LoadSpec(url(server), "nope", rate=50.0, duration_s=1.0, max_requests=3)
    report = await run_load(bad_model)
    assert report.completed == 0 and report.errors == 3
    assert "HTTP 404" in report.error_samples[0]
    closed = LoadSpec("http://127.0.0.1:9", NAME, rate=50.0, duration_s=1.0, max_requests=2)
    report = await run_load(closed)
    assert report.errors == 2 and "Error" in report.error_samples[0]


async def test_strictly_bounded_in_time(server: TestServer) -> None:
    spec = LoadSpec(url(server), NAME, rate=20.0, output_tokens=5000, duration_s=0.3,
                    drain_timeout_s=0.3)  # fmt: skip
    start = time.monotonic()
    report = await run_load(spec)
    assert time.monotonic() - start < 1.5
    assert report.sent >= 1 and report.errors == report.sent
    assert "cancelled" in report.error_samples[0]


async def test_a_stream_cut_before_done_is_not_served() -> None:
    """An engine stopped mid-answer (vLLM's default shutdown aborts its streams) closes
    the connection cleanly after some tokens: the client has a partial answer, and the
    count must say so. A stream that ends with `data: [DONE]` is served."""
    from aiohttp import web

    async def stream(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(3):
            await resp.write(b'data: {"choices": [{"text": "t%d"}]}\n\n' % i)
        if request.path.startswith("/abort"):  # what vLLM sends when it aborts on SIGTERM
            await resp.write(b'data: {"choices": [{"text": "", "finish_reason": "abort"}]}\n\n')
            await resp.write(b"data: [DONE]\n\n")
        if request.path.startswith("/done"):
            await resp.write(b"data: [DONE]\n\n")
        return resp

    app = web.Application()
    app.router.add_post("/cut/v1/completions", stream)
    app.router.add_post("/done/v1/completions", stream)
    app.router.add_post("/abort/v1/completions", stream)
    srv = TestServer(app)
    await srv.start_server()
    try:
        cut = await run_load(LoadSpec(url(srv) + "/cut", NAME, rate=50.0, duration_s=1.0,
                                      max_requests=2))  # fmt: skip
        done = await run_load(LoadSpec(url(srv) + "/done", NAME, rate=50.0, duration_s=1.0,
                                       max_requests=2))  # fmt: skip
        aborted = await run_load(LoadSpec(url(srv) + "/abort", NAME, rate=50.0,
                                          duration_s=1.0, max_requests=2))  # fmt: skip
    finally:
        await srv.close()
    assert (cut.completed, cut.errors, cut.cut) == (0, 2, 2)
    assert "ended without [DONE] after 3 token chunk(s)" in cut.error_samples[0]
    assert "(2 cut)" in cut.format()
    assert (done.completed, done.errors, done.cut) == (2, 0, 0)
    assert (aborted.completed, aborted.cut) == (0, 2)
    assert "aborted by the server" in aborted.error_samples[0]


def test_progress_bar_and_report_format() -> None:
    out = io.StringIO()
    show = loadgen.progress_bar(out, width=10)
    show(5, 10, 4, 1, 2.0)
    show(10, 10, 10, 1, 3.0)
    text = out.getvalue()
    assert "\r[####      ] 4/10 done, 1 in flight, 1 errors" in text and text.endswith("\n")
    rep = loadgen.summarize([loadgen.RequestResult(0.0, 10, 0.1, 0.01, 0.2, 5)], 1.0)
    assert "TTFT" in rep.format() and rep.to_json()["completed"] == 1


def test_cli_rejects_bad_trace(capsys: pytest.CaptureFixture[str]) -> None:
    from rooftop_cli.main import main

    assert main(["load", "--model", "m", "--trace", "/nonexistent.csv", "--quiet"]) == 2
    assert "cannot open" in capsys.readouterr().err


def test_no_two_prompts_share_a_prefix_cache_block() -> None:
    """vLLM and engine-sim cache prefixes by default: prompts of one length that began
    alike would be prefilled once, and the load would not be the lengths it says."""
    prompts = [loadgen.prompt_ids(300) for _ in range(1000)]
    assert all(len(p) == 300 for p in prompts) and len(loadgen.prompt_ids(1)) == 1
    assert len({chain_hashes(p, 16)[0] for p in prompts}) == 1000


async def test_a_speculating_engine_serves_load_at_any_temperature() -> None:
    """engine-sim streams the tokens a verified step accepts together; the client
    counts every one. --temperature reaches the body and is checked like the rest."""
    config = EngineSimConfig(
        model_name=NAME,
        time_scale=20.0,
        speculative_config='{"method": "ngram", "num_speculative_tokens": 3}',
        acceptance_rate=0.8,
    )
    srv = TestServer(build_app(config))
    await srv.start_server()
    try:
        spec = LoadSpec(url(srv), NAME, rate=50.0, prompt_tokens=64, output_tokens=40,
                        duration_s=2.0, max_requests=10, temperature=0.0)  # fmt: skip
        report = await run_load(spec)
        assert report.completed == 10 and report.errors == 0
        assert report.output_tok_s * report.duration_s == pytest.approx(10 * 40, rel=0.01)
    finally:
        await srv.close()
    with pytest.raises(ValueError, match="--temperature"):
        schedule(LoadSpec("u", "m", rate=1.0, temperature=-1.0))
