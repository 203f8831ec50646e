"""Tensor parallelism all-reduces over the link that joins its GPUs.

NVLink bridges join H100 NVL cards in pairs; a group of four or eight talks over PCIe.
NVIDIA's DLI set in ``data/measured/calibration.csv`` timed Llama-2-70B at TP 4 and 8 on
H100 NVL: with NVLink assumed for all of them the planner was 40-57 % fast on their TPOT.
"""

from __future__ import annotations

import statistics
from collections import defaultdict

from rooftop_fit import kernel_fit
from rooftop_planner.catalog import load_catalog
from rooftop_planner.efficiency import load_efficiency

CATALOG = load_catalog()


def test_a_group_past_the_bridged_pair_runs_over_pcie() -> None:
    nvl = CATALOG.gpu("h100-nvl")
    assert nvl.link_bytes_per_s(2) == nvl.interconnect_bytes_per_s == 300e9
    assert nvl.link_bytes_per_s(4) == nvl.link_bytes_per_s(8) == 64e9
    sxm = CATALOG.gpu("h100-sxm")  # NVSwitch: every GPU of the node on the same links
    assert sxm.link_group_gpus == 0 and sxm.link_bytes_per_s(8) == sxm.interconnect_bytes_per_s


def test_dli_h100_nvl_tpot_at_tp4_and_tp8_is_predicted_within_25_percent() -> None:
    measurements = kernel_fit.load_measurements(kernel_fit.DEFAULT_DATA, load_efficiency())
    errors: dict[int, list[float]] = defaultdict(list)
    for o in measurements:
        dep = o.scenario.deployment
        if o.source == "nvidia-dli" and o.metric == "tpot_s" and dep.gpu.id == "h100-nvl":
            predicted = o.scenario.predict(check_context=False).tpot_s
            errors[dep.tp].append(predicted / o.measured - 1.0)
    assert len(errors[4]) >= 30 and len(errors[8]) >= 30
    for tp in (4, 8):
        assert abs(statistics.median(errors[tp])) < 0.25, (tp, statistics.median(errors[tp]))
