"""Tensor parallelism: which degrees a model's attention heads can be sharded over.

One rule, read by the search (it rejects the other degrees with this reason) and by the
simulated engine (which refuses them as vLLM does).
"""

from __future__ import annotations

from typing import Protocol

# The tensor-parallel degrees plans use: one node's GPUs, in powers of two.
TP_DEGREES = (1, 2, 4, 8)


class HeadCounts(Protocol):
    """What the tensor-parallel rule reads of a model (the planner's ModelSpec, or the
    engine simulator's shape)."""

    @property
    def num_heads(self) -> int: ...
    @property
    def num_kv_heads(self) -> int: ...


def tp_problem(model: HeadCounts, tp: int) -> str:
    """Why ``tp`` GPUs cannot shard the model's attention heads, else ""."""
    if model.num_heads % tp:
        return f"TP {tp} does not divide {model.num_heads} attention heads"
    if model.num_kv_heads % tp and tp % model.num_kv_heads:
        return f"TP {tp} and {model.num_kv_heads} KV heads do not divide one another"
    return ""
