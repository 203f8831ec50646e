"""The plan: one deployment shape and its predicted operating point.

This is the one plan type. The search returns it, the operator deploys it, the
control law rescales it and the simulator runs it. ``status.plan`` on the resource is
its stored form: ``to_status`` writes it and ``from_status`` reads it back (the loop
resumes from status after an operator restart). ``usd_per_hour`` is always the whole
plan's cost (every replica); ``usd_per_replica_hour`` is one replica's.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Final

from pydantic import ValidationError

from rooftop_api.spec import MeasuredWorkload, PlanStatus, PoolStatus, PredictedLatency
from rooftop_planner.errors import PlannerError
from rooftop_planner.perf import DEFAULT_GPU_MEMORY_UTILIZATION, DEFAULT_MAX_NUM_BATCHED_TOKENS

# Plan fields status.plan does not keep, and why; every other field survives
# ``from_status(to_status())`` (a unit test holds both to this).
NOT_IN_STATUS: Final = {
    # the loop changes replicas and the batch cap in status.plan, which a stored
    # capacity would not follow; the controller sizes from the planner instead
    "capacity_rps": "stale once the loop rescales",
    "weights_note": "words for rooftop plan; the checkpoint itself is stored",
    "context_note": "words for rooftop plan; the context length itself is stored",
    "speculative_note": "words for rooftop plan; the speculative config itself is stored",
}


# What each plan field is (tests/unit/planner/test_plan_status.py holds every field to one):
# the engine each pod runs (a change is a new operating curve: a rollout, a PlanChanged
# event, the loop starting over), what the feedback loop changes, and what follows from
# those two (the prediction and its words).
SHAPE_FIELDS: Final = (
    "gpu",
    "tp",
    "weight_dtype",
    "kv_dtype",
    "max_model_len",
    "gpu_memory_utilization",
    "max_num_batched_tokens",
    "checkpoint",
    # the Service's: a pod stays as it was, but the hit rate, hence the curve, changes
    "session_affinity",
    # vLLM's --speculative-config: the drafter and the draft length per batch size
    "speculative_config",
    # a mixed fleet's pools: their shapes are the plan's (``Plan.shape``), their pod
    # counts follow the fleet's ``replicas``
    "pools",
)
SCALE_FIELDS: Final = ("replicas", "max_num_seqs")
# The plan fields vLLM takes as they are, and the ``vllm serve`` flag of each (a field that
# is 0 is left to vLLM). The other engine fields are translated where the engine is built
# (``rooftop_operator.builders``: the GPU a node selector, the dtypes and the checkpoint
# ``--dtype``, ``--quantization``, ``--kv-cache-dtype`` and the model; the session
# affinity the Service's), and
# ``ENGINE_FIELDS_TRANSLATED`` says so; tests/unit/planner/test_plan_status.py holds every
# shape and scale field to one of the two.
VLLM_FLAGS: Final = {
    "tp": "--tensor-parallel-size",
    "max_num_seqs": "--max-num-seqs",
    "max_model_len": "--max-model-len",
    "gpu_memory_utilization": "--gpu-memory-utilization",
    "max_num_batched_tokens": "--max-num-batched-tokens",
    "speculative_config": "--speculative-config",
}
ENGINE_FIELDS_TRANSLATED: Final = (
    "gpu",
    "weight_dtype",
    "kv_dtype",
    "checkpoint",
    "replicas",
    "session_affinity",  # the Service's sessionAffinity
    "pools",  # one Deployment each
)
# What the plan was made from beyond the spec: the acceptance and the lengths the feedback
# loop measured and planned the target again with (they must survive an operator
# restart, which plans the same spec again).
INPUT_FIELDS: Final = ("measured_acceptance", "measured_workload")
OUTCOME_FIELDS: Final = (
    "prefix_hit_ratio",
    "tpot_ms",
    "ttft_ms",
    "output_tok_s",
    "usd_per_hour",
    "capacity_rps",
    "summary",
    "weights_note",
    "context_note",
    "speculative_note",
)


def without_drafts(shape: tuple[object, ...]) -> tuple[object, ...]:
    """A ``Plan.shape`` with its speculative config blanked: the engine but for the drafts
    its pods run, which the feedback loop re-plans from the acceptance it measures."""
    at = SHAPE_FIELDS.index("speculative_config")
    return (*shape[:at], "", *shape[at + 1 :])


class PlanStatusError(PlannerError):
    """``status.plan`` cannot be read back as a plan (hand-edited or from another version)."""


@dataclass(frozen=True)
class Plan:
    """One candidate deployment and its predicted operating point at the target rate.

    Latencies in ms, throughput in output tokens/s over all replicas, cost in $/hour over
    all replicas, capacity in requests/s over all replicas.
    """

    gpu: str
    tp: int
    replicas: int
    max_num_seqs: int
    weight_dtype: str
    kv_dtype: str
    max_model_len: int
    gpu_memory_utilization: float
    tpot_ms: float
    ttft_ms: float
    output_tok_s: float
    usd_per_hour: float
    capacity_rps: float = 0.0
    summary: str = ""
    checkpoint: str = ""
    weights_note: str = ""
    context_note: str = ""
    session_affinity: str = ""  # the Service's sessionAffinity: "ClientIP", or "" for none
    prefix_hit_ratio: float = 0.0  # predicted share of prompt tokens the prefix cache holds
    # the prefill chunk, tokens: the most one engine step takes (--max-num-batched-tokens)
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS
    # vLLM's --speculative-config JSON ("" for none: ``speculative.planned``) and its words
    speculative_config: str = ""
    speculative_note: str = ""
    # the per-token acceptance the loop measured and planned this plan at (None: the
    # spec's acceptanceRate or the drafter's published one, where it speculates)
    measured_acceptance: float | None = None
    # the served prompt and output lengths the loop measured and planned this plan with
    # (None: spec.workload's)
    measured_workload: MeasuredWorkload | None = None
    # A fleet of several GPU types (``fleet.MixedFleet.plan``): each pool's own plan at
    # its replicas. The plan's own fields are then the pool that sizes the fleet (the
    # least capacity per pod) at the fleet's pod count, cost and worst latencies.
    pools: tuple[Plan, ...] = ()

    @property
    def mixed(self) -> bool:
        """Whether the plan is a fleet of several pools."""
        return bool(self.pools)

    @property
    def key(self) -> tuple[str, int, str, str]:
        """The deployment shape a rollout changes: GPU, TP and the two dtypes."""
        return (self.gpu, self.tp, self.weight_dtype, self.kv_dtype)

    @property
    def shape(self) -> tuple[object, ...]:
        """The engine each pod runs (``SHAPE_FIELDS``: GPU, TP, dtypes, context length,
        memory share, prefill chunk, checkpoint). The feedback loop changes only the
        ``scale``; a new shape is a new operating curve."""
        own = tuple(getattr(self, name) for name in SHAPE_FIELDS if name != "pools")
        return (*own, tuple(pool.shape for pool in self.pools))

    @property
    def scale(self) -> tuple[int, int]:
        """What the feedback loop changes (``SCALE_FIELDS``): replicas and the batch cap."""
        return (self.replicas, self.max_num_seqs)

    @property
    def usd_per_replica_hour(self) -> float:
        """One replica's cost: the plan's $/hour over its replicas."""
        return self.usd_per_hour / max(self.replicas, 1)

    def rescaled(
        self, replicas: int, max_num_seqs: int | None = None, usd_per_hour: float | None = None
    ) -> Plan:
        """The same shape at another replica count (and batch cap) costing ``usd_per_hour``
        (None: the plan's cost per replica times ``replicas``, right without owned GPUs)."""
        return replace(
            self,
            replicas=replicas,
            max_num_seqs=self.max_num_seqs if max_num_seqs is None else max_num_seqs,
            usd_per_hour=self.usd_per_replica_hour * replicas
            if usd_per_hour is None
            else usd_per_hour,
        )

    def to_json(self) -> dict[str, object]:
        """The plan as ``rooftop plan --json`` prints it (snake_case, rounded)."""
        return {
            "gpu": self.gpu,
            "tp": self.tp,
            "replicas": self.replicas,
            "max_num_seqs": self.max_num_seqs,
            "weight_dtype": self.weight_dtype,
            "kv_dtype": self.kv_dtype,
            "max_model_len": self.max_model_len,
            "context_note": self.context_note,
            "checkpoint": self.checkpoint,
            "weights_note": self.weights_note,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "session_affinity": self.session_affinity,
            **(
                {
                    "speculative_config": json.loads(self.speculative_config),
                    "speculative_note": self.speculative_note,
                }
                if self.speculative_config
                else {}
            ),
            "predicted": {
                "tpot_ms": round(self.tpot_ms, 2),
                "ttft_ms": round(self.ttft_ms, 1),
                "output_tok_s": round(self.output_tok_s, 1),
                "prefix_hit_ratio": round(self.prefix_hit_ratio, 3),
            },
            "usd_per_hour": round(self.usd_per_hour, 3),
            "capacity_rps": round(self.capacity_rps, 3),
            "summary": self.summary,
            **({"pools": [p.to_json() for p in self.pools]} if self.pools else {}),
        }

    def to_status(self) -> PlanStatus:
        """``status.plan``: what the operator stores on the resource."""
        pools = [PoolStatus(**p._engine_status()) for p in self.pools] or None
        return PlanStatus(
            **self._engine_status(), pools=pools, measured_workload=self.measured_workload
        )

    def _engine_status(self) -> dict[str, Any]:
        """The fields ``status.plan`` and each of its pools keep."""
        return dict(
            gpu=self.gpu,
            tp=self.tp,
            replicas=self.replicas,
            max_num_seqs=self.max_num_seqs,
            weight_dtype=self.weight_dtype,
            kv_dtype=self.kv_dtype,
            max_model_len=self.max_model_len,
            gpu_memory_utilization=self.gpu_memory_utilization,
            max_num_batched_tokens=self.max_num_batched_tokens,
            checkpoint=self.checkpoint or None,
            session_affinity=self.session_affinity or None,
            speculative_config=self.speculative_config or None,
            measured_acceptance=self.measured_acceptance,
            usd_per_hour=round(self.usd_per_hour, 3),
            predicted=PredictedLatency(
                tpot_ms=round(self.tpot_ms, 2),
                ttft_ms=round(self.ttft_ms, 1),
                output_tok_s=round(self.output_tok_s, 1),
                prefix_hit_ratio=round(self.prefix_hit_ratio, 3) or None,
            ),
            summary=self.summary,
        )

    @classmethod
    def from_status(cls, status_plan: Mapping[str, object] | PlanStatus | PoolStatus) -> Plan:
        """Read ``status.plan`` (camelCase, as stored) back into a plan.

        Fields the status does not keep (``NOT_IN_STATUS``) take their defaults; a stored
        plan without a context length, memory share or prefill chunk (older status)
        reads as 0, which builders omit, as vLLM's default share, or as the chunk older
        plans ran with (``DEFAULT_MAX_NUM_BATCHED_TOKENS``, always rendered).

        Raises:
            PlanStatusError: the stored plan lacks a field or has a wrong type.
        """
        try:
            stored = (
                status_plan
                if isinstance(status_plan, PlanStatus | PoolStatus)
                else PlanStatus.model_validate(dict(status_plan))
            )
        except ValidationError as err:
            raise PlanStatusError(f"status.plan is not a plan: {err}") from err
        memory_share = stored.gpu_memory_utilization or DEFAULT_GPU_MEMORY_UTILIZATION
        return cls(
            gpu=stored.gpu,
            tp=stored.tp,
            replicas=stored.replicas,
            max_num_seqs=stored.max_num_seqs,
            weight_dtype=stored.weight_dtype,
            kv_dtype=stored.kv_dtype,
            max_model_len=stored.max_model_len or 0,
            gpu_memory_utilization=memory_share,
            max_num_batched_tokens=stored.max_num_batched_tokens or DEFAULT_MAX_NUM_BATCHED_TOKENS,
            tpot_ms=stored.predicted.tpot_ms or 0.0,
            ttft_ms=stored.predicted.ttft_ms or 0.0,
            output_tok_s=stored.predicted.output_tok_s or 0.0,
            usd_per_hour=stored.usd_per_hour,
            summary=stored.summary or "",
            checkpoint=stored.checkpoint or "",
            session_affinity=stored.session_affinity or "",
            speculative_config=stored.speculative_config or "",
            measured_acceptance=stored.measured_acceptance,
            measured_workload=getattr(stored, "measured_workload", None),
            prefix_hit_ratio=stored.predicted.prefix_hit_ratio or 0.0,
            pools=tuple(cls.from_status(pool) for pool in getattr(stored, "pools", None) or ()),
        )
