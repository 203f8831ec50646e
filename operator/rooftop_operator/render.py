"""``rooftop render TARGET.yaml``: the objects the operator would apply, as YAML.

Like ``helm template``: for review, for GitOps, and to read the exact vLLM command
line without a cluster. It plans the target with the same planner and builds the
children with the same functions as the operator (``children.engine_inputs`` and
``children.desired``). Bad input exits 2 as ``rooftop plan`` does; a target no plan
serves exits 1 with the planner's explanation.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import yaml

from rooftop_operator import builders, children
from rooftop_operator.settings import VLLM_IMAGE, OperatorConfig, env_defaults
from rooftop_operator.specs import TargetRef

EXIT_INFEASIBLE = 1
EXIT_USAGE = 2
# A stand-in for the target's uid in ownerReferences: the API server assigns the real
# one, so an applied render is adopted only through the operator, never by name.
UID_PLACEHOLDER = "00000000-0000-0000-0000-000000000000"


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "render",
        help="print the Deployment, Service, PodDisruptionBudget and PodMonitor the "
        "operator would apply for a ServingTarget (YAML)",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    p.add_argument("target", help="ServingTarget YAML file")
    p.add_argument("-n", "--namespace", default=None, help="default: the manifest's, else default")
    p.add_argument("--catalog", default=None, help="GPU/model catalog overlay (YAML)")
    p.add_argument("--vllm-image", default=None, help=f"CUDA engine image (default {VLLM_IMAGE})")
    p.add_argument("--rocm-image", default=None, help="vLLM image for ROCm GPUs")
    p.add_argument("--tpu-image", default=None, help="vLLM image for TPUs")
    p.add_argument("--self-image", default=None, help="image for mode: simulated")
    p.add_argument(
        "--no-pod-monitor", action="store_true",
        help="render for a cluster without the Prometheus Operator (scrape annotations)",
    )  # fmt: skip
    p.set_defaults(func=run)


def _config(args: argparse.Namespace) -> OperatorConfig:
    """The operator's image settings: flags over ROOFTOP_* variables over defaults."""
    values: dict[str, Any] = env_defaults()
    for name in ("vllm_image", "rocm_image", "tpu_image", "self_image"):  # flag = field
        if getattr(args, name):
            values[name] = getattr(args, name)
    return OperatorConfig(**values)


def render(args: argparse.Namespace) -> tuple[int, str]:
    """(exit code, text): YAML documents, or the reason there are none."""
    from rooftop_api.manifest import ManifestError, load_target
    from rooftop_planner.catalog import CatalogError, load_catalog
    from rooftop_planner.search import plan_target

    try:
        config = _config(args)
        target = load_target(args.target)
        catalog = load_catalog(args.catalog)
        families = children.engine_families(config, target.spec)
        result = plan_target(target.spec, catalog=catalog, engine_families=families)
    except (ManifestError, CatalogError, ValueError) as err:
        return EXIT_USAGE, f"rooftop: error: {err}"
    except OSError as err:
        return EXIT_USAGE, f"rooftop: error: {getattr(err, 'filename', '') or ''}: {err}"
    if result.plan is None:
        return EXIT_INFEASIBLE, f"rooftop: no plan for {target.metadata.name}:\n{result.explain()}"
    namespace = args.namespace or target.metadata.namespace or "default"
    ref = TargetRef(target.metadata.name, namespace, UID_PLACEHOLDER)
    try:
        inputs = children.engine_inputs(
            catalog, config, ref, target.spec, result.plan, pod_monitor=not args.no_pod_monitor
        )
        objects = children.desired(inputs)
    except builders.UnsupportedPlan as err:
        return EXIT_INFEASIBLE, f"rooftop: the plan cannot be deployed: {err}"
    header = f"# rooftop render {args.target}: {result.plan.summary}\n"
    return 0, header + yaml.safe_dump_all(objects, sort_keys=False, width=100)


def run(args: argparse.Namespace) -> int:
    code, text = render(args)
    print(text, file=sys.stdout if code == 0 else sys.stderr)
    return code
