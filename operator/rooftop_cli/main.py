"""The ``rooftop`` command: one entry point, subcommands registered by their modules.

Each subcommand module exposes ``register(subparsers)``, which adds its parser and
sets ``func`` to a callable taking the parsed namespace and returning an exit code.
Modules are imported lazily by name so that ``rooftop plan`` never pays for kopf. Every
subcommand's help ends with its exit codes (``rooftop_cli.exits``); common to all: 141
(128 + SIGPIPE) when whoever reads stdout stops reading (``rooftop plan X --explain |
head -1``) and 130 (128 + SIGINT) on Ctrl-C, both quietly, without a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from importlib import metadata

from rooftop_api import exit_codes
from rooftop_cli import exits

# (subcommand, module that registers it). Order is the help order.
SUBCOMMANDS: tuple[tuple[str, str], ...] = (
    ("plan", "rooftop_cli.plan"),
    ("predict", "rooftop_cli.predict"),
    ("render", "rooftop_operator.render"),
    ("operator", "rooftop_operator.__main__"),
    ("engine-sim", "rooftop_sim.engine.server"),
    ("load", "rooftop_sim.loadgen"),
    ("simulate", "rooftop_sim.simulate"),
    ("completion", "rooftop_cli.completion"),
)


def version() -> str:
    """The installed package's version (the planner's own when not installed)."""
    try:
        return metadata.version("rooftop")
    except metadata.PackageNotFoundError:
        from rooftop_planner import __version__

        return __version__


def build_parser(argv: Sequence[str]) -> argparse.ArgumentParser:
    """The parser, with only the subcommand ``argv`` names registered (all without one)."""
    parser = argparse.ArgumentParser(
        prog="rooftop",
        description="Serve LLMs to a latency SLO at the lowest cost.",
        epilog=exits.TOP_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"rooftop {version()}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    wanted = argv[0] if argv else None
    seen: set[str] = set()
    for name, module_name in SUBCOMMANDS:
        if module_name in seen or (wanted in _names() and wanted != name):
            continue
        seen.add(module_name)
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as err:  # a subcommand whose module is absent
            if wanted == name:
                raise SystemExit(f"rooftop {name}: not available ({err})") from err
            continue
        module.register(subparsers)
    for name, sub in subparsers.choices.items():
        sub.epilog = exits.epilog(name)
        sub.formatter_class = argparse.RawDescriptionHelpFormatter
    return parser


def _names() -> set[str]:
    return {name for name, _ in SUBCOMMANDS}


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``rooftop ARGV``; its exit code. A closed stdout or Ctrl-C ends quietly."""
    try:
        code = _dispatch(list(sys.argv[1:] if argv is None else argv))
        sys.stdout.flush()  # here, so that a reader gone by now is a broken pipe we catch
    except BrokenPipeError:
        _silence_stdout()
        return exit_codes.BROKEN_PIPE
    except KeyboardInterrupt:
        return exit_codes.INTERRUPTED
    return code


def _dispatch(args_list: list[str]) -> int:
    parser = build_parser(args_list)
    args = parser.parse_args(args_list)
    if not getattr(args, "func", None):
        parser.print_help()
        return exit_codes.BAD_INPUT
    code: int = args.func(args)
    return code


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's final flush of what is still
    buffered does not raise again (the recipe of Python's ``signal`` documentation)."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # replaced by a stream without a file
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - lives until exit
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


if __name__ == "__main__":
    sys.exit(main())
