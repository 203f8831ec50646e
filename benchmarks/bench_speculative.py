"""Speculative decoding as the planner prices it: the seed's case and a 70B target.

    python benchmarks/bench_speculative.py [--sim | --loop | --search] [--method ngram|suffix]

Llama-3-70B in fp8 on 4 and 8 H100s with a Llama-3-8B fp8 draft model (the
drafter catalog's draft_model for llama-3-70b) at a per-token acceptance of 0.7 and
0.8: the decode TPOT with draft length 3 over the TPOT without, per batch size, and
the batch from which it stops paying. Then a 70B chat target whose TPOT SLO (14 ms)
is beyond 70 tokens/s per user, planned with and without ``constraints.speculative``.
All figures are the planner's predictions from the measured kernel tables (no GPU
timed a speculative step here).

``--sim``: the planner's decode TPOT against the simulated engine's, which speculates
on its own (``rooftop_sim.engine``: per-request acceptance drawn around the mean, the
drafts run as query tokens through its measured tables, the drafter's forwards timed
by them too), for acceptance 0.5, 0.7, 0.9, draft lengths 1-5 and batches 1-64, on the
seed's engine (4 H100s, fp8); K = 0 is the same engine without speculation.

``--loop``: the closed loop (``rooftop simulate``) on examples/speculative-70b.yaml,
which declares acceptance 0.7, where the drafts truly meet 0.3, 0.5, 0.7 or 0.9 (seeds
0-2), against the same loop told the true acceptance, over the bundled hour of Azure
conversations (the loop measures the acceptance, plans the target again with it and
rolls the new plan out: a 10-minute trace is mostly that transient). ``--method ngram``
runs it drafting by prompt lookup in place of the example's draft model.

``--search``: how long the search over every GPU takes with and without speculation
(``--method``: drafting by that method, at acceptance 0.7, in place of the draft model).
"""

from __future__ import annotations

import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from rooftop_api.spec import ServingTargetSpec
from rooftop_planner import speculative
from rooftop_planner.catalog import load_catalog
from rooftop_planner.efficiency import load_efficiency
from rooftop_planner.perf import EngineShape
from rooftop_planner.search import plan_target
from rooftop_sim.engine.core import EngineConfig, EngineCore, Request, Speculation
from rooftop_sim.engine.truth import TruthModel

ROOT = Path(__file__).resolve().parents[1]
BATCHES = (1, 4, 16, 32, 64, 128, 256)
CONTEXT = 1500  # tokens a running sequence holds: 1,000-token prompts, 1,000-token answers


def tpot_ratio(dep: EngineShape, spec: speculative.Speculation, batch: int) -> float:
    """Decode TPOT with draft length 3 over TPOT without, at ``batch`` sequences."""
    with_k3 = speculative.decode_tpot_s(dep, spec, batch, CONTEXT, 3)
    return with_k3 / speculative.decode_tpot_s(dep, spec, batch, CONTEXT, 0)


def ratio_table() -> None:
    catalog = load_catalog()
    model, gpu = catalog.model("llama-3-70b"), catalog.gpus["h100-sxm"]
    eff = load_efficiency().lookup(gpu, "vllm")
    heads = " | ".join(f"B={b}" for b in BATCHES)
    print(f"| TP | acceptance | {heads} | K=3 stops paying at |")
    print("|---" * (len(BATCHES) + 3) + "|")
    for tp in (4, 8):
        dep = EngineShape(model, gpu, tp, weight_dtype="fp8", kv_dtype="fp8", efficiency=eff)
        for rate in (0.7, 0.8):
            (spec,), _ = speculative.options(model, ["draft_model"], rate, catalog)
            cross = next((b for b in range(1, 513) if tpot_ratio(dep, spec, b) >= 1.0), None)
            cells = " | ".join(f"{tpot_ratio(dep, spec, b):.2f}" for b in BATCHES)
            print(f"| {tp} | {rate} | {cells} | {cross} |")


def plans() -> None:
    base: dict[str, Any] = {
        "model": "llama-3-70b",
        "slo": {"tpotMs": 14, "tpotPercentile": "p90"},
        "workload": {
            "requestsPerSecond": 2,
            "promptTokens": {"mean": 1000},
            "outputTokens": {"mean": 300},
        },
        "budget": {"usdPerHour": 500},
        "constraints": {"gpuTypes": ["h100-sxm"], "weightDtypes": ["fp8"]},
    }
    cases = [("without", base)]
    for method, acceptance in (
        ("draft_model", 0.7),
        ("ngram", 0.7),
        ("ngram", 0.5),
        ("ngram", 0.3),
        ("suffix", 0.7),
        ("suffix", 0.5),
        ("suffix", 0.3),
    ):
        cases.append((f"{method}, acceptance {acceptance}", speculating(base, method, acceptance)))
    deepseek = {
        **base,
        "model": "deepseek-ai/DeepSeek-V3",
        "modelConfig": json.loads(DEEPSEEK_V3.read_text()),
        "constraints": {"gpuTypes": ["h200-sxm"], "weightDtypes": ["fp8"]},
        "budget": {"usdPerHour": 1000},
    }
    for tpot in (20, 30):
        slo = {**deepseek, "slo": {"tpotMs": tpot, "tpotPercentile": "p90"}}
        cases += [(f"DeepSeek-V3 at {tpot} ms, without", slo),
                  (f"DeepSeek-V3 at {tpot} ms, mtp", speculating(slo, "mtp", None))]  # fmt: skip
    for name, spec in cases:
        plan = plan_target(ServingTargetSpec.model_validate(spec)).plan
        if plan is None:
            print(f"{name}: no plan meets the SLO")
            continue
        print(
            f"{name}: {plan.replicas}x TP{plan.tp} {plan.gpu}, cap {plan.max_num_seqs}, "
            f"p90 TPOT {plan.tpot_ms:.1f} ms, ${plan.usd_per_hour:.2f}/h"
        )
        if plan.speculative_config:
            print(f"  --speculative-config {plan.speculative_config}")


# DeepSeek-V3's config.json as published (the keys that shape it): its MTP layer
DEEPSEEK_V3 = ROOT / "tests" / "unit" / "planner" / "hf_configs" / "deepseek-v3.json"


def speculating(spec: dict[str, Any], method: str, acceptance: float | None) -> dict[str, Any]:
    """``spec`` allowed to speculate by ``method`` (at ``acceptance``; None: published)."""
    workload = dict(spec["workload"])
    if acceptance is not None:
        workload["acceptanceRate"] = acceptance
    constraints = {**spec["constraints"], "speculative": [method]}
    return {**spec, "constraints": constraints, "workload": workload}


def sim_tpot_s(k: int, acceptance: float, batch: int, steps: int = 400, seed: int = 0) -> float:
    """Decode TPOT the simulated engine serves at ``batch`` running sequences, drafting
    ``k`` tokens each step: a closed loop of 1,000-token prompts and 1,000-token
    answers (a finished request is replaced at once), over the steps without prefill
    after a warm-up, as step time x sequences / tokens emitted (s)."""
    catalog = load_catalog()
    truth = TruthModel.for_deployment("llama-3-70b", "h100-sxm", 4, "fp8", "fp8")
    if k:
        truth.with_drafter(catalog.model("llama-3-8b"), "fp8")
    spec = Speculation(((1, 512, k),), acceptance, seed=seed) if k else None
    config = EngineConfig(truth.kv_capacity_tokens(), batch, 8192, 8192, speculation=spec)
    engine = EngineCore(config, truth)
    rng = random.Random(seed)
    made, now, busy, emitted = 0, 0.0, 0.0, 0
    for step in range(steps):
        while engine.num_running + engine.num_waiting < batch:
            made += 1  # answers of 900-1,100 tokens, so replacements do not come in waves
            engine.add_request(Request(f"r{made}", 1000, rng.randint(900, 1100), now))
        res = engine.step(now)
        assert res is not None
        now = res.end_s
        if step >= steps // 4 and res.prefill_tokens == 0:
            busy += res.duration_s * res.decode_tokens
            emitted += len(res.tokens)
    return busy / emitted


def sim_table() -> None:
    """The planner's decode TPOT over the simulated engine's, per acceptance, draft
    length and batch (K = 0: without speculation, the planner's usual error)."""
    catalog = load_catalog()
    model, gpu = catalog.model("llama-3-70b"), catalog.gpus["h100-sxm"]
    dep = EngineShape(model, gpu, 4, "fp8", "fp8", load_efficiency().lookup(gpu, "vllm"))
    batches = (1, 4, 16, 64)
    print("| acceptance | K | " + " | ".join(f"B={b}" for b in batches) + " |")
    print("|---" * (len(batches) + 2) + "|")
    errors: dict[bool, list[float]] = {False: [], True: []}
    for rate in (0.5, 0.7, 0.9):
        (spec,), _ = speculative.options(model, ["draft_model"], rate, catalog)
        for k in range(0, 6):
            if k == 0 and rate != 0.7:
                continue
            cells = []
            for b in batches:
                planned = speculative.decode_tpot_s(dep, spec, b, CONTEXT, k)
                ratio = planned / sim_tpot_s(k, rate, b)
                errors[k > 0].append(abs(ratio - 1.0))
                cells.append(f"{ratio:.2f}")
            print(f"| {rate if k else '-'} | {k} | " + " | ".join(cells) + " |")
    for spec_on, errs in errors.items():
        label = "with speculation" if spec_on else "without"
        print(f"median |error| {label}: {statistics.median(errs):.1%} over {len(errs)} points")


LOOP_TARGET = ROOT / "examples" / "speculative-70b.yaml"
LOOP_TRACE = ROOT / "examples" / "traces" / "azure_llm_2023_conv.csv"


def simulate(manifest: Path, acceptance: float, seed: int) -> dict[str, Any]:
    """``rooftop simulate`` of the loop on ``manifest`` with drafts accepted at
    ``acceptance``: its JSON report."""
    command = [sys.executable, "-m", "rooftop_cli.main", "simulate", str(manifest),
               "--trace", str(LOOP_TRACE), "--acceptance", str(acceptance),
               "--seed", str(seed), "--output", "json"]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def declared_as(acceptance: float, folder: Path, method: str | None = None) -> Path:
    """The loop target's manifest declaring ``acceptance`` (what an oracle knows),
    drafting by ``method`` (None: the example's)."""
    target = yaml.safe_load(LOOP_TARGET.read_text())
    target["spec"]["workload"]["acceptanceRate"] = acceptance
    if method is not None:
        target["spec"]["constraints"]["speculative"] = [method]
    path = folder / f"declared-{acceptance}-{method}.yaml"
    path.write_text(yaml.safe_dump(target))
    return path


def loop_table(seeds: tuple[int, ...] = (0, 1, 2), method: str | None = None) -> None:
    """The loop on examples/speculative-70b.yaml (declared acceptance 0.7; ``method``
    in place of its draft model) where the drafts truly meet 0.3-0.9, against the same
    loop told the true acceptance (the oracle that knows it): TPOT attainment and cost,
    worst of the seeds, and what the loop's pods ended on."""
    print("| true acceptance | within TPOT (declared 0.7) | within TPOT (told the truth) "
          "| cost, declared / told | the declared loop's pods ended on |")  # fmt: skip
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as folder:
        declared = declared_as(0.7, Path(folder), method)
        for truth in (0.3, 0.5, 0.7, 0.9):
            told = declared_as(truth, Path(folder), method)
            ours = [simulate(declared, truth, seed) for seed in seeds]
            oracle = [simulate(told, truth, seed) for seed in seeds]
            ratios = [a["usd"] / b["usd"] for a, b in zip(ours, oracle, strict=True)]
            worst = min(r["slo_attainment_tpot"] for r in ours)
            worst_told = min(r["slo_attainment_tpot"] for r in oracle)
            ended = sorted({ended_on(r) for r in ours})
            print(f"| {truth} | {worst:.1%} | {worst_told:.1%} | "
                  f"{min(ratios):.2f}-{max(ratios):.2f} | {'; '.join(ended)} |")  # fmt: skip


def ended_on(report: dict[str, Any]) -> str:
    """What the loop's pods ran at the end: its re-planned engine, else the plan's."""
    ran = [n for n in report["notes"] if n.startswith("its pods then ran ")]
    return ran[-1].removeprefix("its pods then ran ") if ran else "as planned"


def search_time(repeats: int = 5, method: str | None = None) -> None:
    """The search over every GPU for the loop target with and without
    ``constraints.speculative`` (``method`` in place of the example's drafter; best of
    ``repeats``, after one warm-up run each), and their ratio, measured in the same
    run."""
    target = yaml.safe_load(LOOP_TARGET.read_text())["spec"]
    every_gpu = {**target["constraints"], "gpuTypes": None}
    if method is not None:
        every_gpu["speculative"] = [method]
        target["workload"] = {**target["workload"], "acceptanceRate": 0.7}
    without = {k: v for k, v in every_gpu.items() if k != "speculative"}
    times = {}
    for name, constraints in (("with", every_gpu), ("without", without)):
        spec = ServingTargetSpec.model_validate({**target, "constraints": constraints})
        plan_target(spec)
        runs = []
        for _ in range(repeats):
            start = time.perf_counter()
            plan_target(spec)
            runs.append(time.perf_counter() - start)
        times[name] = min(runs)
        print(f"search {name} speculation: {times[name] * 1e3:.0f} ms")
    print(f"ratio: {times['with'] / times['without']:.1f}x")


if __name__ == "__main__":
    # --method ngram or suffix: that drafter in place of the example's
    method = sys.argv[sys.argv.index("--method") + 1] if "--method" in sys.argv else None
    if "--search" in sys.argv:
        search_time(method=method)
    elif "--loop" in sys.argv:
        loop_table(method=method)
    elif "--sim" in sys.argv:
        sim_table()
    else:
        ratio_table()
        print()
        plans()
