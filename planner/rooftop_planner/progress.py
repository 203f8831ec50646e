"""Progress of long work (simulations, fits, benchmarks), on a terminal only.

Written to stderr when, and only when, it is a TTY: a status line redrawn in place
(carriage return, erase to the end of the line) and lines that stay. When stderr is a
pipe or a file (CI logs, ``2>log``), nothing is written, so logs and pipes stay clean.
"""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Callable
from typing import TextIO

ERASE_LINE = "\r\x1b[K"  # back to column 0, erase to the end of the line


class Progress:
    """A status line and lasting lines on ``stream`` (default: stderr), if a TTY.

    ``min_interval_s``: status updates closer together than this are dropped (a
    simulation reports every simulated scrape; the terminal need not redraw as often).
    """

    def __init__(
        self,
        stream: TextIO | None = None,
        min_interval_s: float = 0.1,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stream = sys.stderr if stream is None else stream
        self.enabled = _is_tty(self.stream)
        self.min_interval_s = min_interval_s
        self.clock = clock
        self._shown = False  # a status line is on screen
        self._last = -float("inf")

    def status(self, text: str, force: bool = False) -> None:
        """Redraw the status line with ``text`` (dropped if the last was too recent,
        unless ``force``)."""
        if not self.enabled:
            return
        now = self.clock()
        if not force and now - self._last < self.min_interval_s:
            return
        self._last = now
        self._write(ERASE_LINE + _fit(text))
        self._shown = True

    def line(self, text: str) -> None:
        """A line that stays, in place of the status line."""
        if self.enabled:
            self._write((ERASE_LINE if self._shown else "") + text + "\n")
            self._shown = False

    def clear(self) -> None:
        """Erase the status line (before printing results to the same terminal)."""
        if self.enabled and self._shown:
            self._write(ERASE_LINE)
            self._shown = False

    def _write(self, text: str) -> None:
        self.stream.write(text)
        self.stream.flush()


def _is_tty(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # a closed or file-less stream
        return False


def _fit(text: str) -> str:
    """``text`` cut to the terminal's width: a wrapped line cannot be redrawn in place."""
    width = shutil.get_terminal_size().columns - 1
    return text if len(text) <= width else text[: max(width - 3, 0)] + "..."
