"""Copy the measured kernel tables the planner fits on into this folder, reduced.

    python data/vendor_ops.py SOURCE_OPS_DIR   (needs pyarrow/pandas; run once per update)

SOURCE_OPS_DIR holds ai-dynamo/aiconfigurator's per-GPU op tables
(``<gpu>/<op>/<engine>/<version>/<table>.parquet``). Each table is reduced to the
columns and rows the planner uses and written as ``<gpu>/<engine>/<table>.csv.gz``
(``versions.csv`` lists the engine version each came from), with latency in
milliseconds to four significant figures:

- GEMM: bfloat16 and fp8 (per-tensor scaled) only; the fastest kernel per (m, n, k, dtype),
  which is the one the engine's autotuner or dispatch picks.
- Decode/prefill attention: head_dim 128 (every dense model in the catalog), no sliding
  window; the fastest kernel per shape.
- All-reduce: the CUDA-graph timings (engines capture decode steps in graphs); TensorRT-LLM
  has one backend.
- MoE: bfloat16 and fp8, balanced routing, no expert parallelism.
- Activation quantization to fp8 (vLLM's ``scaled_fp8_quant``, TensorRT-LLM's
  ``static_quantize_e4m3_per_tensor`` and ``quantize_e4m3_per_tensor``; ``quantize/`` in
  the source): ``scale_matrix_perf`` is the static per-tensor quant of an m × k bf16
  input, ``computescale_perf`` what computing the dynamic scale adds to it.

``versions.csv`` is updated row by row (gpu, engine, table), so a run over a source folder
that holds some of the tables (say only ``quantize/``) leaves the others' rows as they are.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

HERE = Path(__file__).resolve().parent / "ops"
GEMM_DTYPES = ("bfloat16", "fp8")
KEYS = {
    "gemm_perf": ["m", "n", "k", "gemm_dtype"],
    "generation_attention_perf": [
        "batch_size",
        "isl",
        "step",
        "num_heads",
        "num_key_value_heads",
        "kv_cache_dtype",
    ],
    "context_attention_perf": [
        "batch_size",
        "isl",
        "num_heads",
        "num_key_value_heads",
        "kv_cache_dtype",
    ],
    "custom_allreduce_perf": ["num_gpus", "message_size"],
    "scale_matrix_perf": ["m", "k"],
    "computescale_perf": ["m", "k"],
    "moe_perf": [
        "num_tokens",
        "hidden_size",
        "inter_size",
        "topk",
        "num_experts",
        "moe_tp_size",
        "moe_dtype",
    ],
}


def reduce_table(name: str, frame: pd.DataFrame) -> pd.DataFrame:
    if name == "gemm_perf":
        frame = frame[frame.gemm_dtype.isin(GEMM_DTYPES)]
    elif name.endswith("attention_perf"):
        frame = frame[frame.head_dim == 128]
        if "window_size" in frame:  # older collections have no sliding-window column
            frame = frame[frame.window_size == 0]
        if "step" not in frame:
            frame = frame.assign(step=0)
    elif name == "custom_allreduce_perf":
        graph = frame.kernel_source.str.contains("graph", case=False)
        frame = frame[graph] if graph.any() else frame
    elif name == "moe_perf":
        frame = frame[
            frame.moe_dtype.isin(("bfloat16", "fp8"))
            & (frame.distribution == "balanced")
            & (frame.moe_ep_size == 1)
        ]
    keys = KEYS[name]
    reduced = frame.groupby(keys, as_index=False)["latency"].min()
    reduced["latency"] = reduced["latency"].map(lambda v: float(f"{v:.4g}"))
    return reduced.sort_values(keys)


def main(source: Path) -> None:
    header = "gpu,engine,table,engine_version,rows"
    path_versions = HERE / "versions.csv"
    versions = {
        tuple(line.split(",")[:3]): line
        for line in path_versions.read_text().splitlines()[1:]
        if line
    }
    for path in sorted(source.glob("*/*/*/*/*.parquet")):
        gpu, _op, engine, version = path.parts[-5:-1]
        reduced = reduce_table(path.stem, pd.read_parquet(path))
        if reduced.empty:
            continue
        out = HERE / gpu / engine / f"{path.stem}.csv.gz"
        out.parent.mkdir(parents=True, exist_ok=True)
        reduced.to_csv(out, index=False, compression={"method": "gzip", "mtime": 0})
        versions[(gpu, engine, path.stem)] = f"{gpu},{engine},{path.stem},{version},{len(reduced)}"
        print(f"{gpu}/{engine} {version} {path.stem}: {len(reduced)} rows")
    path_versions.write_text("\n".join([header, *versions.values()]) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
