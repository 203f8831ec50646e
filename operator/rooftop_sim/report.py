"""What a simulated run achieved: SLO attainment, cost, the replica timeline, a plot.

Attainment is per request, over ALL requests of the trace: a request meets the TPOT
SLO when it finished and its mean time per output token (first to last token, over
``out - 1`` gaps, as vLLM's ``request_time_per_output_token``) is within the bound; a
one-token answer has no TPOT and meets it trivially once finished. It meets the TTFT
SLO when its first token came within the bound. Rejected or unfinished requests miss
both. The token share weights each request by its output tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from rooftop_sim.cluster import SimResult

if TYPE_CHECKING:
    from matplotlib.figure import Figure

BoolArray = npt.NDArray[np.bool_]


@dataclass(frozen=True)
class Slo:
    """The SLO bounds a run is judged against (ms; TTFT optional)."""

    tpot_ms: float
    ttft_ms: float | None = None


@dataclass(frozen=True)
class RunAttainment:
    """Shares 0..1 of requests and of output tokens within each SLO (TTFT None: no SLO)."""

    tpot_requests: float
    tpot_tokens: float
    ttft_requests: float | None
    ttft_tokens: float | None
    requests: int


def _masks(res: SimResult, slo: Slo) -> tuple[BoolArray, BoolArray | None]:
    done = np.isfinite(res.finished_s)
    tpot = res.tpot_s
    tpot_ok = done & (np.isnan(tpot) | (tpot * 1e3 <= slo.tpot_ms))
    if slo.ttft_ms is None:
        return tpot_ok, None
    ttft = res.first_token_s - res.workload.arrival_s
    with np.errstate(invalid="ignore"):
        ttft_ok = np.isfinite(ttft) & (ttft * 1e3 <= slo.ttft_ms)
    return tpot_ok, ttft_ok


def attainment(res: SimResult, slo: Slo, skip: int = 0) -> RunAttainment:
    """Shares of requests (and tokens) within the SLOs, ignoring the first ``skip``."""
    tpot_ok, ttft_ok = _masks(res, slo)
    tokens = res.workload.output_tokens[skip:].astype(np.float64)
    total = max(float(tokens.sum()), 1.0)
    n = max(len(tokens), 1)

    def share(mask: BoolArray) -> tuple[float, float]:
        m = mask[skip:]
        return float(m.sum()) / n, float(tokens[m].sum()) / total

    t_req, t_tok = share(tpot_ok)
    f_req, f_tok = share(ttft_ok) if ttft_ok is not None else (None, None)
    return RunAttainment(t_req, t_tok, f_req, f_tok, len(tokens))


# Output-length bands (tokens) for the TPOT miss breakdown. A request's TPOT averages
# its step times over its decode steps, so a short answer that shares a few steps with
# a long prompt's prefill chunk is slowed far more than a long one: misses gather in
# the short bands, which is where to look when a percentile SLO slips.
OUTPUT_BANDS = (1, 20, 50, 100, 200, 500)


def tpot_misses_by_output(res: SimResult, slo: Slo) -> list[dict[str, Any]]:
    """Per output-length band: requests, TPOT misses and the band's miss share.

    Bands are ``[lower, next lower)`` output tokens; the last is open-ended.
    """
    tpot_ok, _ = _masks(res, slo)
    out = res.workload.output_tokens
    rows = []
    for i, lower in enumerate(OUTPUT_BANDS):
        upper = OUTPUT_BANDS[i + 1] if i + 1 < len(OUTPUT_BANDS) else None
        band = (out >= lower) & (out < upper) if upper else out >= lower
        n, missed = int(band.sum()), int((band & ~tpot_ok).sum())
        rows.append(
            {
                "output_tokens": [lower, upper],
                "requests": n,
                "tpot_misses": missed,
                "miss_share": round(missed / n, 5) if n else None,
            }
        )
    return rows


def cost(res: SimResult) -> tuple[float, float]:
    """(GPU-hours, USD) of every pod from creation to deletion, within the horizon (a
    mixed fleet's fixed pools included)."""
    hours = res.pod_seconds / 3600.0
    usd = hours * res.usd_per_pod_hour if res.policy_usd is None else res.policy_usd
    gpu_hours = hours * res.gpus_per_pod if res.policy_gpu_hours is None else res.policy_gpu_hours
    return gpu_hours + res.fixed_gpu_hours, usd + res.fixed_usd


def replica_changes(res: SimResult) -> list[tuple[float, int]]:
    """(time s, desired replicas) at each change, starting with the first scrape."""
    out: list[tuple[float, int]] = []
    for tick in res.timeline:
        if not out or out[-1][1] != tick.replicas:
            out.append((round(tick.t_s, 1), tick.replicas))
    return out


def summary(res: SimResult, slo: Slo, reality_factor: float) -> dict[str, Any]:
    """The ``--json`` object for one run."""
    att = attainment(res, slo)
    gpu_h, usd = cost(res)
    pods_s = res.pod_seconds + res.fixed_pod_seconds  # a mixed fleet's every pod
    tpots = res.tpot_s[np.isfinite(res.tpot_s)] * 1e3
    return {
        "policy": res.policy,
        "slo_attainment_tpot": round(att.tpot_requests, 5),
        "slo_attainment_ttft": None if att.ttft_requests is None else round(att.ttft_requests, 5),
        "gpu_hours": round(gpu_h, 4),
        "usd": round(usd, 4),
        "requests": att.requests,
        "token_attainment_tpot": round(att.tpot_tokens, 5),
        "token_attainment_ttft": None if att.ttft_tokens is None else round(att.ttft_tokens, 5),
        "rejected": res.rejected,
        "rejected_by_reason": res.rejected_by_reason,
        "tpot_p50_ms": _pct(tpots, 0.5),
        "tpot_p99_ms": _pct(tpots, 0.99),
        "reality_factor": reality_factor,
        "horizon_s": round(res.workload.horizon_s, 1),
        "mean_replicas": round(pods_s / max(res.workload.horizon_s, 1e-9), 3),
        "replica_hours": round(pods_s / 3600.0, 4),
        # prompt tokens found in the pods' prefix caches over those looked up
        "prefix_hit_ratio": (
            round(res.prefix_hits / res.prefix_queries, 5) if res.prefix_queries else None
        ),
        "replica_timeline": replica_changes(res),
        "tpot_misses_by_output_tokens": tpot_misses_by_output(res, slo),
        "wall_s": round(res.wall_s, 2),
        "notes": res.notes,
    }


def _pct(values: npt.NDArray[np.float64], q: float) -> float | None:
    return round(float(np.quantile(values, q)), 2) if len(values) else None


def text(s: dict[str, Any], slo: Slo) -> str:
    """Human-readable lines for one run's summary."""
    ttft = s["slo_attainment_ttft"]
    ttft_txt = "n/a (no TTFT SLO)" if ttft is None else f"{ttft:.2%} of requests"
    timeline = ", ".join(f"{t / 60:.0f}m:{n}" for t, n in s["replica_timeline"][:24])
    more = " ..." if len(s["replica_timeline"]) > 24 else ""
    lines = [
        f"policy {s['policy']} (reality factor {s['reality_factor']:g}, "
        f"{s['requests']} requests over {s['horizon_s'] / 60:.1f} min)",
        f"  within TPOT {slo.tpot_ms:g} ms: {s['slo_attainment_tpot']:.2%} of requests, "
        f"{s['token_attainment_tpot']:.2%} of tokens ({_tpot_percentiles(s)})",
        f"  within TTFT{'' if slo.ttft_ms is None else f' {slo.ttft_ms:g} ms'}: {ttft_txt}",
        f"  cost: {s['gpu_hours']:.2f} GPU-hours, ${s['usd']:.2f} "
        f"(mean {s['mean_replicas']:.2f} replicas); rejected {s['rejected']}",
        f"  replicas (minute:count): {timeline}{more}",
    ]
    if s["prefix_hit_ratio"]:
        lines.append(f"  prefix cache: {s['prefix_hit_ratio']:.1%} of prompt tokens found")
    bands = [b for b in s["tpot_misses_by_output_tokens"] if b["tpot_misses"]]
    if bands:
        lines.append(
            "  TPOT misses by output tokens: "
            + ", ".join(
                f"{b['output_tokens'][0]}-{b['output_tokens'][1] or ''}: {b['tpot_misses']} "
                f"of {b['requests']} ({b['miss_share']:.1%})"
                for b in bands
            )
        )
    lines += [f"  rejected {n}: {why}" for why, n in s["rejected_by_reason"].items()]
    lines += [f"  note: {n}" for n in s["notes"]]
    return "\n".join(lines)


def _tpot_percentiles(s: dict[str, Any]) -> str:
    """The TPOT percentiles (p50, p99) in ms, or why there are none."""
    if s["tpot_p50_ms"] is None:
        return "TPOT percentiles n/a: no request finished with two or more output tokens"
    return f"p50 {s['tpot_p50_ms']} ms, p99 {s['tpot_p99_ms']} ms"


COMPARISON_BASELINE = "oracle"


def comparison(summaries: list[dict[str, Any]], slo: Slo) -> str:
    """One row per policy: SLO attainment, mean $/h, cost against the oracle's, replica-
    and GPU-hours, rejected requests (``--policy all``)."""
    base = next((s for s in summaries if s["policy"] == COMPARISON_BASELINE), None)
    ttft = "n/a" if slo.ttft_ms is None else f"{slo.ttft_ms:g} ms"
    head = (
        f"{'policy':<16} {'TPOT met':>9} {'TTFT met':>9} {'$/h mean':>9} "
        f"{'x oracle':>9} {'replica-h':>10} {'GPU-h':>8} {'rejected':>9}"
    )
    lines = [
        f"comparison (TPOT {slo.tpot_ms:g} ms, TTFT {ttft}; met: share of all requests; "
        f"x oracle: cost / {COMPARISON_BASELINE}'s):",
        head,
    ]
    for s in summaries:
        hours = max(s["horizon_s"], 1e-9) / 3600.0
        lines.append(
            f"{s['policy']:<16} {_share(s['slo_attainment_tpot']):>9} "
            f"{_share(s['slo_attainment_ttft']):>9} {s['usd'] / hours:>9.2f} "
            f"{_ratio(s['usd'], base):>9} {s['replica_hours']:>10.2f} "
            f"{s['gpu_hours']:>8.2f} {s['rejected']:>9}"
        )
    if base is None:
        lines.append(f"x oracle: n/a, the {COMPARISON_BASELINE} policy did not run")
    return "\n".join(lines)


def _share(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2%}"


def _ratio(usd: float, base: dict[str, Any] | None) -> str:
    return "n/a" if base is None or not base["usd"] else f"{usd / base['usd']:.2f}"


def plot(results: list[SimResult], slo: Slo, path: str) -> None:
    """Load, observed TPOT percentile vs the SLO, and replicas over time (PNG)."""
    fig = figure(results, slo)
    fig.savefig(path, dpi=100)
    import matplotlib.pyplot as plt  # after figure() chose the backend

    plt.close(fig)


def figure(results: list[SimResult], slo: Slo) -> Figure:
    """The plot's figure: arrivals; each policy's TPOT percentile and pods over time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(3, 1, figsize=(10, 8), sharex=True)
    load, lat, reps = axes
    first = results[0]
    load.plot([t.t_s / 60 for t in first.timeline], [t.rate for t in first.timeline], "k-")
    load.set_ylabel("arrivals (req/s)")
    for res in results:
        ts = [t.t_s / 60 for t in res.timeline]
        lat.plot(ts, [t.tpot_ms for t in res.timeline], label=res.policy, lw=1)
        reps.step(ts, [t.alive for t in res.timeline], where="post", label=res.policy, lw=1)
    lat.axhline(slo.tpot_ms, color="r", ls="--", lw=1, label="SLO")
    lat.set_ylabel("TPOT percentile (ms)")
    lat.legend(fontsize=8)
    reps.set_ylabel("pods (incl. starting)")
    reps.yaxis.set_major_locator(MaxNLocator(integer=True))  # no 2.5 pods
    reps.set_xlabel("minutes")
    reps.legend(fontsize=8)
    fig.tight_layout()
    return fig
