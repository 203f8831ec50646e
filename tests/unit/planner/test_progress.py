"""Progress lines (``rooftop_planner.progress``): on a terminal only."""

from __future__ import annotations

import io
import os

from rooftop_planner.progress import ERASE_LINE, Progress


class FakeTerminal(io.StringIO):
    """A stream that says it is a TTY."""

    def isatty(self) -> bool:
        return True


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_terminal_gets_a_status_line_redrawn_in_place_then_lasting_lines() -> None:
    stream, clock = FakeTerminal(), Clock()
    progress = Progress(stream, min_interval_s=1.0, clock=clock)
    progress.status("one")
    progress.status("dropped: too soon")
    clock.now = 2.0
    progress.status("two")
    progress.line("done")
    progress.clear()  # nothing shown: nothing to erase
    assert stream.getvalue() == f"{ERASE_LINE}one{ERASE_LINE}two{ERASE_LINE}done\n"


def test_forced_status_and_clear() -> None:
    stream = FakeTerminal()
    progress = Progress(stream, min_interval_s=60.0, clock=Clock())
    progress.status("a")
    progress.status("b", force=True)
    progress.clear()
    assert stream.getvalue() == f"{ERASE_LINE}a{ERASE_LINE}b{ERASE_LINE}"


def test_nothing_is_written_when_not_a_tty() -> None:
    stream = io.StringIO()
    progress = Progress(stream)
    progress.status("x", force=True)
    progress.line("y")
    progress.clear()
    assert not progress.enabled and stream.getvalue() == ""


def test_a_closed_stream_is_not_a_tty() -> None:
    with open(os.devnull, "w") as stream:
        pass
    assert not Progress(stream).enabled
