"""``rooftop plan`` and ``rooftop predict``.

Bad input (unknown model or GPU, negative rate, malformed YAML, unknown field) prints one
clear message naming the field and the fix and exits 2, never a traceback.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rooftop_api.manifest import ManifestError, load_target
from rooftop_planner.catalog import CatalogError, load_catalog
from rooftop_planner.efficiency import load_efficiency
from rooftop_planner.explain import explain_step
from rooftop_planner.inventory import Placement, inventory_from_nodes, load_nodes
from rooftop_planner.result import SearchResult
from rooftop_planner.scenarios import ScenarioError, scenario_from_row
from rooftop_planner.search import plan_target

EXIT_USAGE = 2
PREDICT_INPUT = (
    "model",
    "gpu",
    "tp",
    "weight_dtype",
    "kv_dtype",
    "isl",
    "osl",
    "concurrency",
    "batch",
)
PREDICT_OUTPUT = (
    "tpot_ms", "ttft_ms", "output_tok_s", "floor_ms", "floor_share", "curves", "fits", "error"
)  # fmt: skip
NUMERIC_OUTPUT = PREDICT_OUTPUT[:5]


def _fail(message: str) -> int:
    print(f"rooftop: error: {message}", file=sys.stderr)
    return EXIT_USAGE


def _guarded(func: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Turn user-input errors into a message and exit code 2."""

    def run(args: argparse.Namespace) -> int:
        try:
            return func(args)
        except (ManifestError, CatalogError, ScenarioError) as err:
            return _fail(str(err))
        except BrokenPipeError:  # stdout's reader left: rooftop_cli.main ends quietly
            raise
        except OSError as err:
            return _fail(f"{getattr(err, 'filename', '') or ''}: {err.strerror or err}")

    return run


# ---------------------------------------------------------------- plan


def cmd_plan(args: argparse.Namespace) -> int:
    if args.plot:
        from rooftop_planner.plot import plot_path_problem

        if problem := plot_path_problem(args.plot):
            return _fail(problem)
    target = load_target(args.target)
    catalog = load_catalog(args.catalog)
    inventory = None
    if args.nodes:
        placement = Placement.of(target.spec.constraints)
        inventory = inventory_from_nodes(load_nodes(args.nodes), catalog, placement)
    result = plan_target(target.spec, catalog=catalog, gpu_inventory=inventory)
    if args.json:
        print(json.dumps(result.to_json(), indent=2))
    else:
        print(f"ServingTarget {target.metadata.name}: {target.spec.model}")
        if inventory is not None:
            print(f"GPU nodes ({args.nodes}): {inventory.describe()}")
        print(result.explain() if args.explain else _short(result))
    if args.plot:
        from rooftop_planner.plot import plot_plane

        plot_plane(result, target.spec, catalog, args.plot)
        print(f"wrote {args.plot}", file=sys.stderr)
    return 0 if result.feasible else 1


def _short(result: SearchResult) -> str:
    if result.plan:
        return f"Chosen: {result.plan.summary}"
    return "No feasible plan.\n" + "\n".join(f"  - {r}" for r in result.reasons[:3])


# ---------------------------------------------------------------- predict


def predict_row(row: dict[str, str], explain: list[str] | None = None) -> dict[str, str]:
    """Predict one CSV row; problems go to the ``error`` column, never raise.

    ``floor_ms`` is the mean decode step's physical floor (weights touched + KV read at
    peak HBM bandwidth) and ``floor_share`` the share of the predicted TPOT it makes up;
    ``curves`` names the fitted kernel curves used. ``explain``: filled with the step's
    breakdown when given.
    """
    out = dict(row)
    try:
        scenario = scenario_from_row(row, load_catalog(), load_efficiency())
        prediction = scenario.predict()
    except (ScenarioError, CatalogError) as err:
        return {**out, **dict.fromkeys(PREDICT_OUTPUT[:-1], ""), "error": str(err)}
    floor = prediction.floor_s
    share = floor / prediction.tpot_s if prediction.fits and prediction.tpot_s > 0 else math.nan
    values = (prediction.tpot_ms, prediction.ttft_ms, prediction.output_tok_s, floor * 1e3, share)
    formatted = [f"{v:.4g}" if math.isfinite(v) else "" for v in values]
    out.update(zip(NUMERIC_OUTPUT, formatted, strict=True))
    out["curves"] = scenario.deployment.efficiency.describe()
    out["fits"] = "true" if prediction.fits else "false"
    out["error"] = prediction.reason
    if explain is not None and prediction.step is not None:
        explain += explain_step(prediction.step, out["curves"])
    return out


def cmd_predict(args: argparse.Namespace) -> int:
    if args.csv:
        return _predict_csv(Path(args.csv), Path(args.out) if args.out else None)
    row = {
        "model": args.model,
        "gpu": args.gpu,
        "tp": str(args.tp),
        "weight_dtype": args.weight_dtype,
        "kv_dtype": args.kv_dtype,
        "isl": str(args.isl),
        "osl": str(args.osl),
        "concurrency": str(args.concurrency or ""),
        "batch": str(args.batch or ""),
        "engine": args.engine,
    }
    if not args.model or not args.gpu:
        return _fail("--model and --gpu are required without --csv")
    lines: list[str] = []
    result = predict_row(row, lines if args.explain else None)
    if result["error"] and not result["tpot_ms"]:
        return _fail(result["error"])
    print(json.dumps({k: result[k] for k in PREDICT_OUTPUT}, indent=2))
    if lines:
        print("\n".join(lines))
    return 0


def _predict_csv(path: Path, out_path: Path | None) -> int:
    try:
        return _predict_rows(path, out_path)
    except UnicodeDecodeError as err:
        return _fail(f"{path}: not a UTF-8 text CSV ({err.reason}); export it as CSV text")


def _predict_rows(path: Path, out_path: Path | None) -> int:
    with path.open(newline="", encoding="utf-8-sig") as handle:
        reader = csv.DictReader(handle)
        missing = [c for c in PREDICT_INPUT if c not in (reader.fieldnames or [])]
        if missing:
            return _fail(
                f"{path}: missing column(s) {', '.join(missing)}; "
                f"expected {','.join(PREDICT_INPUT)}[,engine]"
            )
        rows = [predict_row(row) for row in reader]
        columns = list(reader.fieldnames or []) + [
            c for c in PREDICT_OUTPUT if c not in (reader.fieldnames or [])
        ]
    out = out_path.open("w", newline="") if out_path else sys.stdout
    try:
        writer = csv.DictWriter(out, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    finally:
        if out_path:
            out.close()
    failed = sum(1 for r in rows if r["error"] and not r["tpot_ms"])
    print(f"predicted {len(rows) - failed}/{len(rows)} rows", file=sys.stderr)
    return 0


# ---------------------------------------------------------------- registration


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from err
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be >= 1")
    return value


def register(subparsers: Any) -> None:
    plan = subparsers.add_parser(
        "plan", help="plan a ServingTarget: GPU, dtypes, TP, replicas, batch cap"
    )
    plan.add_argument("target", help="ServingTarget manifest (YAML)")
    plan.add_argument("--json", action="store_true", help="machine-readable output")
    plan.add_argument(
        "--explain", action="store_true", help="alternatives and every rejection reason"
    )
    plan.add_argument("--plot", metavar="FILE.png", help="draw the throughput-latency plane")
    plan.add_argument("--catalog", metavar="FILE.yaml", help="your GPU/model catalog overrides")
    plan.add_argument(
        "--nodes", metavar="NODES.json",
        help="plan only for GPUs these nodes offer the target's pods, after its "
        "nodeSelector and tolerations (`kubectl get nodes -o json`)",
    )  # fmt: skip
    plan.set_defaults(func=_guarded(cmd_plan))

    predict = subparsers.add_parser("predict", help="predict TPOT/TTFT/throughput of scenarios")
    predict.add_argument(
        "--csv", metavar="IN.csv", help=f"columns: {','.join(PREDICT_INPUT)}[,engine]"
    )
    predict.add_argument("--out", metavar="OUT.csv", help="where to write (default stdout)")
    predict.add_argument("--model")
    predict.add_argument("--gpu")
    predict.add_argument("--tp", type=_positive_int, default=1)
    predict.add_argument("--weight-dtype", default="bf16")
    predict.add_argument("--kv-dtype", default="auto")
    predict.add_argument("--isl", type=_positive_int, default=1024, help="input tokens")
    predict.add_argument("--osl", type=_positive_int, default=256, help="output tokens")
    group = predict.add_mutually_exclusive_group()
    group.add_argument("--concurrency", type=_positive_int, help="requests in flight (continuous)")
    group.add_argument("--batch", type=_positive_int, help="one static batch")
    predict.add_argument(
        "--engine", default="vllm",
        help="vllm, sglang, trtllm or nim: whose measured kernel curves to use",
    )  # fmt: skip
    predict.add_argument(
        "--explain", action="store_true",
        help="where the decode step's time goes, against its physical floor",
    )  # fmt: skip
    predict.set_defaults(func=_guarded(cmd_predict))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rooftop-planner")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
