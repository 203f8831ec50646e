"""The catalog's default prices follow one rule, checked against data/gpus_reference.csv.

A GPU priced ``sources.price: ref`` costs the midpoint of the on-demand range of its ref
row (``sources.ref_row``). Any other price is an ``exception:`` that says why and where
the figure is from, and is allowed only where the reference has no range to take the
midpoint of: a GPU cannot quietly use one provider's list price while the others use
ranges (GH200 at Lambda's $1.49 won most unrestricted plans that way).
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from rooftop_planner.catalog import GpuSpec, load_catalog

REFERENCE = Path(__file__).parents[3] / "data" / "gpus_reference.csv"
LOW, HIGH = "on_demand_usd_per_gpu_hr_low", "on_demand_usd_per_gpu_hr_high"
CATALOG = load_catalog()


def reference_rows() -> dict[str, dict[str, str]]:
    with REFERENCE.open(newline="") as handle:
        return {row["gpu"]: row for row in csv.DictReader(handle)}


def price_range(gpu: GpuSpec) -> tuple[float, float] | None:
    """The on-demand range of the GPU's ref row, or None where it has none."""
    row = reference_rows().get(gpu.sources.get("ref_row", ""))
    if row is None or not row[LOW] or not row[HIGH]:
        return None
    return float(row[LOW]), float(row[HIGH])


@pytest.mark.parametrize("gpu", CATALOG.gpus.values(), ids=lambda g: g.id)
def test_every_price_is_the_reference_midpoint_or_a_documented_exception(gpu: GpuSpec) -> None:
    rule = gpu.sources.get("price", "")
    found = price_range(gpu)
    if rule == "ref":
        assert found is not None, f"{gpu.id}: sources.ref_row names no ref row with a range"
        low, high = found
        assert gpu.usd_per_gpu_hour == pytest.approx((low + high) / 2, abs=5e-4), (
            f"{gpu.id}: ${gpu.usd_per_gpu_hour}/h is not the midpoint of ${low}..${high}"
        )
    else:
        assert rule.startswith("exception: ") and len(rule) > 40, (
            f"{gpu.id}: price source {rule!r} is neither ref nor a documented exception"
        )
        assert found is None, f"{gpu.id}: ref has a range {found}; use its midpoint"


def test_the_exceptions_are_only_gpus_the_reference_cannot_price() -> None:
    exceptions = {g.id for g in CATALOG.gpus.values() if g.sources.get("price") != "ref"}
    assert exceptions == {"l40", "tpu-v5e"}


def test_gh200_is_priced_like_every_other_gpu() -> None:
    """The regression: one provider's list price ($1.49) made GH200 win most plans."""
    gh200 = CATALOG.gpus["gh200"]
    assert gh200.sources["price"] == "ref" and gh200.usd_per_gpu_hour == pytest.approx(2.29)
