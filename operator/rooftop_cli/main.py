"""The ``rooftop`` command: one entry point, subcommands registered by their modules.

Each subcommand module exposes ``register(subparsers)``, which adds its parser and
sets ``func`` to a callable taking the parsed namespace and returning an exit code.
Modules are imported lazily by name so that ``rooftop plan`` never pays for kopf.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# (subcommand, module that registers it). Order is the help order.
SUBCOMMANDS: tuple[tuple[str, str], ...] = (
    ("plan", "rooftop_cli.plan"),
    ("predict", "rooftop_cli.plan"),
    ("render", "rooftop_operator.render"),
    ("operator", "rooftop_operator.__main__"),
    ("engine-sim", "rooftop_sim.engine.server"),
    ("load", "rooftop_sim.loadgen"),
    ("simulate", "rooftop_sim.simulate"),
)


def build_parser(argv: Sequence[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rooftop",
        description="Serve LLMs to a latency SLO at the lowest cost.",
    )
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
    return parser


def _names() -> set[str]:
    return {name for name, _ in SUBCOMMANDS}


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(args_list)
    args = parser.parse_args(args_list)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
