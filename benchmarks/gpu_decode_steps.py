"""Time real decode and prefill steps on a GPU: a Llama layer stack's kernels, as a CUDA graph.

    python benchmarks/gpu_decode_steps.py --gpu h100-sxm --out steps.csv   # needs torch + CUDA
    python benchmarks/gpu_decode_steps.py --prefill --gpu h100-sxm --out prefill.csv

The script needs only PyTorch and PyYAML, the packages a GPU machine has: it reads the
model shapes from the catalog file itself and does not import the planner (whose
dependencies such a machine lacks), so ``Shard.gemm_shapes`` repeats the per-GPU shapes
of ``kernel_model.layer_gemm_shapes``.

What runs is one decode step of a dense Llama model as vLLM runs it, with random weights
(no checkpoint): per layer RMSNorm, the fused QKV GEMM, attention of one new token per
sequence over its cached keys and values, the output projection, a residual add, RMSNorm,
the fused gate/up GEMM, SiLU·mul and the down GEMM; then the final norm and the LM head.
The step is captured once as a CUDA graph and replayed, so the time is the GPU's alone:
vLLM's scheduling, sampling and Python work are not in it (the planner's fitted engine
fixed costs are what stand for them).

Tensor parallelism is timed as one GPU's shard (heads, MLP columns and vocabulary split
``tp`` ways) without the all-reduces, which need ``tp`` GPUs.

Each row is timed four ways, each the median of 20 replays: the step with attention as two
batched matmuls and a softmax (``bmm_step_ms``), the step with PyTorch's fused
scaled-dot-product attention kernel (``sdpa_step_ms``), the step
without attention (``none_step_ms``), and the GEMMs alone on inputs already in the weights'
dtype (``gemms_ms``). So the planner's GEMM and attention terms can be checked separately
(``benchmarks/gpu_decode_vs_planner.py``). Every sequence holds the same context in a
contiguous cache, one per layer.

Weights are bf16 (``F.linear``, cuBLAS) or fp8 e4m3 (``torch._scaled_mm``, cuBLASLt) with
per-tensor scales; in a step, fp8 layers cast their input with a static scale first, as
vLLM runs fp8 checkpoints with stored activation scales. ``_scaled_mm`` takes only row
counts divisible by 16, so fp8 GEMMs of fewer tokens run on 16 rows; at those sizes a
GEMM streams its weight and the extra rows cost little. Norms are ``F.rms_norm``;
vLLM fuses some of the element-wise kernels (residual add with norm, SiLU with mul) that
run separately here.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
import yaml

MODELS_YAML = Path(__file__).resolve().parents[1] / "planner/rooftop_planner/catalog/models.yaml"
BATCHES = (1, 8, 16, 32, 64, 128, 256)
CONTEXTS = (512, 2048, 8192)
PROMPTS = (256, 512, 1024, 2048, 4096, 8192)  # one prompt per prefill step (8,192: a full chunk)
KV_TOKEN_LIMIT = 262_144  # cached tokens per row: keeps KV + weights inside 80 GB
WARMUP, REPLAYS = 3, 20
FP8_ROWS = 16  # _scaled_mm's row multiple
DEVICE = "cuda"


@dataclass(frozen=True)
class Shard:
    """One GPU's share of a dense Llama model under ``tp``-way tensor parallelism."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int

    @classmethod
    def of(cls, name: str, tp: int) -> Shard:
        spec = yaml.safe_load(MODELS_YAML.read_text())["models"][name]
        return cls(name, spec["num_layers"], spec["hidden_size"], spec["num_heads"] // tp,
                   max(spec["num_kv_heads"] // tp, 1), spec["head_dim"],
                   spec["intermediate_size"] // tp, spec["vocab_size"] // tp)  # fmt: skip

    def gemm_shapes(self) -> list[tuple[int, int]]:
        """(k, n) of the QKV, output, gate/up and down projections."""
        qkv = (self.heads + 2 * self.kv_heads) * self.head_dim
        return [(self.hidden, qkv), (self.heads * self.head_dim, self.hidden),
                (self.hidden, 2 * self.intermediate), (self.intermediate, self.hidden)]  # fmt: skip


class Linear:
    """y = x·W for an n × k weight, bf16 or fp8 with per-tensor scales."""

    def __init__(self, k: int, n: int, dtype: str) -> None:
        w = torch.randn(n, k, device=DEVICE, dtype=torch.bfloat16) * 0.02
        self.fp8 = dtype == "fp8"
        if self.fp8:
            # column-major k × n, as _scaled_mm wants its second operand
            self.weight = w.to(torch.float8_e4m3fn).t()
            self.scale = torch.tensor(1.0, device=DEVICE)
            self.input_scale = torch.tensor(1.0, device=DEVICE, dtype=torch.bfloat16)
        else:
            self.weight = w  # n × k, as vLLM's linear layers hold it

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """The layer as a step runs it: fp8 quantizes its input with a static scale first
        (the scale a checkpoint's calibration stored; vLLM does it in one fused kernel)."""
        if not self.fp8:
            return self.gemm(x)
        rows = x.shape[0]
        x = pad_rows(x)
        return self.gemm((x * self.input_scale).to(torch.float8_e4m3fn))[:rows]

    def gemm(self, x: torch.Tensor) -> torch.Tensor:
        """The GEMM alone, on an input already in the weight's dtype (and row multiple)."""
        if not self.fp8:
            return torch.nn.functional.linear(x, self.weight)
        return torch._scaled_mm(x, self.weight, scale_a=self.scale, scale_b=self.scale,
                                out_dtype=torch.bfloat16)  # fmt: skip


def pad_rows(x: torch.Tensor) -> torch.Tensor:
    """``x`` with zero rows added up to _scaled_mm's row multiple."""
    missing = -x.shape[0] % FP8_ROWS
    return torch.nn.functional.pad(x, (0, 0, 0, missing)) if missing else x


def rms_norm(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.rms_norm(x, (x.shape[-1],), eps=1e-5)


class Stack:
    """The shard's layers (own weights each) and a KV cache sized for the largest row."""

    def __init__(self, shard: Shard, dtype: str, kv_tokens: int) -> None:
        self.shard = shard
        self.layers = [[Linear(k, n, dtype) for k, n in shard.gemm_shapes()]
                       for _ in range(shard.layers)]  # fmt: skip
        self.lm_head = Linear(shard.hidden, shard.vocab, dtype)
        per_layer = 2 * kv_tokens * shard.kv_heads * shard.head_dim
        self.kv = torch.randn(shard.layers, per_layer, device=DEVICE, dtype=torch.bfloat16)

    def cache(self, layer: int, batch: int, context: int) -> tuple[torch.Tensor, torch.Tensor]:
        s = self.shard
        size = batch * s.kv_heads * context * s.head_dim
        flat = self.kv[layer]
        shape = (batch, s.kv_heads, context, s.head_dim)
        return flat[:size].view(shape), flat[size : 2 * size].view(shape)

    def step(self, x: torch.Tensor, context: int, attention: str) -> torch.Tensor:
        """One decode step; ``attention`` is "bmm", "sdpa" or "none" (left out)."""
        s, batch = self.shard, x.shape[0]
        for index, (qkv, out, gate_up, down) in enumerate(self.layers):
            q = qkv(rms_norm(x))[:, : s.heads * s.head_dim]
            if attention != "none":
                k, v = self.cache(index, batch, context)
                q = self.attend(q, k, v, attention)
            x = x + out(q)
            g, u = gate_up(rms_norm(x)).chunk(2, dim=-1)
            x = x + down(torch.nn.functional.silu(g) * u)
        return self.lm_head(rms_norm(x))

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, how: str) -> torch.Tensor:
        """One query per sequence over its cache: batched matmuls and a softmax, or
        PyTorch's fused scaled-dot-product attention (FlashAttention where it applies)."""
        s, batch = self.shard, q.shape[0]
        if how == "sdpa":
            q4 = q.reshape(batch, s.heads, 1, s.head_dim)
            o = torch.nn.functional.scaled_dot_product_attention(q4, k, v, enable_gqa=True)
            return o.reshape(batch, s.heads * s.head_dim)
        q4 = q.view(batch, s.kv_heads, s.heads // s.kv_heads, s.head_dim)
        scores = torch.matmul(q4, k.transpose(-1, -2)) * (s.head_dim**-0.5)
        probs = torch.softmax(scores.float(), dim=-1).to(torch.bfloat16)
        return torch.matmul(probs, v).reshape(batch, s.heads * s.head_dim)

    def prefill_step(self, x: torch.Tensor, attention: bool) -> torch.Tensor:
        """One step that prefills one prompt of ``x.shape[0]`` tokens: causal attention
        over the prompt's own keys, and the LM head for its last token only."""
        s, tokens = self.shard, x.shape[0]
        q_width, kv_width = s.heads * s.head_dim, s.kv_heads * s.head_dim
        for qkv, out, gate_up, down in self.layers:
            mixed = qkv(rms_norm(x))
            o = mixed[:, :q_width]
            if attention:
                q, k, v = mixed.split([q_width, kv_width, kv_width], dim=-1)
                q4, k4, v4 = (
                    t.reshape(1, tokens, -1, s.head_dim).transpose(1, 2) for t in (q, k, v)
                )
                o4 = torch.nn.functional.scaled_dot_product_attention(
                    q4, k4, v4, is_causal=True, enable_gqa=True
                )
                o = o4.transpose(1, 2).reshape(tokens, q_width)
            x = x + out(o)
            g, u = gate_up(rms_norm(x)).chunk(2, dim=-1)
            x = x + down(torch.nn.functional.silu(g) * u)
        return self.lm_head(rms_norm(x[-1:]))

    def gemms(self, x: torch.Tensor, inputs: list[torch.Tensor]) -> None:
        """The step's GEMMs alone, on inputs prepared in the weights' dtype: what the
        planner's GEMM term prices (``inputs``: one per projection, then the LM head's)."""
        for layer in self.layers:
            for linear, given in zip(layer, inputs, strict=False):
                linear.gemm(given)
        self.lm_head.gemm(inputs[-1])

    def gemm_inputs(self, tokens: int, sampled: int) -> list[torch.Tensor]:
        """Inputs of the layers' GEMMs (``tokens`` rows) and the LM head's (``sampled``)."""
        shapes = [(k, tokens) for k, _ in self.shard.gemm_shapes()] + [(self.shard.hidden, sampled)]
        out = []
        for k, rows in shapes:
            x = torch.randn(rows, k, device=DEVICE, dtype=torch.bfloat16)
            out.append(pad_rows(x).to(torch.float8_e4m3fn) if self.lm_head.fp8 else x)
        return out


def graph_ms(run: Callable[[], object]) -> float:
    """Median milliseconds of one replay of ``run`` captured as a CUDA graph."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(WARMUP):
            run()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    for _ in range(WARMUP):
        graph.replay()
    times = []
    for _ in range(REPLAYS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    del graph
    return statistics.median(times)


def time_row(stack: Stack, batch: int, context: int) -> dict[str, float]:
    """One (batch, context) point timed the four ways the module docstring lists (ms)."""
    x = torch.randn(batch, stack.shard.hidden, device=DEVICE, dtype=torch.bfloat16)
    inputs = stack.gemm_inputs(batch, batch)
    times = {f"{how}_step_ms": graph_ms(lambda how=how: stack.step(x, context, how))
             for how in ("bmm", "sdpa", "none")}  # fmt: skip
    times["gemms_ms"] = graph_ms(lambda: stack.gemms(x, inputs))
    return {key: round(value, 4) for key, value in times.items()}


def time_prefill(stack: Stack, tokens: int) -> dict[str, float]:
    """One prompt of ``tokens`` prefilled in one step: whole, without attention, GEMMs (ms)."""
    x = torch.randn(tokens, stack.shard.hidden, device=DEVICE, dtype=torch.bfloat16)
    inputs = stack.gemm_inputs(tokens, 1)
    times = {
        "step_ms": graph_ms(lambda: stack.prefill_step(x, True)),
        "none_step_ms": graph_ms(lambda: stack.prefill_step(x, False)),
        "gemms_ms": graph_ms(lambda: stack.gemms(x, inputs)),
    }
    return {key: round(value, 4) for key, value in times.items()}


def rows(stack: Stack) -> Iterator[dict[str, object]]:
    for context in CONTEXTS:
        for batch in BATCHES:
            if batch * context <= KV_TOKEN_LIMIT:
                yield {"batch": batch, "context": context} | time_row(stack, batch, context)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", required=True, help="catalog id of the GPU it runs on")
    parser.add_argument("--out", type=Path, required=True, help="CSV to write")
    parser.add_argument("--runs", default="llama-3.1-8b:1:bf16,llama-3.1-8b:1:fp8,"
                        "llama-3.1-70b:4:bf16,llama-3.1-70b:4:fp8",
                        help="model:tp:weights, comma-separated")  # fmt: skip
    parser.add_argument("--prefill", action="store_true",
                        help="time one-prompt prefill steps instead of decode steps")  # fmt: skip
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    fields = ["gpu", "device_name", "torch", "model", "tp", "weights"] + (
        ["prompt_tokens", "step_ms", "none_step_ms", "gemms_ms"] if args.prefill
        else ["batch", "context", "bmm_step_ms", "sdpa_step_ms", "none_step_ms", "gemms_ms"]
    )  # fmt: skip
    with args.out.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fields)
        writer.writeheader()
        for run in args.runs.split(","):
            model, tp, dtype = run.split(":")
            stack = Stack(Shard.of(model, int(tp)), dtype, 1 if args.prefill else KV_TOKEN_LIMIT)
            timed = (
                ({"prompt_tokens": p} | time_prefill(stack, p) for p in PROMPTS)
                if args.prefill else rows(stack)
            )  # fmt: skip
            for row in timed:
                row |= {"gpu": args.gpu, "device_name": torch.cuda.get_device_name(),
                        "torch": torch.__version__, "model": model, "tp": tp,
                        "weights": dtype}  # fmt: skip
                writer.writerow(row)
                handle.flush()
                print(row, flush=True)
            del stack
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
