"""``rooftop plan``: the cheapest deployment that meets each ServingTarget's SLO.

Give one or more manifests (``-`` reads standard input); a file may hold several YAML
documents: each ServingTarget is planned on its own, one result per target. Bad input
(unknown model or GPU, negative rate, malformed YAML, unknown field) prints one clear
message naming the file, the field and the fix, never a traceback. The exit code is the
worst of the targets': 2 bad input over 1 no feasible plan over 0 (``rooftop_cli.exits``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rooftop_api import exit_codes
from rooftop_api.errors import ApiError
from rooftop_api.manifest import Loaded, ManifestError, load_all
from rooftop_api.output import (
    JSON,
    TABLE,
    TEXT,
    WIDE,
    YAML,
    Cell,
    add_output_option,
    dumps,
    plot_path_problem,
    print_table,
)
from rooftop_api.spec import ServingTarget
from rooftop_cli import exits
from rooftop_planner import explain
from rooftop_planner.catalog import Catalog, CatalogError, load_catalog
from rooftop_planner.errors import PlannerError
from rooftop_planner.inventory import load_cluster, target_inventory
from rooftop_planner.plan import Plan
from rooftop_planner.result import SearchResult
from rooftop_planner.search import plan_target

FORMATS = (TEXT, TABLE, WIDE, JSON, YAML)
Nodes = list[Mapping[str, Any]]
Cluster = tuple[Nodes, Nodes]  # (Nodes, Pods), as ``load_cluster`` reads them


@dataclass(frozen=True)
class Planned:
    """One target's plan: where it came from, the target, the search, the GPU nodes."""

    source: str
    target: ServingTarget
    result: SearchResult
    nodes: str = ""  # the inventory in words, with --nodes

    @property
    def code(self) -> int:
        """0 with a plan, 1 without."""
        return exit_codes.OK if self.result.deployed is not None else exit_codes.INFEASIBLE

    def to_json(self) -> dict[str, object]:
        """``rooftop plan -o json`` for this target: its name and file, then the search."""
        return {"name": self.target.metadata.name, "source": self.source, **self.result.to_json()}


def plan_one(
    item: Loaded, catalog: Catalog, cluster: Cluster | None = None, nodes_file: str = ""
) -> Planned:
    """Plan one loaded target, for the GPUs ``cluster``'s nodes (read from ``nodes_file``)
    offer it when given, less what its pods hold (ManifestError/CatalogError: it cannot
    be planned)."""
    if item.target is None:
        raise ManifestError(item.error)
    inventory = None
    if cluster is not None:
        target = item.target
        own = (target.metadata.namespace or "default", target.metadata.name)
        inventory = target_inventory(cluster, catalog, target.spec.constraints, own)
    try:
        result = plan_target(item.target.spec, catalog=catalog, gpu_inventory=inventory)
    except CatalogError as err:
        raise CatalogError(f"{item.source}: {err}") from err
    described = "" if inventory is None else f"GPU nodes ({nodes_file}): {inventory.describe()}"
    return Planned(item.source, item.target, result, described)


def cmd_plan(args: argparse.Namespace) -> int:
    """Plan every target; print them in the chosen format; the worst exit code."""
    if args.plot and (problem := plot_path_problem(args.plot)):
        return exits.fail(problem)
    loaded = load_all(args.targets)
    if args.plot and len(loaded) > 1:
        return exits.fail("--plot draws one target's plane; give one manifest with one target")
    catalog = load_catalog(args.catalog)
    cluster = load_cluster(args.nodes) if args.nodes else None
    planned, codes = [], []
    for item in loaded:
        try:
            planned.append(plan_one(item, catalog, cluster, args.nodes or ""))
            codes.append(planned[-1].code)
        except (ApiError, PlannerError) as err:
            codes.append(exits.fail(str(err)))
    show(planned, args.output, args.explain)
    if args.plot and planned:
        _plot(planned[0], catalog, args.plot)
    return max(codes, default=exit_codes.BAD_INPUT)


def _plot(planned: Planned, catalog: Catalog, path: str) -> None:
    from rooftop_cli.plan_plot import plot_plane  # matplotlib: loaded only to draw

    plot_plane(planned.result, planned.target.spec, catalog, path)
    print(f"wrote {path}", file=sys.stderr)


# ---------------------------------------------------------------- output


def show(planned: list[Planned], fmt: str, explain: bool = False) -> None:
    """Print the plans: sentences, a table (one row per target), JSON or YAML (a list
    when there are several targets). ``explain`` is honoured in every format: the
    sentences' long form, an ``explanation`` list of lines in each JSON or YAML object
    (so the output stays one document), each target's explanation under a table."""
    if fmt in (JSON, YAML):
        data = [_with_explanation(p) if explain else p.to_json() for p in planned]
        if data:
            print(dumps(data[0] if len(data) == 1 else data, fmt))
    elif fmt in (TABLE, WIDE):
        if planned:
            print_table(headers(fmt == WIDE), [row(p, fmt == WIDE) for p in planned])
            if explain:
                print("\n" + "\n\n".join(text(p, explain) for p in planned))
    elif planned:
        print("\n\n".join(text(p, explain) for p in planned))


def _with_explanation(planned: Planned) -> dict[str, object]:
    return {**planned.to_json(), "explanation": planned.result.explain().splitlines()}


def text(planned: Planned, explain: bool) -> str:
    """The sentences: the target, the GPU nodes, the choice (or why there is none)."""
    target, result = planned.target, planned.result
    lines = [f"ServingTarget {target.metadata.name}: {target.spec.model}"]
    if planned.nodes:
        lines.append(planned.nodes)
    lines.append(result.explain() if explain else _short(result))
    return "\n".join(lines)


def _short(result: SearchResult) -> str:
    if result.mixed is not None:  # why the mix: what the best single type costs
        return f"Chosen: {result.mixed.summary}\n  - {explain.mixed(result.mixed, result.plan)}"
    if result.plan:
        return f"Chosen: {result.plan.summary}"
    return "No feasible plan.\n" + "\n".join(f"  - {r}" for r in result.reasons[:3])


HEADERS = (
    "NAME",
    "MODEL",
    "FEASIBLE",
    "GPU",
    "TP",
    "REPLICAS",
    "WEIGHTS",
    "KV",
    "TPOT(ms)",
    "TTFT(ms)",
    "USD/h",
)
WIDE_HEADERS = (
    "MAX-NUM-SEQS",
    "CHUNK(tokens)",
    "MAX-MODEL-LEN",
    "TOK/s",
    "CAPACITY(req/s)",
    "SLO-TPOT(ms)",
    "BUDGET(USD/h)",
    "SOURCE",
    "REASON",
)


def headers(wide: bool) -> tuple[str, ...]:
    """The table's column names (``wide``: with more columns)."""
    return HEADERS + WIDE_HEADERS if wide else HEADERS


def row(planned: Planned, wide: bool) -> list[Cell]:
    """One target's table row; a target without a plan has ``-`` for the plan's cells."""
    result = planned.result
    cells: list[Cell] = [planned.target.metadata.name, planned.target.spec.model]
    cells += [result.deployed is not None, *_plan_cells(result.deployed)]
    if not wide:
        return cells
    deployed = result.deployed
    reason = result.reasons[0] if result.reasons and deployed is None else None
    cells += _wide_plan_cells(deployed)
    return [*cells, result.slo_tpot_ms, result.budget_usd_per_hour, planned.source, reason]


def _plan_cells(plan: Plan | None) -> list[Cell]:
    if plan is None:
        return [None] * 8
    return [
        explain.gpus_of(plan),
        plan.tp,
        plan.replicas,
        plan.weight_dtype,
        plan.kv_dtype,
        round(plan.tpot_ms, 2),
        round(plan.ttft_ms, 1),
        round(plan.usd_per_hour, 3),
    ]


def _wide_plan_cells(plan: Plan | None) -> list[Cell]:
    if plan is None:
        return [None] * 5
    return [
        plan.max_num_seqs,
        plan.max_num_batched_tokens,
        plan.max_model_len,
        round(plan.output_tok_s, 1),
        round(plan.capacity_rps, 3),
    ]


# ---------------------------------------------------------------- registration


def register(subparsers: Any) -> None:
    """Add ``rooftop plan`` (see rooftop_cli.main)."""
    plan = subparsers.add_parser(
        "plan",
        help="plan ServingTargets: GPU, dtypes, TP, replicas, batch cap",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    plan.add_argument(
        "targets",
        nargs="+",
        metavar="TARGET.yaml",
        help="ServingTarget manifests (YAML; several documents each; - for standard input)",
    )
    add_output_option(plan, FORMATS, TEXT, json_alias=True)
    plan.add_argument(
        "--explain",
        action="store_true",
        help="alternatives and every rejection reason: the long form of the text output, "
        "an explanation list in JSON and YAML, lines under a table",
    )
    plan.add_argument("--plot", metavar="FILE.png", help="draw the throughput-latency plane")
    plan.add_argument("--catalog", metavar="FILE.yaml", help="your GPU/model catalog overrides")
    plan.add_argument(
        "--nodes",
        metavar="NODES.json",
        help="plan only for GPUs these nodes offer the target's pods, after its "
        "nodeSelector and tolerations, and no more than are free of the pods listed with "
        "them (`kubectl get nodes,pods -A -o json`)",
    )
    plan.set_defaults(func=exits.guarded(cmd_plan))
