"""The throughput-latency plane: one curve per deployment shape.

x = time per output token (ms), y = output tokens/s per GPU; each curve sweeps the
running batch from 1 to the KV limit. The SLO is a vertical line; the chosen plan's
operating point is marked. ``rooftop plan --plot PATH`` draws it; the path is checked
before any planning by ``rooftop_api.output.plot_path_problem``.
"""

from __future__ import annotations

from rooftop_api.spec import ServingTargetSpec
from rooftop_planner import perf
from rooftop_planner.batching import predict_continuous
from rooftop_planner.catalog import Catalog
from rooftop_planner.efficiency import load_efficiency
from rooftop_planner.hf_config import resolve_model
from rooftop_planner.plan import Plan
from rooftop_planner.result import SearchResult
from rooftop_planner.workload import from_spec

BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


def _curve(
    plan: Plan, spec: ServingTargetSpec, catalog: Catalog
) -> tuple[list[float], list[float]]:
    gpu = catalog.gpu(plan.gpu)
    dep = perf.EngineShape(
        model=resolve_model(spec, catalog),
        gpu=gpu,
        tp=plan.tp,
        weight_dtype=plan.weight_dtype,
        kv_dtype=plan.kv_dtype,
        efficiency=load_efficiency().lookup(gpu),
    )
    isl = from_spec(spec.workload.prompt_tokens).mean
    osl = from_spec(spec.workload.output_tokens).mean
    xs, ys = [], []
    for batch in BATCHES:
        p = predict_continuous(dep, batch, isl, osl)
        if p.fits and p.batch >= batch * 0.99:
            xs.append(p.tpot_ms)
            ys.append(p.output_tok_s / plan.tp)
    return xs, ys


def plot_plane(result: SearchResult, spec: ServingTargetSpec, catalog: Catalog, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    shapes = ([result.plan] if result.plan else []) + result.alternatives[:4]
    for plan in shapes:
        xs, ys = _curve(plan, spec, catalog)
        label = f"{plan.gpu} TP{plan.tp} {plan.weight_dtype}/KV {plan.kv_dtype}"
        ax.plot(xs, ys, marker="o", markersize=3, label=label)
    ax.axvline(
        spec.slo.tpot_ms,
        color="red",
        linestyle="--",
        label=f"SLO {spec.slo.tpot_percentile.value} TPOT {spec.slo.tpot_ms:g} ms",
    )
    if result.plan:
        p = result.plan
        ax.scatter(
            [p.tpot_ms],
            [p.output_tok_s / (p.replicas * p.tp)],
            s=120,
            marker="*",
            color="black",
            zorder=5,
            label="chosen operating point",
        )
    ax.set_xlabel("time per output token (ms)")
    ax.set_ylabel("output tokens/s per GPU")
    ax.set_title(f"Throughput-latency plane: {spec.model}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
