"""``rooftop load``: an open-loop load generator for OpenAI-compatible completion servers.

Arrivals are open-loop (they do not wait for responses): Gamma-distributed gaps at
``--rate`` with coefficient of variation ``--burstiness`` (1.0 = Poisson, > 1 burstier),
or the timestamps and lengths of an Azure-format ``--trace`` (see ``traces.py``).
Each request streams ``/v1/completions`` with the prompt as a list of token ids (so its
length is exact on vLLM and engine-sim alike), ``max_tokens`` = output length and
``ignore_eos`` so a real model does not stop early.

What prompts share decides what the engine's prefix cache (on by default in vLLM V1 and
engine-sim) saves. By default nothing: after ``--shared-prefix-tokens`` ids every
request has in common (a system prompt; none by default), each prompt has two ids no
other request of the process has there, so no later block is shared. A Mooncake trace
(``.jsonl``) names its prompts' 512-token blocks (``hash_ids``): each block id becomes
512 ids of its own, so prompts share exactly the blocks the trace says they share (a
conversation's later turn repeats its earlier turns).

Client-side measures per request: TTFT (send to first content chunk), TPOT ((last chunk
- first chunk) / (output tokens - 1), tokens from the usage chunk when the server sends
one), end-to-end latency. Strictly bounded: nothing is sent after ``--duration`` or
``--max-requests``, and requests still running ``--drain-timeout`` seconds after that
are cancelled and counted as errors.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import random
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Final

import aiohttp
import numpy as np

from rooftop_api import exit_codes
from rooftop_api.output import JSON, TEXT, YAML, add_output_option, dumps
from rooftop_sim.flags import Rule, check_ranges
from rooftop_sim.traces import Trace, TraceError, load_trace

PERCENTILES = (50, 90, 99)
MAX_PLANNED = 10**7  # requests one run may plan without --max-requests
BURSTINESS_RANGE = (1e-3, 100.0)  # beyond it the Gamma gaps underflow to 0 or overflow


@dataclass(frozen=True)
class LoadSpec:
    """What to send. Seconds, requests/second, tokens."""

    url: str
    model: str
    rate: float | None = None  # requests/s; None with a trace
    burstiness: float = 1.0  # CV of inter-arrival gaps (Gamma); 1.0 = Poisson
    trace: Trace | None = None
    trace_speedup: float = 1.0
    prompt_tokens: int = 512
    output_tokens: int = 128
    shared_prefix_tokens: int = 0  # ids every prompt starts with (a system prompt)
    duration_s: float = 60.0
    max_requests: int | None = None
    drain_timeout_s: float = 30.0
    seed: int = 0
    # sampling temperature sent with each request (None: the server's default); 0 is
    # greedy, where a drafter identical to the model has every draft accepted
    temperature: float | None = None


@dataclass
class RequestResult:
    """One request as the client saw it (seconds; None where it never got that far)."""

    sent_s: float
    prompt_tokens: int
    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None
    output_tokens: int = 0
    error: str | None = None
    cut: bool = False  # the stream ended without its [DONE]: the answer is incomplete


# The error a stream that ends without vLLM's final ``data: [DONE]`` gets: the server
# closed it mid-answer (an engine stopped, a proxy dropped the connection).
CUT_ERROR = "stream cut: ended without [DONE]"


@dataclass
class LoadReport:
    """Aggregate of a run. Latency stats are dicts p50/p90/p99/mean in seconds."""

    sent: int
    completed: int
    errors: int  # every request not completed, cut streams included
    duration_s: float
    offered_rate: float  # requests/s sent
    achieved_rate: float  # completed requests/s
    output_tok_s: float
    ttft_s: dict[str, float] = field(default_factory=dict)
    tpot_s: dict[str, float] = field(default_factory=dict)
    e2e_s: dict[str, float] = field(default_factory=dict)
    error_samples: list[str] = field(default_factory=list)
    cut: int = 0  # streams the server ended without [DONE] (part of errors)

    def to_json(self) -> dict[str, Any]:
        """Plain dict for ``--json``."""
        return asdict(self)

    def format(self) -> str:
        """Human-readable summary, milliseconds for latencies."""
        lines = [
            f"sent {self.sent}  completed {self.completed}  errors {self.errors} "
            f"({self.cut} cut)  in {self.duration_s:.1f} s",
            f"offered {self.offered_rate:.2f} req/s  achieved {self.achieved_rate:.2f} req/s  "
            f"output {self.output_tok_s:.0f} tok/s",
        ]
        for name, stats in (("TTFT", self.ttft_s), ("TPOT", self.tpot_s), ("E2E", self.e2e_s)):
            if stats:
                cells = "  ".join(f"{k} {v * 1e3:9.1f}" for k, v in stats.items())
                lines.append(f"{name:5s} ms  {cells}")
        lines += [f"error: {e}" for e in self.error_samples]
        return "\n".join(lines)


def _stats(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    arr = np.array(values)
    out = {f"p{q}": float(np.percentile(arr, q)) for q in PERCENTILES}
    out["mean"] = float(arr.mean())
    return out


def summarize(
    results: list[RequestResult], duration_s: float, send_window_s: float | None = None
) -> LoadReport:
    """Aggregate request results of a run that took ``duration_s`` seconds in all.

    offered_rate divides by the sending window (default: the whole run), achieved_rate
    and output_tok_s by the whole run including the drain.
    """
    ok = [r for r in results if r.error is None]
    errors = [r.error for r in results if r.error is not None]
    dur = max(duration_s, 1e-9)
    window = max(send_window_s if send_window_s else duration_s, 1e-9)
    return LoadReport(
        sent=len(results),
        completed=len(ok),
        errors=len(errors),
        duration_s=duration_s,
        offered_rate=len(results) / window,
        achieved_rate=len(ok) / dur,
        output_tok_s=sum(r.output_tokens for r in ok) / dur,
        ttft_s=_stats([r.ttft_s for r in ok if r.ttft_s is not None]),
        tpot_s=_stats([r.tpot_s for r in ok if r.tpot_s is not None]),
        e2e_s=_stats([r.e2e_s for r in ok if r.e2e_s is not None]),
        error_samples=sorted(set(errors))[:5],
        cut=sum(r.cut for r in results),
    )


def check_spec(spec: LoadSpec) -> None:
    """Every number finite and in range before anything is planned; ValueError names the flag."""
    rules: tuple[Rule, ...] = (
        ("--trace-speedup", spec.trace_speedup, 0.0, True),
        ("--duration", spec.duration_s, 0.0, True),
        ("--drain-timeout", spec.drain_timeout_s, 0.0, False),
        ("--prompt-tokens", spec.prompt_tokens, 1, False),
        ("--output-tokens", spec.output_tokens, 1, False),
        ("--shared-prefix-tokens", spec.shared_prefix_tokens, 0, False),
        ("--max-requests", spec.max_requests if spec.max_requests is not None else 1, 1, False),
        ("--seed", spec.seed, 0, False),
        ("--temperature", spec.temperature if spec.temperature is not None else 0.0, 0.0, False),
    )
    check_ranges(rules)
    if spec.trace is None:
        _check_rate(spec)


def _check_rate(spec: LoadSpec) -> None:
    if spec.rate is None:
        raise ValueError("give a positive --rate or a --trace")
    if not (math.isfinite(spec.rate) and spec.rate > 0):
        raise ValueError(f"--rate: must be a finite number > 0, got {spec.rate}")
    low, high = BURSTINESS_RANGE
    if not low <= spec.burstiness <= high:  # False for NaN too
        raise ValueError(
            f"--burstiness: must be a number from {low:g} to {high:g} (CV of gaps, "
            f"1 = Poisson), got {spec.burstiness}"
        )
    if spec.max_requests is None and spec.rate * spec.duration_s > MAX_PLANNED:
        raise ValueError(
            f"--rate {spec.rate:g} for --duration {spec.duration_s:g} s plans over "
            f"{MAX_PLANNED:,} requests: lower them or cap with --max-requests"
        )


def schedule(spec: LoadSpec) -> list[tuple[float, int, int]]:
    """(send offset s, prompt tokens, output tokens) for every request the run may send.

    Bounded by duration and max_requests before anything is sent.
    """
    check_spec(spec)
    cap = spec.max_requests if spec.max_requests is not None else MAX_PLANNED
    if spec.trace is not None:
        reqs = spec.trace.speedup(spec.trace_speedup).requests()
        return [r for r in reqs if r[0] < spec.duration_s][:cap]
    assert spec.rate is not None  # check_spec: a rate without a trace
    rng = np.random.default_rng(spec.seed)
    shape = 1.0 / spec.burstiness**2  # Gamma CV = 1/sqrt(shape)
    out: list[tuple[float, int, int]] = []
    t = 0.0
    while len(out) < cap:
        if t >= spec.duration_s:
            break
        out.append((t, spec.prompt_tokens, spec.output_tokens))
        t += float(rng.gamma(shape, 1.0 / (spec.rate * shape)))
    return out


# numbers the prompts; from a random start, so that two processes rarely share one
_PROMPT_SERIAL = itertools.count(random.randrange(1 << 28))
# Prompt token ids lie in [FIRST_ID, FIRST_ID + ID_SPAN): every real vocabulary has them,
# and so does the tests' tiny model (4,096 ids, tests/engine/tiny_model.py). An id
# beyond a model's vocabulary is an error, and vLLM then streams no token at all.
FIRST_ID: Final = 1000
ID_SPAN: Final = 2000


def prompt_ids(length: int, shared: int = 0) -> list[int]:
    """``length`` token ids (module doc's range): the ``shared`` ids every prompt starts
    with, then two unique to this prompt (ID_SPAN² = 4 million prompts before a repeat),
    so no request finds more of another's prefix than the shared ids in the cache."""
    serial = next(_PROMPT_SERIAL)
    common = [FIRST_ID + ID_SPAN - 1 - i % ID_SPAN for i in range(min(shared, length))]
    head = [FIRST_ID + serial % ID_SPAN, FIRST_ID + serial // ID_SPAN % ID_SPAN]
    rest = [FIRST_ID + i % ID_SPAN for i in range(len(common) + 2, length)]
    return (common + head + rest)[:length]


def block_prompt_ids(blocks: Sequence[int], block_tokens: int, length: int) -> list[int]:
    """``length`` ids for a prompt whose first blocks a trace names (``blocks``, each id
    naming the prefix through its block of ``block_tokens``): a block id gives the same
    ids wherever it appears (drawn from a generator seeded with it, so two blocks' ids
    coincide only by chance, once in ID_SPAN^block_tokens), so two prompts share exactly
    their common blocks; beyond the named blocks, ids unique to this prompt."""
    named = min(len(blocks), -(-length // block_tokens))
    ids = [
        int(i)
        for block in blocks[:named]
        for i in np.random.default_rng(block).integers(FIRST_ID, FIRST_ID + ID_SPAN, block_tokens)
    ]
    return (ids + prompt_ids(max(length - len(ids), 0)))[:length]


def request_ids(spec: LoadSpec, index: int, length: int) -> list[int]:
    """The ids of the ``index``-th scheduled request's prompt (module doc)."""
    prefix = None if spec.trace is None else spec.trace.prefix
    if prefix is not None:
        return block_prompt_ids(prefix.of(index).tolist(), prefix.block_tokens, length)
    return prompt_ids(length, spec.shared_prefix_tokens)


async def send_request(
    session: aiohttp.ClientSession,
    spec: LoadSpec,
    prompt: int,
    output: int,
    t0: float,
    ids: list[int] | None = None,
) -> RequestResult:
    """Send one streaming completion and time it; errors are captured, not raised.
    ``ids``: the prompt's token ids (default: ``prompt_ids``, with the spec's shared ones)."""
    res = RequestResult(sent_s=time.monotonic() - t0, prompt_tokens=prompt)
    body = {
        "model": spec.model,
        "prompt": prompt_ids(prompt, spec.shared_prefix_tokens) if ids is None else ids,
        "max_tokens": output,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if spec.temperature is not None:
        body["temperature"] = spec.temperature
    start = time.monotonic()
    try:
        async with session.post(spec.url.rstrip("/") + "/v1/completions", json=body) as resp:
            if resp.status != 200:
                text = (await resp.text())[:200]
                res.error = f"HTTP {resp.status}: {text}"
                return res
            await _read_stream(resp, res, start)
    except (TimeoutError, aiohttp.ClientError, OSError, ValueError) as err:  # ValueError: bad JSON
        res.error = f"{type(err).__name__}: {err}"
    return res


async def _read_stream(resp: aiohttp.ClientResponse, res: RequestResult, start: float) -> None:
    """Read the server-sent events; a stream counts as served only when it ends with
    ``data: [DONE]`` (an engine stopped mid-answer closes it cleanly, tokens and all)
    and no choice finished with ``abort`` (vLLM's shutdown without a drain aborts its
    requests and still sends [DONE])."""
    first = last = None
    chunks = 0
    usage_tokens = None
    done = False
    finish: str | None = None
    try:
        async for raw in resp.content:
            line = raw.decode(errors="replace").strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                done = True
                break
            obj = json.loads(data)
            if obj.get("usage"):
                usage_tokens = obj["usage"].get("completion_tokens")
            for choice in obj.get("choices") or []:
                finish = choice.get("finish_reason") or finish
            if obj.get("choices"):
                now = time.monotonic()
                first = now if first is None else first
                last = now
                chunks += 1
    except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError):
        pass  # the server closed the stream mid-answer: not done, counted as cut below
    n = usage_tokens if isinstance(usage_tokens, int) else chunks
    res.output_tokens = n
    res.e2e_s = time.monotonic() - start
    if not done:
        res.error, res.cut = f"{CUT_ERROR} after {chunks} token chunk(s)", True
        return
    if finish == "abort":  # vLLM's abort on SIGTERM ends the stream with [DONE] too
        res.error, res.cut = f"stream aborted by the server after {chunks} token chunk(s)", True
        return
    if first is None or last is None:
        res.error = "stream ended without tokens"
        return
    res.ttft_s = first - start
    if n > 1:
        res.tpot_s = (last - first) / (n - 1)


# sent, planned, finished, errors, elapsed seconds
ProgressFn = Callable[[int, int, int, int, float], None]


@dataclass
class _Run:
    """Book-keeping of one run: tasks in flight and results so far."""

    planned: int
    t0: float = field(default_factory=time.monotonic)
    results: list[RequestResult] = field(default_factory=list)
    inflight: dict[asyncio.Task[RequestResult], RequestResult] = field(default_factory=dict)

    def done(self, task: asyncio.Task[RequestResult]) -> None:
        placeholder = self.inflight.pop(task)
        if task.cancelled():
            placeholder.error = "cancelled: still running at the drain deadline"
            self.results.append(placeholder)
        else:
            self.results.append(task.result())

    def report(self, progress: ProgressFn | None) -> None:
        if progress is not None:
            errs = sum(r.error is not None for r in self.results)
            sent = len(self.results) + len(self.inflight)
            progress(sent, self.planned, len(self.results), errs, time.monotonic() - self.t0)


# Below vLLM's idle keep-alive timeout (uvicorn's, VLLM_HTTP_TIMEOUT_KEEP_ALIVE, 5 s):
# the client drops an idle connection before the server does, so a request never goes
# out on a connection the server is closing at that instant (HTTP's own race).
IDLE_KEEPALIVE_S: Final = 4.0


def connector() -> aiohttp.TCPConnector:
    """The load's connection pool: no client-side concurrency cap (open loop), and
    idle connections dropped before the engine drops them."""
    return aiohttp.TCPConnector(limit=0, keepalive_timeout=IDLE_KEEPALIVE_S)


async def run_load(spec: LoadSpec, progress: ProgressFn | None = None) -> LoadReport:
    """Run the load described by ``spec``; never longer than duration + drain timeout."""
    plan = schedule(spec)
    run = _Run(len(plan))
    async with aiohttp.ClientSession(connector=connector()) as session:
        ticker = asyncio.create_task(_tick(run, progress))
        try:
            for index, (offset, prompt, output) in enumerate(plan):
                delay = run.t0 + offset - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                ids = request_ids(spec, index, prompt)
                sent = send_request(session, spec, prompt, output, run.t0, ids)
                task = asyncio.create_task(sent)
                run.inflight[task] = RequestResult(sent_s=offset, prompt_tokens=prompt)
                task.add_done_callback(run.done)
            await _drain(run, spec.drain_timeout_s)
        finally:
            ticker.cancel()
            for task in list(run.inflight):
                task.cancel()
            await asyncio.gather(*run.inflight, return_exceptions=True)
    await asyncio.sleep(0)  # let the last done-callbacks run
    run.report(progress)
    return summarize(run.results, time.monotonic() - run.t0, _send_window(spec, plan))


def _send_window(spec: LoadSpec, plan: list[tuple[float, int, int]]) -> float:
    """Seconds over which requests were offered: the duration, or less if capped by count."""
    if spec.max_requests is not None and len(plan) >= spec.max_requests and len(plan) > 1:
        # n requests span n-1 gaps; scale to n gaps to estimate the offered rate
        return plan[-1][0] * len(plan) / (len(plan) - 1)
    return spec.duration_s


async def _drain(run: _Run, timeout_s: float) -> None:
    """Wait for requests in flight, at most ``timeout_s``; cancel the rest."""
    if run.inflight:
        _, pending = await asyncio.wait(list(run.inflight), timeout=timeout_s)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending)


async def _tick(run: _Run, progress: ProgressFn | None) -> None:
    while progress is not None:
        run.report(progress)
        await asyncio.sleep(0.25)


def progress_bar(stream: Any = sys.stderr, width: int = 30) -> ProgressFn:
    """A one-line text progress bar (carriage-return updates) for a terminal."""

    def show(sent: int, planned: int, finished: int, errors: int, elapsed: float) -> None:
        frac = finished / planned if planned else 1.0
        bar = "#" * int(frac * width)
        stream.write(
            f"\r[{bar:<{width}}] {finished}/{planned} done, {sent - finished} in flight, "
            f"{errors} errors, {elapsed:5.1f} s"
        )
        if planned and finished >= planned:
            stream.write("\n")
        stream.flush()

    return show


def register(subparsers: Any) -> None:
    """Add ``rooftop load`` (rooftop_cli.main: register(subparsers) sets func)."""
    p = subparsers.add_parser("load", help="send open-loop streaming load, report TTFT/TPOT")
    p.add_argument("--url", default="http://127.0.0.1:8000", help="server base URL")
    p.add_argument("--model", required=True, help="served model name")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--rate", type=float, help="requests per second")
    src.add_argument(
        "--trace", help="trace to replay: Azure-format CSV, or Mooncake .jsonl (shared blocks)"
    )
    p.add_argument("--burstiness", type=float, default=1.0, help="CV of gaps (1 = Poisson)")
    p.add_argument("--trace-speedup", type=float, default=1.0, help="replay N times faster")
    p.add_argument("--prompt-tokens", type=int, default=512)
    p.add_argument("--output-tokens", type=int, default=128)
    p.add_argument(
        "--shared-prefix-tokens",
        type=int,
        default=0,
        help="tokens every prompt starts with (a system prompt: prefix-cache hits)",
    )
    p.add_argument("--duration", type=float, default=60.0, help="seconds of sending")
    p.add_argument("--max-requests", type=int, default=None)
    p.add_argument(
        "--drain-timeout",
        type=float,
        default=30.0,
        help="seconds to wait for requests in flight after sending stops",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--temperature",
        type=float,
        default=None,
        help="sampling temperature of every request (default: the server's; 0: greedy)",
    )
    add_output_option(p, (TEXT, JSON, YAML), TEXT, json_alias=True)
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    """Exit 0 if any request completed, 1 if none did, 2 on bad arguments."""
    try:
        trace = load_trace(args.trace) if args.trace else None
        spec = LoadSpec(
            url=args.url,
            model=args.model,
            rate=args.rate,
            burstiness=args.burstiness,
            trace=trace,
            trace_speedup=args.trace_speedup,
            prompt_tokens=args.prompt_tokens,
            output_tokens=args.output_tokens,
            shared_prefix_tokens=args.shared_prefix_tokens,
            duration_s=args.duration,
            max_requests=args.max_requests,
            drain_timeout_s=args.drain_timeout,
            seed=args.seed,
            temperature=args.temperature,
        )
        schedule(spec)  # validate before opening connections
    except (TraceError, ValueError) as err:
        print(f"rooftop load: {err}", file=sys.stderr)
        return exit_codes.BAD_INPUT
    show = None if args.quiet or not sys.stderr.isatty() else progress_bar()
    report = asyncio.run(run_load(spec, show))
    print(dumps(report.to_json(), args.output) if args.output != TEXT else report.format())
    return exit_codes.OK if report.completed > 0 else exit_codes.INFEASIBLE
