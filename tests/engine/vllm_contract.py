"""Ask the real vLLM whether it accepts `vllm serve` command lines, without a GPU.

Run with the vLLM venv's python (tests/engine/install-vllm.sh). Reads a JSON list of
cases on stdin and prints one JSON list of results on stdout (vLLM's own logging goes to
stderr). A case::

    {"id": "...", "argv": [MODEL, "--flag", ...],   # what follows `vllm serve`
     "config": {...}}                                # optional: a config.json

With ``config``, the model argument (``argv[0]``) is replaced by a temporary directory
holding that config.json, so vLLM reads the model's shape, dtype and quantization from
it and fetches nothing. A result::

    {"id": "...", "verdict": "ok" | "refused" | "unchecked", "stage": "...",
     "message": "...", "dests": {...}}

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


def build_configs(args: argparse.Namespace) -> None:
    """Stages model, parallel and engine (see the module docstring)."""
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
        engine_args.create_engine_config()
    except Exception as exc:
        verdict = "unchecked" if _from_platform(exc) else "refused"
        raise Refused("engine", f"{type(exc).__name__}: {exc}", verdict) from None


def _parallel_config(engine_args: Any) -> Any:
    """The ParallelConfig fields that decide the model's split (no devices involved)."""
    from vllm.config import ParallelConfig

    return ParallelConfig(
        tensor_parallel_size=engine_args.tensor_parallel_size,
        pipeline_parallel_size=engine_args.pipeline_parallel_size,
        data_parallel_size=engine_args.data_parallel_size,
        enable_expert_parallel=engine_args.enable_expert_parallel,
    )


def run_case(
    root: argparse.ArgumentParser, serve: argparse.ArgumentParser, case: dict[str, Any]
) -> dict[str, Any]:
    result: dict[str, Any] = {"id": case["id"]}
    argv = list(case["argv"])
    with tempfile.TemporaryDirectory(prefix="rooftop-model-") as model_dir:
        if "config" in case:
            (Path(model_dir) / "config.json").write_text(json.dumps(case["config"]))
            argv[0] = model_dir
        try:
            args = parse(root, argv)
            result["dests"] = given_dests(serve, argv)
            if "config" in case:
                build_configs(args)
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
