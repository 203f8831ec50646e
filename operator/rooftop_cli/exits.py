"""What each ``rooftop`` command's exit codes mean: each command's ``--help`` epilog and the
CLI reference page (docs/cli.md) are written from this table. The numbers themselves are
``rooftop_api.exit_codes``, which the commands return.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping

from rooftop_api.exit_codes import BAD_INPUT, BROKEN_PIPE, INFEASIBLE, INTERRUPTED, OK

Codes = tuple[tuple[int, str], ...]
_BAD = "bad input: a file that cannot be read or used, an unknown model or GPU, a bad flag"
# Per command: (code, meaning), most common first. 130 (interrupted) applies to all.
CODES: Mapping[str, Codes] = {
    "plan": (
        (OK, "every target has a plan"),
        (INFEASIBLE, "some target has no feasible plan (the reasons are printed)"),
        (BAD_INPUT, _BAD),
    ),
    "predict": (
        (OK, "predicted (with --csv, a row that cannot be predicted says why in its error)"),
        (BAD_INPUT, _BAD + ", a CSV without the needed columns"),
    ),
    "render": (
        (OK, "every target rendered"),
        (INFEASIBLE, "some target has no feasible plan, or its plan cannot be deployed"),
        (BAD_INPUT, _BAD),
    ),
    "operator": (
        (OK, "stopped by SIGINT or SIGTERM"),
        (INFEASIBLE, "the API server cannot be reached, or answers with a server error"),
        (BAD_INPUT, "bad flags or settings, no Kubernetes configuration, credentials refused"),
    ),
    "engine-sim": (
        (OK, "stopped"),
        (INFEASIBLE, "cannot listen on the address"),
        (BAD_INPUT, "bad flags"),
    ),
    "load": (
        (OK, "at least one request completed"),
        (INFEASIBLE, "no request completed"),
        (BAD_INPUT, "bad flags or trace"),
    ),
    "simulate": (
        (OK, "simulated"),
        (BAD_INPUT, "bad input: target, trace or flags, or a target with no feasible plan"),
    ),
    "completion": ((OK, "printed the script"), (BAD_INPUT, "an unknown shell")),
}
SEVERAL = "With several targets, the exit code is the worst of theirs: 2 over 1 over 0."
MULTI_TARGET = ("plan", "render")


def lines(command: str) -> list[str]:
    """``code  meaning`` lines for ``command`` (130 and 141 included)."""
    codes = (
        *CODES.get(command, ()),
        (INTERRUPTED, "interrupted (Ctrl-C)"),
        (BROKEN_PIPE, "the reader of stdout went away (e.g. `| head`); nothing is printed"),
    )
    return [f"{code:>3}  {meaning}" for code, meaning in codes]


def epilog(command: str) -> str:
    """The exit-code section of a command's ``--help``."""
    text = "exit codes:\n" + "\n".join(f"  {line}" for line in lines(command))
    return text + (f"\n{SEVERAL}" if command in MULTI_TARGET else "")


TOP_EPILOG = (
    "exit codes: 0 ok, 1 no feasible plan (plan, render), 2 bad input, 130 interrupted,\n"
    "141 stdout closed by its reader;\n"
    "`rooftop COMMAND --help` lists a command's.\n"
    "shell completion: source <(rooftop completion bash), or see `rooftop completion -h`."
)


def fail(message: str) -> int:
    """Print ``rooftop: error: message`` to stderr; the bad-input exit code."""
    print(f"rooftop: error: {message}", file=sys.stderr)
    return BAD_INPUT


def guarded(func: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Turn user-input errors into a message and exit code 2, never a traceback."""
    from rooftop_api.errors import ApiError
    from rooftop_planner.errors import PlannerError

    def run(args: argparse.Namespace) -> int:
        try:
            return func(args)
        except (ApiError, PlannerError) as err:
            return fail(str(err))
        except BrokenPipeError:  # stdout's reader left: rooftop_cli.main ends quietly
            raise
        except OSError as err:
            return fail(f"{getattr(err, 'filename', '') or ''}: {err.strerror or err}")

    return run
