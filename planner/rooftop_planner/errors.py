"""The one exception base of the planner: ``PlannerError``.

Every exception the planner raises for its input subclasses it, where it is defined:
``catalog.CatalogError`` (an unknown model or GPU, a bad catalog file or
``modelConfig``), ``inventory.InventoryError`` (a node list file it cannot read),
``scenarios.ScenarioError`` (a prediction row it cannot use) and
``plan.PlanStatusError`` (a ``status.plan`` it cannot read back). A caller that reports a
target's input errors catches ``PlannerError``; it is a ``ValueError``, so callers that
catch that keep working. Anything else the planner raises (a ``KeyError`` from a lookup
that should never miss) is a bug, not the user's input, and is left to surface.
``tests/unit/planner/test_errors.py`` holds every exception class of the package to it.
"""

from __future__ import annotations


class PlannerError(ValueError):
    """A plan request the planner cannot serve because of its input: an unknown model or
    GPU, a bad catalog, a bad scenario. Permanent (the same input fails again), never a
    bug; the message names the field and the fix."""
