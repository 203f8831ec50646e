"""Exit codes are defined once (rooftop_api.exit_codes): no command returns a bare number,
so the operator, the simulator and the CLI's documented table cannot drift apart."""

from __future__ import annotations

import ast
from pathlib import Path

from rooftop_api import exit_codes
from rooftop_cli import exits

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = [p for base in ("planner", "operator") for p in (ROOT / base).glob("rooftop_*")]
# Shipped into engine pods as a standalone file (standard library only).
STANDALONE = {ROOT / "operator" / "rooftop_operator" / "engine_drain.py"}
CODES = {exit_codes.OK, exit_codes.INFEASIBLE, exit_codes.BAD_INPUT}


def _literal_exit_returns(path: Path) -> list[str]:
    """``file:line`` of each ``return <0|1|2>`` in a function that returns an exit code
    (annotated ``-> int`` and named main or run, or taking the CLI's ``args``)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if (
            not isinstance(node, ast.FunctionDef)
            or ast.unparse(node.returns or ast.Pass()) != "int"
        ):
            continue
        params = [a.arg for a in node.args.args]
        if node.name not in ("main", "run") and params != ["args"]:
            continue
        for inner in ast.walk(node):
            value = getattr(inner, "value", None) if isinstance(inner, ast.Return) else None
            if isinstance(value, ast.Constant) and value.value in CODES:
                found.append(f"{path.relative_to(ROOT)}:{inner.lineno}")
    return found


def test_no_command_returns_a_bare_exit_code() -> None:
    files = [f for pkg in PACKAGES for f in pkg.rglob("*.py") if f not in STANDALONE]
    assert [hit for f in files for hit in _literal_exit_returns(f)] == []


def test_the_cli_documents_the_numbers_it_returns() -> None:
    documented = {code for codes in exits.CODES.values() for code, _ in codes}
    assert documented == CODES
    assert exits.INTERRUPTED == exit_codes.INTERRUPTED == 130
