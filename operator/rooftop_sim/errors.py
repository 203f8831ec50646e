"""The one exception base of the simulator: ``SimError``.

Every exception the simulator raises for its input subclasses it, where it is defined:
``simulate.InputError`` (a target or trace that cannot be simulated), ``traces.TraceError``
(a trace file it cannot read; the message names file, line and column) and
``engine.server.BadRequest`` (a request the simulated engine answers with a 4xx). It is a
``ValueError``, so callers that catch that keep working. ``tests/unit/test_errors.py``
holds every exception class of the package to it.
"""

from __future__ import annotations


class SimError(ValueError):
    """Input the simulator cannot use; the message names it and the fix."""
