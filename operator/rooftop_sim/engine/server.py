"""``rooftop engine-sim``: a simulated vLLM server (OpenAI API + vLLM's /metrics).

One asyncio task drives ``core.EngineCore`` in (scaled) real time: it runs an iteration,
sleeps for its duration from the truth model, then delivers the iteration's tokens to
the waiting HTTP handlers. ``--time-scale K`` runs K simulated seconds per wall second;
/metrics reports simulated seconds (what a real engine would report), while a client's
stopwatch sees durations divided by K.

Prompt length, explicitly:
- /v1/completions with ``prompt`` as a list of token ids: exactly ``len(prompt)`` tokens
  (vLLM accepts token-id prompts too, so ``rooftop load`` sends those for exact lengths);
- a text prompt: ``ceil(1.3 * whitespace-separated words)``, at least 1;
- /v1/chat/completions: the same per message content, plus 4 tokens of chat template each.
Prefix caching (on, as in vLLM V1; ``--no-enable-prefix-caching`` turns it off): the
engine caches the prompt's full blocks by chained hashes of their token ids, so a prompt
that repeats an earlier one's beginning finds it. Token-id prompts hash their ids; a text
stands for as many pseudo-token ids as it counts tokens, token k being the word k / 1.3
(so a text that extends another begins with the same ids); a chat message adds 4 ids of
its role before its content.
Output length is exactly ``max_tokens`` (default 16; ``max_completion_tokens`` for chat
also works): the simulated model never stops early, so finish_reason is always "length".

Endpoints: /v1/models, /v1/completions, /v1/chat/completions (SSE when "stream": true),
/health, /metrics, and for tests GET|POST /admin/reality ({"reality_factor": x}) and
GET /admin/state.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import sys
import time
import uuid
import zlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from rooftop_api import exit_codes
from rooftop_planner.catalog import CatalogError, ModelSpec, load_catalog
from rooftop_planner.drafters import (
    HOST_METHODS,
    METHODS,
    MTP,
    Drafter,
    drafter_shape,
    mtp_head,
    with_drafter,
)
from rooftop_planner.parallelism import TP_DEGREES, tp_problem
from rooftop_planner.scenarios import normalize_dtype
from rooftop_sim.engine.core import EngineConfig, EngineCore, Request, Speculation, StepResult
from rooftop_sim.engine.prefix_cache import chain_hashes
from rooftop_sim.engine.truth import TruthModel
from rooftop_sim.engine.vllm_metrics import VllmMetrics
from rooftop_sim.errors import SimError
from rooftop_sim.flags import Rule, check_ranges

CHAT_TOKENS_PER_MESSAGE = 4  # role markers and separators of a typical chat template
TOKENS_PER_WORD = 1.3
DEFAULT_MAX_TOKENS = 16
_WORDS = ("the", " model", " says", " hello", " to", " you", " and", " then", " more", ".")


@dataclass(frozen=True)
class EngineSimConfig:
    """engine-sim settings; see ``register`` for the meaning of each flag."""

    model: str = "llama-3.1-8b"
    model_name: str = ""  # served name; empty: same as model
    gpu: str = "h100-sxm"
    tp: int = 1
    weight_dtype: str = "bf16"
    kv_dtype: str = "auto"
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int = 8192
    gpu_memory_utilization: float = 0.9
    kv_capacity_tokens: int = 0  # 0: from the truth model's memory budget
    reality_factor: float = 1.0
    noise: float = 0.0
    seed: int = 0
    time_scale: float = 1.0
    enable_prefix_caching: bool = True
    speculative_config: str = ""  # vLLM's --speculative-config JSON ("": none)
    acceptance_rate: float = 0.7  # the mean per-token acceptance requests draw theirs around
    # the drafter's shape where the drafter catalog does not list it (spec.engine.drafter)
    draft_catalog_model: str = ""
    draft_layers: int = 0
    draft_vocab_size: int = 0

    @property
    def served_name(self) -> str:
        """The name clients send as "model" and /metrics reports as model_name."""
        return self.model_name or self.model


def check_config(cfg: EngineSimConfig) -> None:
    """Each numeric setting finite and in range; a ValueError naming the flag otherwise."""
    rules: tuple[Rule, ...] = (
        ("--tp", cfg.tp, 1, False),
        ("--max-num-seqs", cfg.max_num_seqs, 1, False),
        ("--max-num-batched-tokens", cfg.max_num_batched_tokens, 1, False),
        ("--max-model-len", cfg.max_model_len, 1, False),
        ("--kv-capacity-tokens", cfg.kv_capacity_tokens, 0, False),
        ("--reality-factor", cfg.reality_factor, 0.0, True),
        ("--noise", cfg.noise, 0.0, False),
        ("--seed", cfg.seed, 0, False),
        ("--time-scale", cfg.time_scale, 0.0, True),
        ("--draft-layers", cfg.draft_layers, 0, False),
        ("--draft-vocab-size", cfg.draft_vocab_size, 0, False),
    )
    check_ranges(rules)
    if not (math.isfinite(cfg.acceptance_rate) and 0 < cfg.acceptance_rate < 1):
        raise ValueError(
            f"--acceptance-rate: must be a number in (0, 1), got {cfg.acceptance_rate}"
        )
    mem = cfg.gpu_memory_utilization
    if not (math.isfinite(mem) and 0 < mem <= 1):
        raise ValueError(f"--gpu-memory-utilization: must be a number in (0, 1], got {mem}")


SIM_METHODS = (*HOST_METHODS, MTP, *METHODS)


def sim_speculation(
    cfg: EngineSimConfig, model: ModelSpec
) -> tuple[Speculation | None, tuple[ModelSpec, str] | None]:
    """The engine's speculation from --speculative-config as vLLM reads it (method,
    num_speculative_tokens, num_speculative_tokens_per_batch_size, the drafter's
    "model" and "quantization"), with --acceptance-rate as the acceptance requests draw
    theirs around; and the drafter's shape and weight dtype (none for ngram and suffix,
    which draft on the host). A ValueError names the flag and what it takes."""
    if not cfg.speculative_config:
        return None, None
    named = _named_drafter(cfg) if cfg.draft_catalog_model or cfg.draft_layers else None
    config, weights = cfg.speculative_config, sim_dtypes(cfg)[0]
    return speculation_from(
        config, cfg.acceptance_rate, cfg.seed, cfg.max_num_seqs, model, named, weights
    )


def _named_drafter(cfg: EngineSimConfig) -> Drafter:
    """The drafter --draft-catalog-model or --draft-layers/--draft-vocab-size shape;
    its method and repo are the ones --speculative-config names (``speculation_from``)."""
    return Drafter(
        method="",
        repo="",
        layers=max(cfg.draft_layers, 1),
        draft_vocab=cfg.draft_vocab_size,
        model=cfg.draft_catalog_model,
    )


def speculation_from(
    text: str,
    acceptance: float,
    seed: int,
    max_num_seqs: int,
    model: ModelSpec,
    named: Drafter | None = None,
    weight_dtype: str = "bf16",
) -> tuple[Speculation, tuple[ModelSpec, str] | None]:
    """``sim_speculation`` from the JSON itself (the simulated cluster's pods too);
    ``named``: a drafter the catalog does not list (spec.engine.drafter; without a
    method and repo, the shape of the one the JSON names); ``weight_dtype``: the
    model's, which its MTP layers (``mtp``) load in."""
    flag = "--speculative-config"
    try:
        config = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"{flag}: not JSON ({err.msg})") from None
    method, k = config.get("method"), config.get("num_speculative_tokens")
    if method not in SIM_METHODS:
        raise ValueError(f"{flag}: method must be one of {', '.join(SIM_METHODS)}, got {method!r}")
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"{flag}: num_speculative_tokens must be an integer >= 1, got {k!r}")
    ranges = config.get("num_speculative_tokens_per_batch_size") or [[1, max_num_seqs, k]]
    try:
        schedule = tuple((int(a), int(b), min(int(n), k)) for a, b, n in ranges)
    except (TypeError, ValueError):
        raise ValueError(
            f"{flag}: num_speculative_tokens_per_batch_size must be [first, last, K] ranges"
        ) from None
    lookup = method if method in HOST_METHODS else None
    speculation = Speculation(schedule, acceptance, seed=seed, num_tokens=k, lookup=lookup)
    if lookup is not None:
        return speculation, None
    if method == MTP:
        return speculation, (_mtp_shape(model), weight_dtype)
    repo = config.get("model")
    if named is not None and not named.method:
        named = replace(named, method=method, repo=str(repo))
    return speculation, (_drafter_shape(model, method, repo, named), _draft_dtype(config))


def _drafter_shape(model: ModelSpec, method: str, repo: object, named: Drafter | None) -> ModelSpec:
    """The shape of the drafter ``repo`` names for ``model``: ``named`` where it is that
    one, else the catalog's (engine-sim times those only)."""
    known = with_drafter(model.id, named)
    drafter = known.get(method)
    if drafter is None or drafter.repo != repo:
        listed = ", ".join(f"{d.method}: {d.repo}" for d in known.values()) or "none"
        raise ValueError(
            f"--speculative-config: engine-sim times the drafters the catalog lists for "
            f"{model.id} ({listed}), not {method} {repo!r}"
        )
    try:
        return drafter_shape(model, drafter, load_catalog())
    except CatalogError as err:
        raise ValueError(f"--speculative-config: {err}") from None


def _mtp_shape(model: ModelSpec) -> ModelSpec:
    """The model's own MTP layers, where its config.json has them."""
    if model.mtp_layers < 1:
        raise ValueError(
            f"--speculative-config: mtp drafts with the model's multi-token-prediction "
            f"layers, and {model.id} has none"
        )
    return mtp_head(model)


def _draft_dtype(config: dict[str, Any]) -> str:
    """A draft model quantized at load (vLLM's "quantization": "fp8"), else 16-bit."""
    return "fp8" if config.get("quantization") == "fp8" else "bf16"


def sim_dtypes(cfg: EngineSimConfig) -> tuple[str, str]:
    """(weight, KV) dtype as the planner spells them; ValueError for a dtype it does not know."""
    weight = normalize_dtype(cfg.weight_dtype, "--weight-dtype")
    return weight, normalize_dtype(cfg.kv_dtype, "--kv-dtype", kv=True)


def check_tp(model: ModelSpec, tp: int) -> None:
    """The planner's TP rule (``parallelism.tp_problem``), so the simulator refuses what
    ``rooftop plan`` and ``rooftop predict`` refuse."""
    problem = tp_problem(model, tp)
    if problem:
        valid = ", ".join(str(t) for t in TP_DEGREES if not tp_problem(model, t))
        raise ValueError(f"--tp: {problem} ({model.id}); use one of {valid}")


def _check_kv(kv: int, cfg: EngineSimConfig) -> None:
    if kv >= cfg.max_model_len:
        return
    if cfg.kv_capacity_tokens:
        fix = "raise --kv-capacity-tokens or lower --max-model-len"
    else:
        fix = "lower --max-model-len or raise --gpu-memory-utilization / --tp"
    raise ValueError(
        f"KV cache holds {kv} tokens, less than --max-model-len {cfg.max_model_len}: {fix}"
    )


def count_text_tokens(text: str) -> int:
    """Approximate tokens of a text: ceil(1.3 per whitespace-separated word), >= 1."""
    return max(1, math.ceil(len(text.split()) * TOKENS_PER_WORD))


class BadRequest(SimError):
    """A client error; becomes an OpenAI-style 400 (or the given status)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class EngineSim:
    """The engine, its metrics, and the task that runs it in scaled real time."""

    def __init__(self, cfg: EngineSimConfig) -> None:
        check_config(cfg)
        self.cfg = cfg
        self.truth = TruthModel.for_deployment(
            cfg.model, cfg.gpu, cfg.tp, *sim_dtypes(cfg), cfg.reality_factor, cfg.noise, cfg.seed
        )
        check_tp(self.truth.dep.model, cfg.tp)
        speculation, drafter = sim_speculation(cfg, self.truth.dep.model)
        if drafter is not None:
            self.truth.with_drafter(*drafter)
        elif speculation is not None and speculation.lookup:
            self.truth.with_lookup(speculation.lookup)
        kv = cfg.kv_capacity_tokens or self.truth.kv_capacity_tokens(cfg.gpu_memory_utilization)
        _check_kv(kv, cfg)
        ecfg = EngineConfig(
            kv,
            cfg.max_num_seqs,
            cfg.max_num_batched_tokens,
            cfg.max_model_len,
            enable_prefix_caching=cfg.enable_prefix_caching,
            speculation=speculation,
        )
        self.engine = EngineCore(ecfg, self.truth)
        positions = speculation.positions if speculation else 0
        self.metrics = VllmMetrics(
            cfg.served_name, cfg.max_model_len, self._cache_info(ecfg), positions
        )
        self.metrics.set_gauges(self.engine)
        self._t0 = time.monotonic()
        self._busy_until: float | None = None  # end (sim s) of the iteration in flight
        self._queues: dict[str, asyncio.Queue[int | None]] = {}
        self._work = asyncio.Event()

    def _cache_info(self, ecfg: EngineConfig) -> dict[str, str]:
        return {
            "block_size": str(ecfg.block_size),
            "cache_dtype": self.cfg.kv_dtype,
            "enable_prefix_caching": str(ecfg.enable_prefix_caching),
            "gpu_memory_utilization": str(self.cfg.gpu_memory_utilization),
            "num_cpu_blocks": "None",
            "num_gpu_blocks": str(ecfg.num_blocks),
        }

    def sim_now(self) -> float:
        """Simulated seconds since start: wall time times the time scale."""
        return (time.monotonic() - self._t0) * self.cfg.time_scale

    def submit(
        self, prompt: Sequence[int], max_tokens: int
    ) -> tuple[Request, asyncio.Queue[int | None]]:
        """Queue a request of these prompt token ids; the queue yields output token
        indices, then None when done."""
        now = self.sim_now()
        if self._busy_until is not None:
            # in the engine's clock it arrived no later than the iteration now running ends
            now = min(now, self._busy_until)
        ecfg = self.engine.config
        hashes = chain_hashes(prompt, ecfg.block_size) if ecfg.enable_prefix_caching else ()
        req = Request(uuid.uuid4().hex, len(prompt), max_tokens, now, block_hashes=hashes)
        try:
            self.engine.add_request(req)
        except ValueError as err:
            raise BadRequest(str(err)) from err
        queue: asyncio.Queue[int | None] = asyncio.Queue()
        self._queues[req.request_id] = queue
        self.metrics.set_gauges(self.engine)
        self._work.set()
        return req, queue

    def abort(self, req: Request) -> None:
        """Client went away before the end: free its KV, count it as an abort."""
        self._queues.pop(req.request_id, None)
        if self.engine.abort(req.request_id, self._busy_until or self.sim_now()) is not None:
            self.metrics.on_finish(req)
            self.metrics.set_gauges(self.engine)

    async def run(self) -> None:
        """Engine loop: step, sleep the step's duration, deliver its tokens; forever."""
        while True:
            if not self.engine.has_work():
                self._busy_until = None
                self._work.clear()
                await self._work.wait()
                continue
            now = self._busy_until if self._busy_until is not None else self.sim_now()
            res = self.engine.step(now)
            if res is None:  # cannot happen with add_request's checks; do not spin
                await asyncio.sleep(0.001)
                continue
            self._busy_until = res.end_s
            # absolute deadline, so sleep overshoot does not accumulate over iterations
            deadline = self._t0 + res.end_s / self.cfg.time_scale
            await asyncio.sleep(max(0.0, deadline - time.monotonic()))
            self._deliver(res)

    def _deliver(self, res: StepResult) -> None:
        self.metrics.on_step(res)
        self.metrics.count_spec_decode(self.engine)
        for ev in res.tokens:
            q = self._queues.get(ev.request.request_id)
            if q is not None:
                q.put_nowait(ev.index)
        for req in res.finished:
            self.metrics.on_finish(req)
            q = self._queues.pop(req.request_id, None)
            if q is not None:
                q.put_nowait(None)
        self.metrics.set_gauges(self.engine)

    def state(self) -> dict[str, Any]:
        """Snapshot for GET /admin/state and tests."""
        e = self.engine
        return {
            "sim_time_s": self.sim_now(),
            "running": e.num_running,
            "waiting": e.num_waiting,
            "kv_usage": e.kv_usage,
            "kv_capacity_tokens": e.config.kv_capacity_tokens,
            "reality_factor": self.truth.reality_factor,
            "fit_source": self.truth.fit_source,
            "preemptions": e.counters.preemptions,
            "prompt_tokens": e.counters.prompt_tokens,
            "prefix_cache_queries": e.counters.prefix_queries,
            "prefix_cache_hits": e.counters.prefix_hits,
            "generation_tokens": e.counters.generation_tokens,
            "finished": dict(e.counters.finished),
            "steps": e.counters.steps,
        }


# --------------------------------------------------------------------------------------
# OpenAI-compatible HTTP API
# --------------------------------------------------------------------------------------

SIM_KEY = web.AppKey("sim", EngineSim)
# The handler tasks of the requests in flight, and how long SIGTERM lets them finish.
INFLIGHT_KEY = web.AppKey("inflight", set[asyncio.Task[Any]])
DRAIN_KEY = web.AppKey("drain_s", float)


def _token_text(index: int) -> str:
    return _WORDS[index % len(_WORDS)]


def text_token_ids(text: str) -> list[int]:
    """``count_text_tokens(text)`` pseudo-token ids: token k is word k / 1.3 (its CRC-32),
    so a text that extends another begins with the same ids."""
    words = [zlib.crc32(w.encode()) for w in text.split()] or [0]
    last = len(words) - 1
    return [words[min(int(k / TOKENS_PER_WORD), last)] for k in range(count_text_tokens(text))]


def completion_prompt_ids(body: dict[str, Any]) -> list[int]:
    """Prompt token ids of a /v1/completions body (see the module docstring)."""
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return text_token_ids(prompt)
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        return prompt
    if isinstance(prompt, list) and len(prompt) == 1:
        return completion_prompt_ids({"prompt": prompt[0]})
    raise BadRequest("'prompt' must be a string or a list of token ids (one prompt)")


def chat_prompt_ids(body: dict[str, Any]) -> list[int]:
    """Prompt token ids of a /v1/chat/completions body: per message, 4 ids of its role
    (the chat template's markers), then its content's."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty list")
    ids: list[int] = []
    for msg in messages:
        content = msg.get("content") if isinstance(msg, dict) else None
        if isinstance(content, list):  # content parts: count the text ones
            content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        if not isinstance(content, str):
            raise BadRequest("each message needs a string 'content'")
        role = zlib.crc32(str(msg.get("role", "")).encode())
        ids += [role] * CHAT_TOKENS_PER_MESSAGE + text_token_ids(content)
    return ids


def max_tokens_of(body: dict[str, Any]) -> int:
    """Output length: max_tokens (or max_completion_tokens), default 16; must be >= 1."""
    value = body.get("max_tokens", body.get("max_completion_tokens", DEFAULT_MAX_TOKENS))
    if value is None:
        value = DEFAULT_MAX_TOKENS
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise BadRequest(f"max_tokens must be a positive integer, got {value!r}")
    return value


def _error(message: str, status: int) -> web.Response:
    kind = "NotFoundError" if status == 404 else "BadRequestError"
    err = {"message": message, "type": kind, "param": None, "code": status}
    return web.json_response({"error": err}, status=status)


def _usage(req: Request) -> dict[str, int]:
    return {
        "prompt_tokens": req.prompt_tokens,
        "completion_tokens": req.out,
        "total_tokens": req.prompt_tokens + req.out,
    }


def _chunk(chat: bool, head: dict[str, Any], text: str, finish: str | None) -> dict[str, Any]:
    if chat:
        choice = {"index": 0, "delta": {"content": text}, "logprobs": None}
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "stop_reason": None}
    return {**head, "choices": [{**choice, "finish_reason": finish}]}


async def _read_body(request: web.Request, sim: EngineSim) -> dict[str, Any]:
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise BadRequest(f"request body is not JSON: {err}") from err
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    model = body.get("model")
    if model is not None and model != sim.cfg.served_name:
        raise BadRequest(f"The model `{model}` does not exist.", status=404)
    if body.get("n", 1) != 1:
        raise BadRequest("engine-sim supports n=1 only")
    return body


async def _stream(
    request: web.Request,
    req: Request,
    queue: asyncio.Queue[int | None],
    chat: bool,
    head: dict[str, Any],
    include_usage: bool,
) -> web.StreamResponse:
    """Server-sent events: one chunk per token, usage chunk if asked, then [DONE]."""
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)

    async def send(obj: dict[str, Any] | str) -> None:
        data = obj if isinstance(obj, str) else json.dumps(obj)
        await resp.write(f"data: {data}\n\n".encode())

    if chat:  # vLLM's first chat chunk carries the role only
        await send(
            {
                **head,
                "choices": [
                    {
                        "index": 0,
                        "delta": {"role": "assistant", "content": ""},
                        "logprobs": None,
                        "finish_reason": None,
                    }
                ],
            }
        )
    async for index in _tokens(queue):
        finish = "length" if index + 1 >= req.max_tokens else None
        await send(_chunk(chat, head, _token_text(index), finish))
    if include_usage:
        await send({**head, "choices": [], "usage": _usage(req)})
    await send("[DONE]")
    await resp.write_eof()
    return resp


async def _tokens(queue: asyncio.Queue[int | None]) -> AsyncIterator[int]:
    while (index := await queue.get()) is not None:
        yield index


async def _whole(
    req: Request, queue: asyncio.Queue[int | None], chat: bool, head: dict[str, Any]
) -> web.Response:
    """Non-streaming: wait for the last token, answer once."""
    text = "".join([_token_text(i) async for i in _tokens(queue)])
    if chat:
        choice: dict[str, Any] = {"message": {"role": "assistant", "content": text}}
    else:
        choice = {"text": text, "stop_reason": None}
    choice.update(index=0, logprobs=None, finish_reason="length")
    obj = "chat.completion" if chat else "text_completion"
    return web.json_response({**head, "object": obj, "choices": [choice], "usage": _usage(req)})


async def _generate(request: web.Request, chat: bool) -> web.StreamResponse:
    sim = request.app[SIM_KEY]
    task = asyncio.current_task()
    inflight = request.app[INFLIGHT_KEY]
    if task is not None:  # SIGTERM's drain waits for it (_drain)
        inflight.add(task)
    try:
        return await _serve(request, sim, chat)
    finally:
        inflight.discard(task)


async def _serve(request: web.Request, sim: EngineSim, chat: bool) -> web.StreamResponse:
    try:
        body = await _read_body(request, sim)
        prompt = chat_prompt_ids(body) if chat else completion_prompt_ids(body)
        req, queue = sim.submit(prompt, max_tokens_of(body))
    except BadRequest as err:
        return _error(str(err), err.status)
    head = {
        "id": ("chatcmpl-" if chat else "cmpl-") + req.request_id,
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": int(time.time()),
        "model": sim.cfg.served_name,
    }
    finished = False
    try:
        if body.get("stream"):
            opts = body.get("stream_options") or {}
            usage = bool(opts.get("include_usage")) if isinstance(opts, dict) else False
            resp = await _stream(request, req, queue, chat, head, usage)
        else:
            resp = await _whole(req, queue, chat, head)
        finished = True
        return resp
    finally:
        if not finished:  # disconnect or cancellation: stop generating for nobody
            sim.abort(req)


async def completions(request: web.Request) -> web.StreamResponse:
    """POST /v1/completions."""
    return await _generate(request, chat=False)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    """POST /v1/chat/completions."""
    return await _generate(request, chat=True)


async def models(request: web.Request) -> web.Response:
    """GET /v1/models: the one served model, as vLLM lists it."""
    cfg = request.app[SIM_KEY].cfg
    card = {
        "id": cfg.served_name,
        "object": "model",
        "created": int(time.time()),
        "owned_by": "vllm",
        "root": cfg.model,
        "parent": None,
        "max_model_len": cfg.max_model_len,
        "permission": [],
    }
    return web.json_response({"object": "list", "data": [card]})


async def health(request: web.Request) -> web.Response:
    """GET /health: 200 with an empty body, like vLLM."""
    return web.Response(status=200)


async def metrics(request: web.Request) -> web.Response:
    """GET /metrics: Prometheus text format from the engine's own registry."""
    sim = request.app[SIM_KEY]
    sim.metrics.set_gauges(sim.engine)
    body = generate_latest(sim.metrics.registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def admin_reality(request: web.Request) -> web.Response:
    """GET/POST /admin/reality: read or set the truth model's reality factor (> 0)."""
    sim = request.app[SIM_KEY]
    if request.method == "POST":
        try:
            value = float((await request.json())["reality_factor"])
        except (KeyError, TypeError, ValueError) as err:
            return _error(f'expected {{"reality_factor": <number>}}: {err}', 400)
        if not math.isfinite(value) or value <= 0:
            return _error("reality_factor must be a positive number", 400)
        sim.truth.reality_factor = value
    return web.json_response({"reality_factor": sim.truth.reality_factor})


async def admin_state(request: web.Request) -> web.Response:
    """GET /admin/state: engine gauges and counters as JSON."""
    return web.json_response(request.app[SIM_KEY].state())


async def _drain(app: web.Application) -> None:
    """On shutdown (SIGTERM; the server has stopped listening): let the requests in
    flight finish for ``DRAIN_KEY`` seconds, then cut the rest, as vLLM's
    ``--shutdown-timeout`` does (0, vLLM's default, cuts them at once)."""
    tasks = {t for t in app[INFLIGHT_KEY] if not t.done()}
    if not tasks:
        return
    pending = tasks
    if app[DRAIN_KEY] > 0:
        _, pending = await asyncio.wait(tasks, timeout=app[DRAIN_KEY])
    for task in pending:
        task.cancel()


def build_app(cfg: EngineSimConfig, shutdown_timeout_s: float = 0.0) -> web.Application:
    """The aiohttp application; the engine loop starts and stops with it."""
    app = web.Application()
    app[SIM_KEY] = EngineSim(cfg)
    app[INFLIGHT_KEY] = set()
    app[DRAIN_KEY] = shutdown_timeout_s
    app.on_shutdown.append(_drain)

    async def engine_loop(app: web.Application) -> AsyncIterator[None]:
        task = asyncio.create_task(app[SIM_KEY].run())
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    app.cleanup_ctx.append(engine_loop)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    app.router.add_route("*", "/admin/reality", admin_reality)
    app.router.add_get("/admin/state", admin_state)
    return app


def add_arguments(p: argparse.ArgumentParser) -> None:
    """engine-sim's flags (shared by ``rooftop engine-sim`` and ``python -m``)."""
    d = EngineSimConfig()
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--model", default=d.model, help="catalog model id used for timing")
    p.add_argument("--model-name", default="", help="served model name (default: --model)")
    p.add_argument("--gpu", default=d.gpu, help="catalog GPU id used for timing")
    p.add_argument("--tp", type=int, default=d.tp, help="tensor-parallel size")
    p.add_argument("--weight-dtype", default=d.weight_dtype)
    p.add_argument("--kv-dtype", default=d.kv_dtype)
    p.add_argument("--max-num-seqs", type=int, default=d.max_num_seqs)
    p.add_argument("--max-num-batched-tokens", type=int, default=d.max_num_batched_tokens)
    p.add_argument("--max-model-len", type=int, default=d.max_model_len)
    p.add_argument("--gpu-memory-utilization", type=float, default=d.gpu_memory_utilization)
    p.add_argument(
        "--kv-capacity-tokens",
        type=int,
        default=0,
        help="override the KV cache size in tokens (0: from GPU memory)",
    )
    p.add_argument(
        "--reality-factor",
        type=float,
        default=d.reality_factor,
        help="multiply every step time (how far reality is from the fit)",
    )
    p.add_argument(
        "--noise",
        type=float,
        default=d.noise,
        help="lognormal sigma of per-step time noise (0: none)",
    )
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument(
        "--shutdown-timeout",
        type=int,
        default=0,
        help="seconds to finish in-flight requests after SIGTERM, refusing new ones "
        "(vLLM's flag; 0 aborts them, as vLLM does)",
    )
    p.add_argument(
        "--enable-prefix-caching",
        action=argparse.BooleanOptionalAction,
        default=d.enable_prefix_caching,
        help="cache prompt prefixes by block, as vLLM V1 does (default: on)",
    )
    p.add_argument(
        "--speculative-config",
        default="",
        help="vLLM's JSON: method (ngram, suffix; mtp, the model's own MTP layers; eagle3, "
        "draft_model: a drafter the catalog lists), num_speculative_tokens, "
        "num_speculative_tokens_per_batch_size",
    )
    p.add_argument(
        "--draft-catalog-model",
        default="",
        help="a draft_model drafter's shape (a catalog model) where the drafter catalog "
        "does not list it",
    )
    p.add_argument(
        "--draft-layers",
        type=int,
        default=0,
        help="an eagle3 head's decoder layers where the drafter catalog does not list it",
    )
    p.add_argument(
        "--draft-vocab-size",
        type=int,
        default=0,
        help="an eagle3 head's vocabulary (0: the model's) where the catalog does not list it",
    )
    p.add_argument(
        "--acceptance-rate",
        type=float,
        default=d.acceptance_rate,
        help="mean per-token acceptance of the drafts (requests draw theirs around it)",
    )
    p.add_argument(
        "--time-scale",
        type=float,
        default=d.time_scale,
        help="simulated seconds per wall second (>1 runs faster, for tests)",
    )


def config_from_args(args: argparse.Namespace) -> EngineSimConfig:
    """EngineSimConfig from parsed flags (names match field names); checks --port as well."""
    if not 1 <= args.port <= 65535:  # 0 would bind a random port the banner cannot name
        raise ValueError(f"--port: must be an integer from 1 to 65535, got {args.port}")
    fields = EngineSimConfig.__dataclass_fields__
    return EngineSimConfig(**{k: getattr(args, k) for k in fields if hasattr(args, k)})


def _message(err: Exception) -> str:
    """The error's text; a KeyError's str() would wrap it in quotes."""
    return str(err.args[0]) if isinstance(err, KeyError) and err.args else str(err)


def run(args: argparse.Namespace) -> int:
    """Serve until interrupted. Exit code 2 on a configuration error, 1 if it cannot listen."""
    try:
        drain_s = getattr(args, "shutdown_timeout", 0)
        if drain_s < 0:
            raise ValueError(f"--shutdown-timeout: must be >= 0 seconds, got {drain_s}")
        app = build_app(config_from_args(args), shutdown_timeout_s=drain_s)
    except (KeyError, ValueError) as err:
        print(f"engine-sim: {_message(err)}", file=sys.stderr)
        return exit_codes.BAD_INPUT
    sim = app[SIM_KEY]
    banner = (
        f"engine-sim: serving {sim.cfg.served_name!r} ({sim.cfg.model} on {sim.cfg.tp}x "
        f"{sim.cfg.gpu}, timing {sim.truth.fit_source}, KV {sim.engine.config.kv_capacity_tokens}"
        f" tokens) on http://{args.host}:{args.port}"
    )
    try:
        # aiohttp calls ``print`` once the socket is bound, so the banner never precedes
        # a "cannot listen" error
        # On SIGTERM aiohttp stops listening, runs _drain (on_shutdown) and only then
        # cancels the engine loop (cleanup_ctx); its own grace must not end the drain.
        web.run_app(
            app,
            host=args.host,
            port=args.port,
            shutdown_timeout=drain_s + 5,
            print=lambda _: print(banner, file=sys.stderr, flush=True),
        )
    except OSError as err:  # address in use, unknown host, no permission
        print(f"engine-sim: cannot listen on {args.host}:{args.port}: {err}", file=sys.stderr)
        return exit_codes.INFEASIBLE
    return exit_codes.OK


def register(subparsers: Any) -> None:
    """Add ``rooftop engine-sim`` (rooftop_cli.main: register(subparsers) sets func)."""
    p = subparsers.add_parser(
        "engine-sim",
        help="run a simulated vLLM server (OpenAI API, vLLM metrics)",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    add_arguments(p)
    p.set_defaults(func=run)
