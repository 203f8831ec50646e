"""The one exception base of the operator: ``OperatorError``, transient or permanent.

Every exception the operator's own modules raise subclasses it, where it is defined:
``kube.KubeError`` (an API call failed; transient for a lost connection, a conflict,
throttling or a server error), ``kube.ClusterUnavailable`` (no cluster to talk to),
``specs.SpecError`` (an invalid spec), ``builders.UnsupportedPlan`` (a plan the engine
cannot run) and ``reconcile.ChildConflict`` (a child's name taken by someone else's
object). ``transient`` is what a caller decides on: retry with back-off, or say so on the
resource and wait for a change. ``tests/unit/test_errors.py`` holds every exception class
of the package to it.
"""

from __future__ import annotations


class OperatorError(Exception):
    """An error the operator reports rather than crashes on."""

    @property
    def transient(self) -> bool:
        """Whether the same call may succeed as it is, later (retry with back-off);
        False: it fails again until the spec, the cluster or the catalog changes."""
        return False
