"""The one exception base of the API package: ``ApiError``.

Every exception this package raises for what a person wrote subclasses it, where it is
defined: ``manifest.ManifestError`` (a manifest that cannot be used),
``vllm_args.ExtraArgError`` (an extra argument vLLM would refuse) and
``crd.SchemaError`` (a model the CRD generator cannot express). A caller that reports
input errors catches ``ApiError``; it is a ``ValueError``, so callers that catch that
keep working. ``tests/unit/planner/test_errors.py`` holds every exception class of the
package to it.
"""

from __future__ import annotations


class ApiError(ValueError):
    """A user's input the API rejects; the message names the field and the fix."""
