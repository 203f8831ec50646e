"""Where modules meet, types are named: no bare ``Any`` in a signature another module calls.

mypy's strict mode accepts ``Any`` wherever it is written; this test keeps it out of the
seams. A function, method or dataclass field is a seam when another module imports it
(or imports its module). A bare ``Any`` (``x: Any``, ``-> Any``, ``Any | None``) there is a
failure; ``Any`` inside a container (``Mapping[str, Any]``: a JSON object) is allowed.
Across packages nothing is exempt; inside one package, the few values whose type really
is "whatever the library hands us" are listed below with the reason.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {
    "rooftop_api": "planner",
    "rooftop_planner": "planner",
    "rooftop_control": "operator",
    "rooftop_operator": "operator",
    "rooftop_sim": "operator",
    "rooftop_cli": "operator",
    "rooftop_fit": "planner",
}
# module.name: why its Any stays (only within its own package)
WITHIN_PACKAGE_EXEMPT = {
    "rooftop_operator.runtime.runtime": "kopf's Memo is untyped: this is where it is typed",
    "rooftop_operator.reconcile.is_subset": "compares two arbitrary JSON values",
    "rooftop_operator.kube.Kube.__init__": "the kubernetes client's ApiClient is untyped",
}


def _modules() -> dict[str, ast.Module]:
    trees = {}
    for package, top in PACKAGES.items():
        for path in (ROOT / top / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT / top).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            trees[".".join(parts)] = ast.parse(path.read_text())
    return trees


def _is_bare_any(node: ast.expr | None) -> bool:
    if isinstance(node, ast.Name):
        return node.id == "Any"
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return _is_bare_any(ast.parse(node.value, mode="eval").body)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _is_bare_any(node.left) or _is_bare_any(node.right)
    return False


def _signature_anys(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    args = fn.args
    named = [*args.posonlyargs, *args.args, *args.kwonlyargs]
    found = [a.arg for a in named if _is_bare_any(a.annotation)]
    return [*found, "return"] if _is_bare_any(fn.returns) else found


def _public_names(tree: ast.Module) -> Iterator[str]:
    for node in tree.body:
        defines = isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        if defines and not node.name.startswith("_"):  # type: ignore[union-attr]
            yield node.name  # type: ignore[union-attr]


def _imported(trees: dict[str, ast.Module]) -> dict[tuple[str, str], set[str]]:
    """(module, name) -> the modules that import it (a module import brings all of it)."""
    users: dict[tuple[str, str], set[str]] = {}
    for importer, tree in trees.items():
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom) or node.module not in trees:
                continue
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                if submodule in trees:
                    for name in _public_names(trees[submodule]):
                        users.setdefault((submodule, name), set()).add(importer)
                elif node.module != importer:
                    users.setdefault((node.module, alias.name), set()).add(importer)
    return users


def _anys(tree: ast.Module, name: str) -> Iterator[tuple[str, list[str]]]:
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name:
            yield name, _signature_anys(node)
        if isinstance(node, ast.ClassDef) and node.name == name:
            for item in node.body:
                public = not item.name.startswith("_") if hasattr(item, "name") else False
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and (
                    public or item.name == "__init__"
                ):
                    yield f"{name}.{item.name}", _signature_anys(item)
                if isinstance(item, ast.AnnAssign) and _is_bare_any(item.annotation):
                    yield f"{name}.{ast.unparse(item.target)}", ["field"]


def seams_with_any() -> list[str]:
    trees = _modules()
    problems = []
    for (module, name), importers in sorted(_imported(trees).items()):
        for qualified, where in _anys(trees[module], name):
            full = f"{module}.{qualified}"
            package = module.split(".")[0]
            across = sorted(m for m in importers if m.split(".")[0] != package)
            if where and (across or full not in WITHIN_PACKAGE_EXEMPT):
                problems.append(f"{full}: bare Any in {where}, used by {sorted(importers)}")
    return problems


def test_no_bare_any_where_modules_meet() -> None:
    assert seams_with_any() == []


def test_the_rule_sees_a_bare_any(tmp_path: Path) -> None:
    code = "from typing import Any\ndef f(plan: Any, n: int) -> Any | None: ...\n"
    fn = ast.parse(code).body[1]
    assert isinstance(fn, ast.FunctionDef)
    assert _signature_anys(fn) == ["plan", "return"]
    json_fn = ast.parse("def g(doc: dict[str, Any]) -> list[Any]: ...").body[0]
    assert isinstance(json_fn, ast.FunctionDef) and _signature_anys(json_fn) == []


def test_the_exemptions_are_still_needed() -> None:
    """An exemption whose Any is gone must be deleted, so the list never grows stale."""
    trees = _modules()
    for full in WITHIN_PACKAGE_EXEMPT:
        parts = full.split(".")
        for split in range(len(parts) - 1, 0, -1):
            module = ".".join(parts[:split])
            if module in trees:
                name = parts[split]
                found = [w for q, w in _anys(trees[module], name) if f"{module}.{q}" == full]
                assert found and found[0], f"{full} no longer has a bare Any: drop its exemption"
                break
