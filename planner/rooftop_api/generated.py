"""Files generated from the API models (the CRD, the reference page): write or check.

``make lint`` runs each generator with ``--check``, so a model change that was not
regenerated fails CI instead of shipping a stale CRD or page.
"""

from __future__ import annotations

import sys
from pathlib import Path

from rooftop_api import exit_codes


def write_or_check(output: Path, text: str, *, check: bool, stale_hint: str) -> int:
    """Write ``text`` to ``output``; with ``check``, only compare and say how to fix.

    Returns the exit code: INFEASIBLE when checking found the file stale, else OK.
    """
    if check:
        current = output.read_text() if output.exists() else ""
        if current != text:
            print(f"{output} is stale: {stale_hint}", file=sys.stderr)
            return exit_codes.INFEASIBLE
        return exit_codes.OK
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(text)
    print(output)
    return exit_codes.OK
