"""``rooftop predict``: TPOT, TTFT and throughput of one deployment, or of a CSV of them.

One scenario prints typed JSON (numbers as numbers, ``fits`` a boolean, ``error`` null
when there is none), YAML or a table; ``--explain`` adds where the step's time goes (an
``explanation`` list of lines in JSON and YAML, lines under a table), so JSON stays JSON.
``--csv`` reads rows and writes CSV: every row names its own scenario, so a flag that
describes one scenario (``--gpu``, ``-o``, ``--explain``...) is refused beside it, as
``--out`` is without it, rather than ignored. A model outside
the catalog is described by its Hugging Face ``config.json`` (``--model-config``) or
added under ``models:`` in a catalog file (``--catalog``), as ``rooftop plan`` does.
"""

from __future__ import annotations

import argparse
import csv
import functools
import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rooftop_api import exit_codes
from rooftop_api.output import JSON, TABLE, WIDE, YAML, Cell, add_output_option, dumps, print_table
from rooftop_api.spec import KvDtype
from rooftop_cli import exits
from rooftop_planner.catalog import Catalog, load_catalog
from rooftop_planner.closed_loop import DEFAULT_NUM_PROMPTS
from rooftop_planner.efficiency import load_efficiency
from rooftop_planner.errors import PlannerError
from rooftop_planner.explain import explain_step
from rooftop_planner.hf_config import model_from_hf_config
from rooftop_planner.scenarios import LENGTHS, checkpoint_dtype, scenario_from_row

FORMATS = (JSON, YAML, TABLE, WIDE)
PREDICT_OUTPUT = (
    "tpot_ms",
    "ttft_ms",
    "output_tok_s",
    "running",
    "evictions",
    "floor_ms",
    "floor_share",
    "curves",
    "fits",
    "error",
)
NUMERIC_OUTPUT = PREDICT_OUTPUT[:7]
REQUIRED_INPUT = ("model", "gpu", "tp", "isl", "osl")
CSV_COLUMNS = (
    "model,gpu,tp,isl,osl and one of concurrency, batch and rate; optional weight_dtype,"
    "kv_dtype,engine and, for a concurrency row, num_prompts,lengths"
)
DEFAULT_TP, DEFAULT_ISL, DEFAULT_OSL = 1, 1024, 256
KV_DTYPES = tuple(k.value for k in KvDtype)  # what a ServingTarget's kvDtypes accepts


def _significant(value: float) -> float | None:
    """``value`` to 4 significant digits; None when it is not finite (no prediction)."""
    return float(f"{value:.4g}") if math.isfinite(value) else None


@dataclass(frozen=True)
class Predicted:
    """One scenario's prediction, typed. Times in ms; None: no finite value.

    ``floor_ms`` is the mean decode step's physical floor (weights touched + KV read at
    peak HBM bandwidth) and ``floor_share`` the share of the predicted TPOT it makes up;
    ``running`` the sequences that decode at once (the rest of the clients queue: the
    engine's batch cap or its KV cache is full); ``evictions`` how often a request is
    evicted from a full KV cache and prefilled again, on average (vLLM, more clients
    than the cache holds; 0 otherwise);
    ``curves`` names the fitted kernel curves used; ``explanation``: where the step's
    time goes, when asked for.
    """

    tpot_ms: float | None
    ttft_ms: float | None
    output_tok_s: float | None
    running: float | None
    evictions: float | None
    floor_ms: float | None
    floor_share: float | None
    curves: str
    fits: bool
    error: str | None
    explanation: tuple[str, ...] = ()

    def to_json(self) -> dict[str, object]:
        """The ``-o json`` object (the CSV's output columns, typed)."""
        return {key: getattr(self, key) for key in PREDICT_OUTPUT}

    def csv_cells(self) -> dict[str, str]:
        """The CSV's output columns as text (empty for a missing value)."""
        numbers = {k: _csv_number(getattr(self, k)) for k in NUMERIC_OUTPUT}
        return {
            **numbers,
            "curves": self.curves,
            "fits": "true" if self.fits else "false",
            "error": self.error or "",
        }


def _csv_number(value: float | None) -> str:
    return "" if value is None else f"{value:.4g}"


def predict_one(
    row: Mapping[str, str], catalog: Catalog | None = None, explain: bool = False
) -> Predicted:
    """Predict one scenario row (a PlannerError when it cannot be)."""
    scenario = scenario_from_row(row, catalog or load_catalog(), load_efficiency())
    prediction = scenario.predict()
    floor = prediction.floor_s
    share = floor / prediction.tpot_s if prediction.fits and prediction.tpot_s > 0 else math.nan
    curves = scenario.deployment.efficiency.describe()
    lines = (
        explain_step(prediction.step, curves, prediction.tpot_s, prediction.evictions)
        if explain and prediction.step
        else []
    )
    return Predicted(
        tpot_ms=_significant(prediction.tpot_ms),
        ttft_ms=_significant(prediction.ttft_ms),
        output_tok_s=_significant(prediction.output_tok_s),
        running=_significant(prediction.batch) if prediction.fits else None,
        evictions=_significant(prediction.evictions) if prediction.fits else None,
        floor_ms=_significant(floor * 1e3),
        floor_share=_significant(share),
        curves=curves,
        fits=prediction.fits,
        error=prediction.reason or None,
        explanation=tuple(lines),
    )


def predict_row(
    row: dict[str, str], explain: list[str] | None = None, catalog: Catalog | None = None
) -> dict[str, str]:
    """Predict one CSV row as CSV cells; problems go to the ``error`` column, never raise.

    ``explain``: filled with the step's breakdown when given.
    """
    try:
        predicted = predict_one(row, catalog, explain is not None)
    except PlannerError as err:
        return {**row, **dict.fromkeys(PREDICT_OUTPUT[:-1], ""), "error": str(err)}
    if explain is not None:
        explain += predicted.explanation
    return {**row, **predicted.csv_cells()}


def with_model_config(catalog: Catalog, config: str, name: str | None) -> tuple[Catalog, str]:
    """The catalog with the model that a Hugging Face config.json describes first in it
    (named ``name``, else by the config), and the name to ask for it by."""
    model = model_from_hf_config(Path(config), name=name or "")
    others = {k: v for k, v in catalog.models.items() if k != model.id}
    return replace(catalog, models={model.id: model, **others}), name or model.id


class _Scenario(argparse.Action):
    """A flag that describes one scenario: stored as argparse's ``store`` does, and noted
    in ``given`` (a default cannot be told from a typed value), so that ``--csv``, whose
    rows describe their own, refuses it rather than ignore it."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        setattr(namespace, self.dest, values)
        namespace.given = (*getattr(namespace, "given", ()), option_string or self.dest)


def flag_conflict(args: argparse.Namespace) -> str:
    """Why two given flags cannot go together (one would be ignored), else ""."""
    if not args.csv:
        return "--out writes the CSV of --csv; without --csv, redirect stdout" if args.out else ""
    given = list(getattr(args, "given", ()))
    given += ["--explain"] * args.explain + ["-o/--output (or --json)"] * bool(args.output)
    if args.model and not args.model_config:  # with --model-config, it names the model
        given.insert(0, "--model")
    if not given:
        return ""
    return (
        f"--csv and {given[0]} cannot be combined: --csv writes CSV, one row per row of "
        f"the file, and each row names its own scenario; {given[0]} is for one scenario "
        "from flags (give it as a column of the CSV, or drop --csv)"
    )


def cmd_predict(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """One scenario from the flags, or every row of ``--csv``."""
    if conflict := flag_conflict(args):
        parser.error(conflict)  # exits 2 with the usage, as argparse's own conflicts do
    catalog, model = load_catalog(args.catalog), args.model
    if args.model_config:
        catalog, model = with_model_config(catalog, args.model_config, args.model)
    if args.csv:
        return _predict_csv(Path(args.csv), Path(args.out) if args.out else None, catalog)
    if not model or not args.gpu:
        return exits.fail("--model (or --model-config) and --gpu are required without --csv")
    predicted = predict_one(_row(args, model), catalog, args.explain)
    if predicted.error and predicted.tpot_ms is None:
        return exits.fail(predicted.error)
    _show(predicted, _row(args, model), args.output or JSON, args.explain)
    return exit_codes.OK


def _row(args: argparse.Namespace, model: str) -> dict[str, str]:
    """The flags as a CSV row."""
    return {
        "model": model,
        "gpu": args.gpu,
        "tp": str(args.tp),
        # shown as planned: an unstated dtype is the checkpoint's (-FP8: fp8), else bf16
        "weight_dtype": args.weight_dtype or checkpoint_dtype(model) or "bf16",
        "kv_dtype": args.kv_dtype,
        "isl": str(args.isl),
        "osl": str(args.osl),
        "concurrency": str(args.concurrency or ""),
        "batch": str(args.batch or ""),
        "rate": str(args.request_rate or ""),
        "engine": args.engine,
        "num_prompts": str(args.num_prompts or ""),
        "lengths": args.lengths or "",
    }


HEADERS = ("MODEL", "GPU", "TP", "TPOT(ms)", "TTFT(ms)", "TOK/s", "FITS")
WIDE_HEADERS = (
    "WEIGHTS",
    "KV",
    "ISL",
    "OSL",
    "CONCURRENCY",
    "BATCH",
    "RATE",
    "ENGINE",
    "RUNNING",
    "EVICTIONS",
    "FLOOR(ms)",
    "FLOOR-SHARE",
    "CURVES",
    "ERROR",
)


def _show(predicted: Predicted, row: Mapping[str, str], fmt: str, explain: bool) -> None:
    """Print one prediction as JSON or YAML (with ``explain``, its ``explanation`` inside,
    so the output stays one document), or as a one-row table (the explanation below)."""
    if fmt in (JSON, YAML):
        data = predicted.to_json()
        print(dumps({**data, "explanation": list(predicted.explanation)} if explain else data, fmt))
        return
    cells: list[Cell] = [
        row["model"],
        row["gpu"],
        row["tp"],
        predicted.tpot_ms,
        predicted.ttft_ms,
        predicted.output_tok_s,
        predicted.fits,
    ]
    if fmt == WIDE:
        cells += [
            row[k]
            for k in (
                "weight_dtype",
                "kv_dtype",
                "isl",
                "osl",
                "concurrency",
                "batch",
                "rate",
                "engine",
            )
        ]
        cells += [
            predicted.running,
            predicted.evictions,
            predicted.floor_ms,
            predicted.floor_share,
            predicted.curves,
            predicted.error,
        ]
    print_table(HEADERS + (WIDE_HEADERS if fmt == WIDE else ()), [cells])
    if predicted.explanation:
        print("\n".join(predicted.explanation))


def _column_problem(header: Sequence[str]) -> str:
    """What the CSV header lacks, or "" when every row can be read.

    Only the columns no default stands for are required. A row's dtypes default as on
    the command line (the weights: the checkpoint's, else bf16; the KV cache: auto, the
    model's own dtype, as vLLM's default) and its engine to vLLM; a file of only
    continuous runs (or only static batches) need not carry the other column.
    """
    missing = [c for c in REQUIRED_INPUT if c not in header]
    if missing:
        return f"missing column(s) {', '.join(missing)}"
    if not {"concurrency", "batch", "rate"} & set(header):
        return "missing column concurrency, batch or rate (one of the three, per row)"
    return ""


def _predict_csv(path: Path, out_path: Path | None, catalog: Catalog) -> int:
    try:
        return _predict_rows(path, out_path, catalog)
    except UnicodeDecodeError as err:
        return exits.fail(f"{path}: not a UTF-8 text CSV ({err.reason}); export it as CSV text")


def _predict_rows(path: Path, out_path: Path | None, catalog: Catalog) -> int:
    with path.open(newline="", encoding="utf-8-sig") as handle:
        reader = csv.DictReader(handle)
        problem = _column_problem(reader.fieldnames or [])
        if problem:
            return exits.fail(f"{path}: {problem}; expected {CSV_COLUMNS}")
        rows = [predict_row(row, catalog=catalog) for row in reader]
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
    return exit_codes.OK


# ---------------------------------------------------------------- registration


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from err
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be >= 1")
    return value


def _positive_rate(text: str) -> float:
    """``--request-rate``: a positive, finite number of requests per second."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give requests per second, a number > 0")
    return value


def register(subparsers: Any) -> None:
    """Add ``rooftop predict`` (see rooftop_cli.main)."""
    predict = subparsers.add_parser(
        "predict",
        help="predict TPOT/TTFT/throughput of scenarios",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    predict.add_argument(
        "--csv",
        metavar="IN.csv",
        help=f"predict every row and write CSV; columns: {CSV_COLUMNS}. The flags that "
        "describe one scenario, and -o, are refused beside it (each row names its own)",
    )
    predict.add_argument(
        "--out", metavar="OUT.csv", help="with --csv: where to write (default stdout)"
    )
    add_output_option(predict, FORMATS, None, json_alias=True, note="default json; not with --csv")
    predict.add_argument("--model", help="catalog id, Hugging Face repo id or alias")
    predict.add_argument(
        "--model-config",
        metavar="config.json",
        help="the model's Hugging Face config.json, for a model outside the catalog (named "
        "--model, else by the config; CSV rows ask for it by that name)",
    )
    predict.add_argument("--catalog", metavar="FILE.yaml", help="your GPU/model catalog overrides")
    scenario: dict[str, Any] = {"action": _Scenario}
    predict.add_argument("--gpu", **scenario, help="catalog GPU id or common name (H100 80GB HBM3)")
    predict.add_argument(
        "--tp", **scenario, type=_positive_int, default=DEFAULT_TP, help="tensor-parallel size"
    )
    predict.add_argument(
        "--weight-dtype",
        **scenario,
        default="",
        help="bf16, fp16, fp8, int8, int4 or fp4 (default: the format the model name's "
        "checkpoint suffix states, such as -FP8 or -AWQ, else bf16)",
    )
    predict.add_argument(
        "--kv-dtype",
        **scenario,
        choices=KV_DTYPES,
        default=KvDtype.AUTO.value,
        help="the KV cache's dtype, as a ServingTarget's kvDtypes: auto (the model's own "
        "16-bit dtype), bf16, fp16 or fp8 (vLLM has no int8 or int4 KV cache)",
    )
    predict.add_argument(
        "--isl", **scenario, type=_positive_int, default=DEFAULT_ISL, help="input tokens"
    )
    predict.add_argument(
        "--osl", **scenario, type=_positive_int, default=DEFAULT_OSL, help="output tokens"
    )
    group = predict.add_mutually_exclusive_group()
    group.add_argument(
        "--concurrency",
        **scenario,
        type=_positive_int,
        help="a closed-loop benchmark of this many clients (continuous batching): they "
        "start together and each sends its next request as its answer ends, as vllm bench "
        "serve --max-concurrency does",
    )
    group.add_argument("--batch", **scenario, type=_positive_int, help="one static batch")
    group.add_argument(
        "--request-rate",
        **scenario,
        type=_positive_rate,
        metavar="REQ/S",
        help="an open-loop benchmark: requests sent at random (Poisson) at this mean rate, "
        "as vllm bench serve --request-rate does; above what the engine serves the TTFT "
        "is unbounded and the error says so",
    )
    predict.add_argument(
        "--num-prompts",
        **scenario,
        type=_positive_int,
        help="with --concurrency: the requests the run's TTFT averages over (the first "
        f"wave's included; default {DEFAULT_NUM_PROMPTS}, vllm bench serve's)",
    )
    predict.add_argument(
        "--lengths",
        **scenario,
        choices=LENGTHS,
        help="with --concurrency: fixed (the default: every answer --osl tokens, so the "
        "clients stay in step and each wave's prompts queue for the prefill) or varied "
        "(answers of different lengths: the waves spread out)",
    )
    predict.add_argument(
        "--engine",
        **scenario,
        default="vllm",
        help="vllm, sglang, trtllm or nim: whose measured kernel curves to use",
    )
    predict.add_argument(
        "--explain",
        action="store_true",
        help="where the decode step's time goes, against its physical floor: an "
        "explanation list in JSON and YAML, lines under a table",
    )
    predict.set_defaults(func=exits.guarded(functools.partial(cmd_predict, parser=predict)))
