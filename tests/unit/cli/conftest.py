"""The ``rooftop`` fixture: run the command as a user does (``cli_process``)."""

from __future__ import annotations

import pytest
from cli_process import Rooftop, run_rooftop


@pytest.fixture
def rooftop() -> Rooftop:
    """``rooftop(*args, stdin=None, **env)``: the finished ``python -m rooftop_cli.main``."""
    return run_rooftop
