"""docs/cli.md is generated from the argparse parsers; these tests keep the two in step."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from cli_process import ROOT, rooftop_env

from rooftop_cli import reference
from rooftop_cli.completion import parsers
from rooftop_cli.main import build_parser


def _reference(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "rooftop_cli.reference", *args]
    return subprocess.run(command, capture_output=True, text=True, env=rooftop_env(), cwd=ROOT,
                          timeout=300)  # fmt: skip


def test_the_committed_page_is_up_to_date() -> None:
    done = _reference("--check")
    assert done.returncode == 0, done.stderr


def test_check_fails_on_a_stale_page_and_says_how_to_fix_it(tmp_path: Path) -> None:
    page = tmp_path / "cli.md"
    page.write_text((ROOT / "docs" / "cli.md").read_text().replace("`--model-config`", "`--m`"))
    done = _reference("--check", "--output", str(page))
    assert done.returncode == 1 and "run `python -m rooftop_cli.reference`" in done.stderr
    assert reference.main(["--output", str(page)]) == 0
    assert reference.main(["--check", "--output", str(page)]) == 0
    assert page.read_text() == reference.render()


def test_every_command_and_option_is_on_the_page() -> None:
    page = (ROOT / "docs" / "cli.md").read_text()
    parser = build_parser([])
    for sub in list(parsers(parser))[1:]:
        name = sub.prog.removeprefix("rooftop ")
        assert f"## `rooftop {name}`" in page
        for action in sub._actions:
            if not isinstance(action, argparse._HelpAction):
                for option in action.option_strings:
                    assert f"`{option}`" in page, (name, option)


def test_the_page_is_in_the_site_navigation() -> None:
    assert "cli.md" in (ROOT / "mkdocs.yml").read_text()


def test_the_reference_page_lists_them() -> None:
    page = (ROOT / "docs" / "cli.md").read_text()
    assert "**Exit codes.**" in page and "- `130` interrupted (Ctrl-C)" in page
    assert "- `1` some target has no feasible plan (the reasons are printed)" in page
