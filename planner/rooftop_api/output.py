"""How the ``rooftop`` commands print results: ``-o json|yaml|table|wide``.

JSON and YAML are typed (numbers as numbers, booleans as booleans, NaN and infinity as
null). Tables are drawn with rich on a terminal and plain (no colour, no box drawing:
columns separated by spaces, a ``-`` for an empty cell) when standard output is not a
terminal or ``NO_COLOR`` is set, so ``| grep`` and ``| awk`` read them as kubectl's. On a
terminal a table fits its width: long cells wrap, never cut short, and a table whose
columns cannot stand side by side is printed one row to a block (``print_table``).
A ``--plot PATH`` (``rooftop plan``, ``rooftop simulate``) is checked here before any work.
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import json
import math
import os
import shutil
import sys
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TextIO

import yaml

JSON, YAML, TABLE, WIDE, TEXT = "json", "yaml", "table", "wide", "text"
# A cell: what a table shows; None shows as "-".
Cell = str | int | float | bool | None
# What matplotlib's Agg backend writes, by file suffix.
PLOT_SUFFIXES = (".png", ".pdf", ".svg", ".jpg", ".jpeg")


def add_output_option(
    parser: argparse.ArgumentParser,
    formats: Sequence[str],
    default: str | None,
    json_alias: bool = False,
    note: str = "",
) -> None:
    """``-o/--output FORMAT`` (and ``--json``, the same as ``-o json``, refused beside
    ``-o``). ``note``: said in the help instead of the default."""
    said = ", ".join(f"{f} (a table with more columns)" if f == WIDE else f for f in formats)
    note = note or (f"default {default}" if default else "")
    # --json and -o both set the format: given together, argparse refuses the pair
    # rather than keep whichever came last.
    group = parser.add_mutually_exclusive_group() if json_alias else parser
    group.add_argument(
        "-o",
        "--output",
        choices=formats,
        default=default,
        metavar="FORMAT",
        help=f"{said}; {note}" if note else said,
    )
    if json_alias:
        group.add_argument(
            "--json",
            dest="output",
            action="store_const",
            const=JSON,
            help="same as -o json (not with -o)",
        )


def plain(value: object) -> object:
    """``value`` as JSON/YAML can hold it: tuples as lists, numpy scalars as numbers,
    NaN and infinity as None."""
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    item = getattr(value, "item", None)  # a numpy scalar
    if callable(item) and not isinstance(value, str | bytes):
        value = item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def dumps(data: object, fmt: str) -> str:
    """``data`` as JSON (indented) or YAML text, without a trailing newline."""
    if fmt == YAML:
        return yaml.safe_dump(plain(data), sort_keys=False, width=100).rstrip("\n")
    return json.dumps(plain(data), indent=2)


def is_plain(stream: TextIO) -> bool:
    """Whether a table on ``stream`` is drawn plain: not a terminal, or NO_COLOR set."""
    return bool(os.environ.get("NO_COLOR")) or not stream.isatty()


def _cell(value: object) -> str:
    value = plain(value)
    if value is None or value == "":
        return "-"
    if isinstance(value, bool):
        return "true" if value else "false"
    return f"{value:g}" if isinstance(value, float) else str(value)


def format_table(
    headers: Sequence[str], rows: Sequence[Sequence[object]], width: int | None = None
) -> str:
    """The table as text: with ``width`` (a terminal's), rich's box and colours in that
    width, long cells wrapped within their column; without, plain columns that never
    wrap. (``fitted_widths`` says whether the columns fit ``width`` side by side.)"""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    styled = width is not None
    widths = fitted_widths(headers, rows, width) if width is not None else None
    table = Table(
        box=box.SIMPLE_HEAD if styled else None,
        header_style="bold" if styled else "",
        pad_edge=styled,
        padding=(0, 1) if styled else (0, 3, 0, 0),
    )
    for i, header in enumerate(headers):
        # rich's own squeezing ignores a column's minimum and cuts cells with an
        # ellipsis: the widths are set here instead, and a long cell wraps within its own
        table.add_column(
            header, no_wrap=not styled, overflow="fold", width=widths[i] if widths else None
        )
    for row in rows:
        table.add_row(*(_cell(v) for v in row))
    buffer = io.StringIO()
    console = Console(
        file=buffer,
        width=width or 10_000,
        no_color=not styled,
        force_terminal=styled,
        color_system="auto" if styled else None,
        highlight=False,
    )
    console.print(table)
    return "\n".join(line.rstrip() for line in buffer.getvalue().splitlines()).strip("\n")


def fitted_widths(
    headers: Sequence[str], rows: Sequence[Sequence[object]], width: int
) -> list[int] | None:
    """Each column's width in a drawn table ``width`` wide: as wide as its widest cell,
    less for the widest columns where the table would not fit, never narrower than its
    header; None when even the headers cannot stand side by side."""
    wanted = [max([len(h), *(len(_cell(r[i])) for r in rows)]) for i, h in enumerate(headers)]
    room = width - 3 * len(headers) - 1  # a space each side of a cell, one between two
    if sum(len(h) for h in headers) > room:
        return None
    while sum(wanted) > room:  # narrow the widest column that can be, one at a time
        i = max((i for i, h in enumerate(headers) if wanted[i] > len(h)), key=wanted.__getitem__)
        wanted[i] -= 1
    return wanted


def format_records(headers: Sequence[str], rows: Sequence[Sequence[object]], width: int) -> str:
    """The table one row to a block, a ``HEADER  value`` line per column, for a terminal
    too narrow for its columns side by side: every cell in full, wrapped at ``width``."""
    indent = max(len(h) for h in headers) + 2
    blocks = []
    for row in rows:
        lines = []
        for header, value in zip(headers, row, strict=True):
            cell = _cell(value)
            parts = textwrap.wrap(cell, max(width - indent, 8), break_on_hyphens=False) or [cell]
            lines.append(f"{header:<{indent}}{parts[0]}")
            lines += [" " * indent + part for part in parts[1:]]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def print_table(
    headers: Sequence[str], rows: Sequence[Sequence[object]], stream: TextIO | None = None
) -> None:
    """Print the table to ``stream`` (stdout), plain unless it is a colour terminal.

    On a terminal the table fits its width (``COLUMNS``, else the terminal's): a long cell
    wraps within its column, and a table whose headers are wider than the terminal is
    printed one row to a block. Nothing is cut short; piped, rows never wrap.
    """
    out = stream or sys.stdout
    if is_plain(out):
        print(format_table(headers, rows), file=out)
        return
    width = shutil.get_terminal_size().columns
    if fitted_widths(headers, rows, width) is None:
        print(format_records(headers, rows, width), file=out)
    else:
        print(format_table(headers, rows, width), file=out)


def plot_path_problem(path: str) -> str:
    """Why ``--plot PATH`` cannot be written, else "": checked before any work is done,
    so a typo does not cost the user a whole run."""
    target = Path(path)
    if importlib.util.find_spec("matplotlib") is None:
        return f"--plot {path}: drawing needs matplotlib; pip install 'rooftop[plot]'"
    if target.suffix.lower() not in PLOT_SUFFIXES:
        return f"--plot {path}: the file name must end in one of {', '.join(PLOT_SUFFIXES)}"
    if not target.parent.is_dir():
        return f"--plot {path}: folder {target.parent} does not exist; create it first"
    if target.is_dir():
        return f"--plot {path}: is a folder; give a file name"
    return ""
