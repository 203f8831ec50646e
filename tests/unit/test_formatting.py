"""The source is laid out by the formatter alone.

Hand-packed calls (``# fmt: skip``) hid long positional argument lists from review; the
formatter now lays out every call, so a long list shows as the long list it is.
"""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCE = [ROOT / "planner", ROOT / "operator"]


def test_no_source_line_opts_out_of_the_formatter() -> None:
    opted_out = [
        f"{path.relative_to(ROOT)}:{number}"
        for folder in SOURCE
        for path in sorted(folder.rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        if "fmt: skip" in line or "fmt: off" in line
    ]
    assert not opted_out, f"lay these out with `ruff format` instead: {opted_out}"
