"""Exit codes of every ``rooftop`` command, defined once for all packages.

The lowest layer holds them so that the operator, the simulator and the CLI (which
documents them per command: ``rooftop_cli.exits``) return the same numbers: 0 success,
1 a well-formed question with a "no" for an answer (no feasible plan, nothing served),
2 bad input (argparse's own code for a bad flag), 130 interrupted (128 + SIGINT), 141
stdout closed by its reader (128 + SIGPIPE, as a shell reports it).
"""

from __future__ import annotations

from typing import Final

OK: Final = 0
INFEASIBLE: Final = 1
BAD_INPUT: Final = 2
INTERRUPTED: Final = 130
BROKEN_PIPE: Final = 141
