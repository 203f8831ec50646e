"""Render the dashboards into the Helm chart.

python dashboards/build.py          # write charts/rooftop/dashboards/*.json
python dashboards/build.py --check  # exit 1 if the committed files are out of date
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final

if __package__ in (None, ""):  # run as a script: make ``dashboards`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dashboards import fleet, target  # noqa: E402

REPO: Final = Path(__file__).resolve().parent.parent
OUT_DIR: Final = REPO / "charts" / "rooftop" / "dashboards"
BUILDERS: Final[dict[str, Callable[[], dict[str, Any]]]] = {
    "rooftop-fleet.json": fleet.build,
    "rooftop-target.json": target.build,
}


def render(builder: Callable[[], dict[str, Any]]) -> str:
    """Stable JSON text: sorted keys, two-space indent, trailing newline."""
    return json.dumps(builder(), indent=2, sort_keys=True) + "\n"


def render_all() -> dict[str, str]:
    """File name -> rendered JSON for every dashboard."""
    return {name: render(builder) for name, builder in BUILDERS.items()}


def stale(out_dir: Path = OUT_DIR) -> list[str]:
    """Names of files in ``out_dir`` that are missing or differ from a fresh render."""
    return [
        name
        for name, text in render_all().items()
        if not (out_dir / name).is_file() or (out_dir / name).read_text() != text
    ]


def write_all(out_dir: Path = OUT_DIR) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, text in render_all().items():
        path = out_dir / name
        path.write_text(text)
        paths.append(path)
    return paths


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="fail if files are out of date")
    parser.add_argument("--out-dir", type=Path, default=OUT_DIR, help="output folder")
    args = parser.parse_args(argv)
    if args.check:
        names = stale(args.out_dir)
        for name in names:
            print(f"out of date: {args.out_dir / name} (run python dashboards/build.py)")
        return 1 if names else 0
    for path in write_all(args.out_dir):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
