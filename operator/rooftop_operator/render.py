"""``rooftop render TARGET.yaml...``: the objects the operator would apply, as YAML or JSON.

Like ``helm template``: for review, for GitOps, and to read the exact vLLM command
line without a cluster. It plans the target with the same planner and builds the
children with the same functions as the operator (``children.engine_inputs`` and
``children.desired``). Bad input exits 2 as ``rooftop plan`` does; a target no plan
serves exits 1 with the planner's explanation. Several manifests, or several documents
in one: every target rendered, the exit code the worst of theirs.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

import yaml

from rooftop_api import exit_codes
from rooftop_api.spec import namespace_problem
from rooftop_operator import builders, children
from rooftop_operator.settings import (
    OperatorConfig,
    add_setting_flags,
    configured,
    read_settings,
    setting_flags,
)
from rooftop_operator.specs import TargetRef
from rooftop_planner.errors import PlannerError

if TYPE_CHECKING:
    from rooftop_api.manifest import Loaded
    from rooftop_planner.catalog import Catalog

EXIT_INFEASIBLE = exit_codes.INFEASIBLE
EXIT_USAGE = exit_codes.BAD_INPUT
# A stand-in for the target's uid in ownerReferences: the API server assigns the real
# one, so an applied render is adopted only through the operator, never by name.
UID_PLACEHOLDER = "00000000-0000-0000-0000-000000000000"


def register(subparsers: Any) -> None:
    """Add ``rooftop render`` (see rooftop_cli.main)."""
    from rooftop_api.output import JSON, YAML, add_output_option

    p = subparsers.add_parser(
        "render",
        help="print the Deployment, Service, PodDisruptionBudget and PodMonitor the "
        "operator would apply for ServingTargets (YAML or JSON)",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    p.add_argument(
        "targets",
        nargs="+",
        metavar="TARGET.yaml",
        help="ServingTarget manifests (YAML; several documents each; - for standard input)",
    )
    add_output_option(p, (YAML, JSON), YAML, note="default yaml; json is one List")
    p.add_argument(
        "-n",
        "--namespace",
        type=namespace_label,
        default=None,
        help="a DNS-1123 label (lowercase letters, digits, '-'); default: the manifest's, "
        "else default",
    )
    p.add_argument(
        "--catalog", default=None, metavar="FILE.yaml", help="GPU/model catalog overlay (YAML)"
    )
    add_setting_flags(p, IMAGE_SETTINGS)
    p.add_argument(
        "--no-pod-monitor",
        action="store_true",
        help="render for a cluster without the Prometheus Operator (scrape annotations)",
    )
    p.set_defaults(func=run)


def namespace_label(text: str) -> str:
    """``-n NAMESPACE``, refused unless Kubernetes would take it as a namespace's name."""
    if problem := namespace_problem(text):
        raise argparse.ArgumentTypeError(problem)
    return text


# The settings that shape what is rendered: the engine images.
IMAGE_SETTINGS: Final = ("vllm_image", "vllm_arm64_image", "rocm_image", "tpu_image", "self_image")


def _config(args: argparse.Namespace) -> OperatorConfig:
    """The operator's settings: flags over ROOFTOP_* variables over defaults."""
    return configured(read_settings(flags=setting_flags(args)))


@dataclass(frozen=True)
class Rendered:
    """One target's outcome: exit code, a header comment or the error, the objects."""

    code: int
    note: str
    objects: list[dict[str, Any]] = field(default_factory=list)


def render_one(
    item: Loaded, catalog: Catalog, config: OperatorConfig, args: argparse.Namespace
) -> Rendered:
    """Plan one loaded target and build the objects the operator would apply for it."""
    from rooftop_planner.search import plan_target

    if item.target is None:
        return Rendered(EXIT_USAGE, f"rooftop: error: {item.error}")
    target = item.target
    try:
        families = children.engine_families(config, target.spec)
        result = plan_target(target.spec, catalog=catalog, engine_families=families)
    except PlannerError as err:
        return Rendered(EXIT_USAGE, f"rooftop: error: {item.source}: {err}")
    plan = result.deployed
    if plan is None:
        return Rendered(
            EXIT_INFEASIBLE, f"rooftop: no plan for {target.metadata.name}:\n{result.explain()}"
        )
    namespace = args.namespace or target.metadata.namespace or "default"
    ref = TargetRef(target.metadata.name, namespace, UID_PLACEHOLDER)
    try:
        inputs = children.engine_inputs(
            catalog, config, ref, target.spec, plan, pod_monitor=not args.no_pod_monitor
        )
        objects = children.desired(inputs)
    except builders.UnsupportedPlan as err:
        return Rendered(EXIT_INFEASIBLE, f"rooftop: the plan cannot be deployed: {err}")
    return Rendered(0, f"# rooftop render {item.source}: {plan.summary}", objects)


def render_all(args: argparse.Namespace) -> list[Rendered]:
    """Every target of every manifest, rendered (or why not)."""
    from rooftop_api.manifest import load_all
    from rooftop_planner.catalog import load_catalog

    try:
        config = _config(args)
        catalog = load_catalog(args.catalog)
    except (PlannerError, ValueError) as err:  # a bad catalog; a bad setting
        return [Rendered(EXIT_USAGE, f"rooftop: error: {err}")]
    except OSError as err:
        where = getattr(err, "filename", "") or ""
        return [Rendered(EXIT_USAGE, f"rooftop: error: {where}: {err}")]
    return [render_one(item, catalog, config, args) for item in load_all(args.targets)]


def to_text(rendered: list[Rendered], fmt: str) -> str:
    """YAML documents (each target's headed by a comment), or JSON: one kubectl List."""
    from rooftop_api.output import JSON, dumps

    if fmt == JSON:
        items = [obj for r in rendered for obj in r.objects]
        return dumps({"apiVersion": "v1", "kind": "List", "items": items}, JSON)
    blocks = [
        f"{r.note}\n" + yaml.safe_dump_all(r.objects, sort_keys=False, width=100) for r in rendered
    ]
    return "---\n".join(blocks)


def run(args: argparse.Namespace) -> int:
    """Print what renders to stdout and every error to stderr; the worst exit code."""
    rendered = render_all(args)
    for failed in (r for r in rendered if r.code):
        print(failed.note, file=sys.stderr)
    done = [r for r in rendered if not r.code]
    if done:
        print(to_text(done, args.output).rstrip("\n"))
    return max(r.code for r in rendered)
