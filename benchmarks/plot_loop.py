"""Draw the closed-loop run recorded by the ``loop`` e2e test (docs/loop.md's figure).

    ROOFTOP_LOOP_RECORD=docs/loop-run.json .venv/bin/pytest -m loop tests/e2e/test_loop.py
    .venv/bin/python benchmarks/plot_loop.py docs/loop-run.json docs/img/loop.png

(``make loop-figure`` runs both.) Top: the p90 TPOT the operator read from Prometheus
(``status.observed.tpotMs``), each request's TPOT as the load generator saw it, and the
SLO line. Bottom: desired replicas, engines serving, and the offered load. The shaded
span is the Prometheus outage.
"""

from __future__ import annotations

import argparse
import json
import sys
from math import nan
from pathlib import Path
from typing import Any


def spans(samples: list[dict[str, Any]], key: str, value: Any) -> list[tuple[float, float]]:
    """[(start, end)] of the stretches where ``sample[key] == value``."""
    out: list[tuple[float, float]] = []
    start: float | None = None
    for s in samples:
        if s.get(key) == value and start is None:
            start = s["t_s"]
        elif s.get(key) != value and start is not None:
            out.append((start, s["t_s"]))
            start = None
    if start is not None and samples:
        out.append((start, samples[-1]["t_s"]))
    return out


def plot(run: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples = [s for s in run["samples"] if "error" not in s]
    t = [s["t_s"] for s in samples]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6), sharex=True,
                                      gridspec_kw={"height_ratios": [3, 2]})  # fmt: skip
    requests = run.get("requests", [])
    top.scatter([r["t_s"] for r in requests], [r["tpot_ms"] for r in requests], s=6,
                color="0.7", label="each request (client)")  # fmt: skip
    # NaN where there is no reading (or no Prometheus): a gap, not a made-up line
    observed = [
        s["observed_tpot_ms"] if s.get("prometheus_up") and s.get("observed_tpot_ms") else nan
        for s in samples
    ]
    top.plot(t, observed, color="tab:blue", label="p90 TPOT read by the operator")
    top.axhline(run["slo_tpot_ms"], color="tab:red", linestyle="--", label="SLO (p90)")
    top.set_ylabel("TPOT (ms)")
    top.set_ylim(0, max([run["slo_tpot_ms"] * 1.6, *(y for y in observed if y == y)]) * 1.05)
    bottom.step(t, [s["replicas"] for s in samples], where="post", color="tab:green",
                label="replicas (desired)")  # fmt: skip
    bottom.step(t, [s["engines"] for s in samples], where="post", color="tab:olive",
                linestyle=":", label="engines serving")  # fmt: skip
    bottom.set_ylabel("replicas")
    bottom.set_ylim(0, max(s["replicas"] for s in samples) + 1)
    load = bottom.twinx()
    load.step(t, [s["offered_rps"] for s in samples], where="post", color="tab:purple",
              alpha=0.6, label="offered load")  # fmt: skip
    load.set_ylabel("offered load (req/s)")
    load.set_ylim(0, max(s["offered_rps"] for s in samples) * 1.4)
    for ax in (top, bottom):
        for a, b in spans(samples, "prometheus_up", False):
            ax.axvspan(a, b, color="0.9", zorder=0)
    top.text(0.99, 0.97, "shaded: Prometheus down", transform=top.transAxes, ha="right",
             va="top", fontsize=8, color="0.4")  # fmt: skip
    bottom.set_xlabel("seconds since the ServingTarget was applied")
    top.legend(loc="upper left", fontsize=8)
    handles = bottom.get_legend_handles_labels()
    extra = load.get_legend_handles_labels()
    bottom.legend(handles[0] + extra[0], handles[1] + extra[1], loc="upper left", fontsize=8)
    top.set_title("Rooftop closed loop: 3x load step, scale-out, outage hold, scale-in")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("timeline", type=Path, help="JSON written via ROOFTOP_LOOP_RECORD")
    p.add_argument("out", type=Path, help="PNG to write")
    args = p.parse_args(argv)
    try:
        run = json.loads(args.timeline.read_text())
        if not run.get("samples"):
            raise ValueError("no samples recorded")
    except (OSError, ValueError) as err:
        print(f"plot_loop: {args.timeline}: {err}", file=sys.stderr)
        return 2
    plot(run, args.out)
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
