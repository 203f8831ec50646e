"""Ask the real vLLM whether it accepts `vllm serve` command lines, without a GPU.

Run with the vLLM venv's python (tests/engine/install-vllm.sh). Reads a JSON list of
cases on stdin and prints one JSON list of results on stdout (vLLM's own logging goes to
stderr). A case::

    {"id": "...", "argv": [MODEL, "--flag", ...],   # what follows `vllm serve`
     "config": {...},                                # optional: a config.json
     "drafts": {NAME: {...}, ...}}                   # optional: drafts' config.json

With ``config``, the model argument (``argv[0]``) is replaced by a temporary directory
holding that config.json, so vLLM reads the model's shape, dtype and quantization from
it and fetches nothing. Each of ``drafts`` gets a directory the same way (its name keeps
NAME, as vLLM guesses an EAGLE method from the path), and a ``"model": NAME`` inside a
``--speculative-config`` JSON value (``--speculative-config JSON``, ``=JSON``, or ``-sc``)
becomes that directory. A draft model the case does not list is looked up on the Hugging
Face hub, offline: refused ("Invalid repository ID or local directory"). A result::

    {"id": "...", "verdict": "ok" | "refused" | "unchecked", "stage": "...",
     "message": "...", "dests": {...},
     "speculative": {...}}  # where "ok" with --speculative-config: what vLLM built

What is checked, in the order `vllm serve` does it (vllm/entrypoints/cli/serve.py and
AsyncLLM's start-up), each stage only if the one before passed:

1. ``parse``: the serve parser (FlexibleArgumentParser: prefixes, choices, dotted JSON
   arguments) and ``validate_parsed_serve_args``. ``dests`` lists what the command line
   sets (the flag checker's tests compare it with rooftop_api.vllm_args).
   Cases without ``config`` stop here.
2. ``model``: ``EngineArgs.from_cli_args(...).create_model_config()``: the config.json is
   loaded; dtype, max-model-len against the model's context and the quantization method
   against the checkpoint's ``quantization_config`` are verified. Platform-independent
   on CPU and CUDA alike (neither platform restricts quantization methods here).
3. ``parallel``: ``ModelConfig.verify_with_parallel_config`` with a ParallelConfig of
   the engine args' TP/PP/DP (attention heads divisible by TP, pipeline support).
4. ``engine``: ``create_engine_config()`` itself: cache config (KV cache dtype), the
   quantization config read from the checkpoint (a ``--quantization`` whose config the
   checkpoint lacks is refused here), scheduler and compilation configs. On this CPU
   build it runs the CPU platform's adjustments, not CUDA's, so a failure raised from
   ``vllm/platforms`` or naming the CPU, the current platform or a compute capability is
   reported as ``unchecked`` (cannot check without a GPU); anything else as ``refused``.
   With ``--speculative-config``, this stage builds vLLM's SpeculativeConfig, then runs
   the check of ``num_speculative_tokens_per_batch_size`` that the engine core's
   Scheduler makes at start-up (``build_dynamic_sd_schedule_lookup``, with
   ``--max-num-seqs``), as the engine config leaves the schedule unchecked.

Speculative decoding, checked: the method (ngram, draft_model, eagle3, ...), given or
guessed from the draft's path; ``num_speculative_tokens`` > 0; the ngram window
(``prompt_lookup_min`` <= ``prompt_lookup_max``); unknown keys (``tensor_parallel_size``
instead of ``draft_tensor_parallel_size``); ``draft_tensor_parallel_size`` 1 or the
target's TP; the draft's config.json (``model_type``, an architecture vLLM registers,
which for eagle3 is the head's own, e.g. ``LlamaForCausalLMEagle3``, or ``Eagle3`` +
the target's, hidden size a multiple of the heads, heads divisible by the draft's TP); a
draft_model's vocab_size equal to the target's; the schedule's ranges (three integers
each, positive, start <= end, sorted without overlap, first starting at 1, K >= 0; K
above ``num_speculative_tokens`` is clamped, and with DP > 1 vLLM drops the schedule).
NOT checked for speculation: whether an EAGLE head fits its target (hidden size, vocab,
``draft_vocab_size``, layer count are read when the weights load), a draft's context
shorter than ``--max-model-len`` (vLLM raises an EAGLE head's max_position_embeddings to
it and caps a draft's length at the target's), the tokenizer, the draft's weights and
its KV cache and the acceptance rate.

NOT checked (needs a GPU or the weights): CUDA's own platform hooks, the kernels and
attention backends a GPU's compute capability allows (NVFP4 needs Blackwell, fp8 KV
needs SM89+ with some backends, a bfloat16 KV cache for a float16 model is accepted by
the configs and left to the attention backend), weight loading (shapes, tokenizer) and
the memory profile (whether the planned KV cache fits).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

# a sibling script: run as one (as the vLLM venv's python does), its folder is on sys.path
from dump_vllm_flags import parsers, serve_cli_args

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never fetch: the config is local
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

# A message that means the platform (this CPU), not the configuration, refused. Not
# bare "cuda" or "gpu": vLLM's refusals of a configuration mention them too (e.g. the
# max-model-len one warns of "a CUDA array out-of-bounds error").
PLATFORM_MESSAGE = re.compile(
    r"\bcpu\b|current platform|compute capability|device capability", re.IGNORECASE
)


class Refused(Exception):
    def __init__(self, stage: str, message: str, verdict: str = "refused") -> None:
        super().__init__(message)
        self.stage, self.message, self.verdict = stage, message, verdict


def parse(root: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """Parse as `vllm serve` does; argparse's exit (and its message) becomes Refused."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            args = root.parse_args(["serve", *argv])
        serve_cli_args().validate_parsed_serve_args(args)
    except SystemExit as exc:  # argparse's error (its message on stderr), or --help
        lines = err.getvalue().strip().splitlines() or [f"exit {exc.code}"]
        raise Refused("parse", lines[-1]) from None
    except Exception as exc:  # vLLM's own pre-checks raise ValueError/TypeError
        raise Refused("parse", f"{type(exc).__name__}: {exc}") from None
    if getattr(args, "model_tag", None) is not None:
        args.model = args.model_tag  # what `vllm serve`'s cmd does first
    return args


class _Unset:
    """Stands for "not on the command line" in a namespace argparse fills."""


# Actions that add to the value already there (a list, a count): a marker would break
# them, so for these a dest counts as given when its value differs from the default.
_ACCUMULATING = (argparse._AppendAction, argparse._AppendConstAction, argparse._CountAction)


def given_dests(serve: argparse.ArgumentParser, argv: list[str]) -> dict[str, Any]:
    """Dests the command line sets, with their values (JSON-safe reprs), even to the
    default (``--disable-log-requests`` where logging is off by default): argparse writes a
    default only where the namespace lacks the attribute, so a namespace holding a marker
    for each dest keeps the marker wherever the command line was silent."""
    unset = _Unset()
    actions = [a for a in serve._actions if a.dest not in ("help", "subparser")]
    marked = {a.dest for a in actions if not isinstance(a, _ACCUMULATING)}
    args = serve.parse_args(argv, namespace=argparse.Namespace(**dict.fromkeys(marked, unset)))
    out: dict[str, Any] = {}
    for action in actions:
        value = getattr(args, action.dest, unset)
        defaulted = action.dest not in marked and value == action.default
        if value is unset or value is None or defaulted:
            continue
        out[action.dest] = value if isinstance(value, int | float | str | bool) else repr(value)
    return out


def _from_platform(exc: BaseException) -> bool:
    """Whether a failure is this CPU platform's doing: raised inside vllm/platforms, or
    its message names the device."""
    frames = traceback.extract_tb(exc.__traceback__)
    if any(f"{os.sep}vllm{os.sep}platforms{os.sep}" in frame.filename for frame in frames):
        return True
    return PLATFORM_MESSAGE.search(str(exc)) is not None


def build_configs(args: argparse.Namespace) -> Any:
    """Stages model, parallel and engine (see the module docstring): the VllmConfig."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    engine_args = AsyncEngineArgs.from_cli_args(args)
    try:
        model_config = engine_args.create_model_config()
    except Exception as exc:
        raise Refused("model", f"{type(exc).__name__}: {exc}") from None
    try:
        parallel = _parallel_config(engine_args)
        model_config.verify_with_parallel_config(parallel)
    except Exception as exc:
        raise Refused("parallel", f"{type(exc).__name__}: {exc}") from None
    try:
        vllm_config = engine_args.create_engine_config()
        _check_speculative_schedule(vllm_config)
    except Exception as exc:
        verdict = "unchecked" if _from_platform(exc) else "refused"
        raise Refused("engine", f"{type(exc).__name__}: {exc}", verdict) from None
    return vllm_config


def _check_speculative_schedule(vllm_config: Any) -> None:
    """What the engine core's Scheduler checks of ``num_speculative_tokens_per_batch_size``
    at start-up (vllm/v1/core/sched/scheduler.py), on the config it is handed: the
    engine config does not validate the schedule (and drops it where DP > 1)."""
    spec = vllm_config.speculative_config
    if spec is None or not spec.num_speculative_tokens_per_batch_size:
        return
    from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup

    build_dynamic_sd_schedule_lookup(
        spec.num_speculative_tokens_per_batch_size,
        vllm_max_batch_size=vllm_config.scheduler_config.max_num_seqs,
        vllm_num_speculative_tokens=vllm_config.num_speculative_tokens,
    )


def speculative_summary(vllm_config: Any) -> dict[str, Any] | None:
    """What vLLM made of ``--speculative-config`` (JSON-safe), or None without it."""
    spec = vllm_config.speculative_config
    if spec is None:
        return None
    summary: dict[str, Any] = {
        "method": spec.method,
        "num_speculative_tokens": spec.num_speculative_tokens,
        "schedule": [list(entry) for entry in spec.num_speculative_tokens_per_batch_size or []],
    }
    draft = spec.draft_model_config
    if draft is not None and draft is not spec.target_model_config:  # ngram reuses it
        summary |= {
            "draft_architecture": draft.architecture,
            "draft_tensor_parallel_size": spec.draft_tensor_parallel_size,
        }
    return summary


def _parallel_config(engine_args: Any) -> Any:
    """The ParallelConfig fields that decide the model's split (no devices involved)."""
    from vllm.config import ParallelConfig

    return ParallelConfig(
        tensor_parallel_size=engine_args.tensor_parallel_size,
        pipeline_parallel_size=engine_args.pipeline_parallel_size,
        data_parallel_size=engine_args.data_parallel_size,
        enable_expert_parallel=engine_args.enable_expert_parallel,
    )


def _model_dir(stack: contextlib.ExitStack, name: str, config: dict[str, Any]) -> str:
    """A temporary directory holding ``config`` as its config.json, removed with
    ``stack``. Its name keeps ``name`` (``/`` as ``--``): vLLM guesses a speculative
    method from the draft's path ("eagle3" in it) where the config names none."""
    label = re.sub(r"[^A-Za-z0-9._-]", "-", name.replace("/", "--"))
    path = stack.enter_context(tempfile.TemporaryDirectory(prefix=f"rooftop-{label}-"))
    (Path(path) / "config.json").write_text(json.dumps(config))
    return path


SPECULATIVE_FLAGS = ("--speculative-config", "-sc")


def with_draft_paths(argv: list[str], drafts: dict[str, str]) -> list[str]:
    """``argv`` with each ``"model"`` in a ``--speculative-config`` JSON value (``FLAG
    JSON`` or ``FLAG=JSON``) that names a key of ``drafts`` replaced by its path. A
    value that is not a JSON object is left for the parser to refuse."""

    def swap(value: str) -> str:
        try:
            spec = json.loads(value)
        except ValueError:
            return value
        if not isinstance(spec, dict) or not isinstance(spec.get("model"), str):
            return value
        if spec["model"] not in drafts:
            return value
        return json.dumps({**spec, "model": drafts[spec["model"]]})

    out = list(argv)
    for i, arg in enumerate(out):
        flag, eq, value = arg.partition("=")
        if flag not in SPECULATIVE_FLAGS:
            continue
        if eq:
            out[i] = f"{flag}={swap(value)}"
        elif i + 1 < len(out):
            out[i + 1] = swap(out[i + 1])
    return out


def run_case(
    root: argparse.ArgumentParser, serve: argparse.ArgumentParser, case: dict[str, Any]
) -> dict[str, Any]:
    result: dict[str, Any] = {"id": case["id"]}
    argv = list(case["argv"])
    with contextlib.ExitStack() as stack:
        if "config" in case:
            argv[0] = _model_dir(stack, "model", case["config"])
        drafts = {
            name: _model_dir(stack, f"draft-{name}", config)
            for name, config in case.get("drafts", {}).items()
        }
        argv = with_draft_paths(argv, drafts)
        try:
            args = parse(root, argv)
            result["dests"] = given_dests(serve, argv)
            if "config" in case:
                speculative = speculative_summary(build_configs(args))
                if speculative is not None:
                    result["speculative"] = speculative
        except Refused as refused:
            return {**result, "verdict": refused.verdict, "stage": refused.stage,
                    "message": refused.message}  # fmt: skip
    return {**result, "verdict": "ok", "stage": "engine" if "config" in case else "parse"}


def main() -> int:
    cases = json.load(sys.stdin)
    root, serve = parsers()
    results = []
    for case in cases:
        with contextlib.redirect_stdout(sys.stderr):  # vLLM prints; stdout is ours
            results.append(run_case(root, serve, case))
    json.dump(results, sys.stdout, indent=1, default=repr)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
