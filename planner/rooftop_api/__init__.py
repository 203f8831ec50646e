"""The ServingTarget API: pydantic models, manifest loading, extraArgs checks, the CRD,
and the output formats every command shares.

``spec``       the resource as pydantic models (the single source of truth)
``manifest``   read a ServingTarget from YAML with messages that name the field
``vllm_args``  check ``spec.engine.extraArgs`` the way vLLM's own parser would
``conditions`` the one status-condition type and how a condition list is merged
``crd``        generate the CustomResourceDefinition from ``spec``
``reference``  generate docs/reference.md (the ServingTarget reference) from ``spec``
``generated``  write or check (``--check``) what the generators produce
``output``     how every command prints results (``-o json|yaml|table|wide``)
``errors``     ``ApiError``, the base of every input error this package raises

No Kubernetes client, no kopf, no planner: everything else builds on this package.
"""
