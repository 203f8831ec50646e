"""Write the `vllm serve` flag table (planner/rooftop_api/vllm_flags.json).

Run with the real vLLM's python (`make vllm-flags`, which gets it from
tests/engine/install-vllm.sh):

    PY=$(tests/engine/install-vllm.sh) && $PY tests/engine/dump_vllm_flags.py [OUTPUT]

Why a table: the operator image has no vLLM, yet the planner must check a target's
``spec.engine.extraArgs`` the way `vllm serve` will parse them (rooftop_api.vllm_args).
So this script walks the parser vLLM itself builds for `vllm serve` and records, per
argparse action: its option strings, the dest it sets, how many values it takes, where
argparse checks them its choices with the conversion the action's `type` applies before
the check, and whether a value must be a number. Output is sorted and stable, so a
regenerated table diffs only where vLLM did. ``-`` as OUTPUT writes to stdout (the
staleness test compares that with the packaged file).
"""

from __future__ import annotations

import argparse
import importlib
import json
import platform
import sys
from pathlib import Path
from typing import Any

DEFAULT_OUTPUT = Path(__file__).resolve().parents[2] / "planner/rooftop_api/vllm_flags.json"
GENERATED_BY = (
    "tests/engine/dump_vllm_flags.py (make vllm-flags) from the `vllm serve` argument "
    "parser of the real vLLM; do not edit by hand"
)


# Where `vllm serve`'s parser and its post-parse checks live, newest layout first: vLLM
# 0.33 moved them from the launchers package to entrypoints/common. The harness runs on
# either, so moving the pinned engine forward (install-vllm.sh) is one change.
SERVE_CLI_MODULES = ("vllm.entrypoints.common.cli_args", "vllm.entrypoints.launchers.cli_args")


def serve_cli_args() -> Any:
    """vLLM's module with ``make_arg_parser`` and ``validate_parsed_serve_args``."""
    for name in SERVE_CLI_MODULES:
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name is None or not name.startswith(exc.name):
                raise  # the module exists but an import inside it failed: say so
    raise ModuleNotFoundError(f"none of {', '.join(SERVE_CLI_MODULES)} in this vLLM")


def parsers() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    """(root, serve): `vllm`'s parser, whose parse_args rewrites the command line
    (FlexibleArgumentParser), and the `serve` subparser that owns the actions
    (vllm/entrypoints/cli/serve.py)."""
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    root = FlexibleArgumentParser(prog="vllm")
    sub = root.add_subparsers(dest="subparser")
    serve: argparse.ArgumentParser = serve_cli_args().make_arg_parser(sub.add_parser("serve"))
    return root, serve


def _nargs(action: argparse.Action) -> int | str | None:
    """None: exactly one value; 0: a switch; "?", "+", "*" or a count as argparse."""
    nargs = action.nargs
    if isinstance(nargs, int | str) or nargs is None:
        return nargs
    raise TypeError(f"{action.option_strings}: unexpected nargs {nargs!r}")


def _conversion(action: argparse.Action) -> list[str] | None:
    """The steps ``action.type`` applies to a value before argparse checks its choices,
    found by probing it; None where the type does something this table cannot describe
    (the checker then leaves the choices alone rather than guess)."""
    convert = action.type
    if convert is None or convert is str:
        return []
    if convert is int:
        return ["int"]
    steps: list[str] = []
    try:
        if convert("None") is None and convert("") is None:
            steps.append("none")  # vLLM's optional_type: "None" and "" mean None
        lowered = convert("Ab-C")
    except Exception:
        return None
    if lowered == "ab_c":
        return [*steps, "lower_dash"]
    return steps if lowered == "Ab-C" else None


def _converts(convert: Any, text: str) -> tuple[bool, Any]:
    """(whether ``convert`` accepts ``text``, what it returns)."""
    try:
        return True, convert(text)
    except Exception:
        return False, None


def _value_type(action: argparse.Action) -> dict[str, str]:
    """The number a value must be, found by probing the action's type: "int", "float",
    "human_int" (vLLM's 8k / 2M / 1G suffixes) or "human_int_or_auto" (also "auto");
    nothing for strings, JSON and anything else (vLLM's own error covers those)."""
    convert = action.type
    if convert is None or action.nargs == 0:
        return {}
    texts = ("7", "1.5", "abc", "8k", "auto", "{}")
    probes = {text: _converts(convert, text) for text in texts}
    if probes["abc"][0] or probes["{}"][0] or not probes["7"][0]:
        return {}  # any string, or JSON (which takes numbers too)
    if probes["8k"] == (True, 8000):
        return {"type": "human_int_or_auto" if probes["auto"] == (True, -1) else "human_int"}
    if type(probes["7"][1]) is int and not probes["1.5"][0]:
        return {"type": "int"}
    if probes["1.5"] == (True, 1.5):
        return {"type": "float"}
    return {}


def _choices(action: argparse.Action) -> dict[str, Any]:
    if action.choices is None:
        return {}
    conversion = _conversion(action)
    if conversion is None:
        return {"choices_unchecked": True}
    choices = [c if c is None or isinstance(c, int) else str(c) for c in action.choices]
    return {"choices": sorted(choices, key=str), "convert": conversion}


def registered_options(parser: argparse.ArgumentParser, action: argparse.Action) -> list[str]:
    """Every option string the parser recognises for ``action``: its own and those it
    registered but hides from help (vLLM 0.33 keeps ``--no-enable-x`` working beside
    ``--disable-x`` that way), which argparse's prefix matching also sees."""
    registered = parser._option_string_actions.items()
    return sorted({*action.option_strings, *(s for s, a in registered if a is action)})


def describe(parser: argparse.ArgumentParser, action: argparse.Action) -> dict[str, Any]:
    return {
        "options": registered_options(parser, action),
        "dest": action.dest,
        "nargs": _nargs(action),
        **_choices(action),
        **_value_type(action),
    }


def table(parser: argparse.ArgumentParser) -> dict[str, Any]:
    import vllm

    flags = [describe(parser, a) for a in parser._actions if a.option_strings]
    positionals = [describe(parser, a) for a in parser._actions if not a.option_strings]
    positionals = [{k: v for k, v in p.items() if k != "options"} for p in positionals]
    return {
        "generated_by": GENERATED_BY,
        "vllm_version": vllm.__version__,
        # argparse's prefix and short-option rules are the interpreter's own
        "python": ".".join(platform.python_version_tuple()[:2]),
        "allow_abbrev": parser.allow_abbrev,
        "positionals": positionals,
        "flags": sorted(flags, key=lambda f: (f["dest"], f["options"])),
    }


def render(data: dict[str, Any]) -> str:
    """JSON with the header first and one line per flag, so a diff shows one flag a line."""
    lines = [f" {json.dumps(k)}: {json.dumps(v)}," for k, v in data.items() if k != "flags"]
    flags = ",\n".join(f"  {json.dumps(f, sort_keys=True)}" for f in data["flags"])
    return "{\n" + "\n".join(lines) + '\n "flags": [\n' + flags + "\n ]\n}\n"


def main(argv: list[str]) -> int:
    output = argv[1] if len(argv) > 1 else str(DEFAULT_OUTPUT)
    text = render(table(parsers()[1]))
    if output == "-":
        sys.stdout.write(text)
    else:
        Path(output).write_text(text)
        print(output, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
