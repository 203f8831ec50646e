"""Fakes for the operator's unit tests: an in-memory API, a planner stub, an event sink.

Why fakes and not a mock library: the fake API keeps objects and status like the real
one (including "unchanged status is not written"), so tests can assert on the state a
reconcile leaves behind and on how many writes it made.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rooftop_api.spec import TARGET_LABEL
from rooftop_planner.plan import Plan

Obj = dict[str, Any]
NS = "team-a"
UID = "0b7e4f5e-1111-2222-3333-444455556666"


def target_body(name: str = "chat", spec: Mapping[str, Any] | None = None, **status: Any) -> Obj:
    """A ServingTarget body as kopf would hand it to a handler."""
    return {
        "apiVersion": "rooftop.dev/v1alpha1",
        "kind": "ServingTarget",
        "metadata": {"name": name, "namespace": NS, "uid": UID, "generation": 1},
        "spec": dict(spec if spec is not None else SPEC),
        "status": status,
    }


SPEC: Obj = {
    "model": "llama-3.1-8b",
    "slo": {"tpotMs": 50, "ttftMs": 1000},
    "workload": {
        "requestsPerSecond": 4,
        "promptTokens": {"mean": 512, "p90": 1024},
        "outputTokens": {"mean": 128},
    },
    "budget": {"usdPerHour": 20},
}


def make_plan(**overrides: Any) -> Plan:
    """A real planner ``Plan`` (2x H100 TP1 unless overridden), without running a search."""
    fields: Obj = {
        "gpu": "h100-sxm", "tp": 1, "replicas": 2, "max_num_seqs": 64, "weight_dtype": "bf16",
        "kv_dtype": "auto", "max_model_len": 4096, "gpu_memory_utilization": 0.9,
        "tpot_ms": 30.0, "ttft_ms": 200.0, "output_tok_s": 1500.0, "usd_per_hour": 6.98,
        "summary": "2 replicas of 1x h100-sxm (TP1)",
    }  # fmt: skip
    return Plan(**{**fields, **overrides})


@dataclass
class FakeResult:
    feasible: bool
    plan: Plan | None
    reasons: list[str] = field(default_factory=list)
    beyond_inventory: Plan | None = None
    mixed: None = None  # the planner's mixed-fleet advice (``SearchResult.mixed``)

    @property
    def deployed(self) -> Plan | None:
        return self.plan if self.feasible else None

    def explain(self) -> str:
        return "no plan: " + "; ".join(self.reasons)


@dataclass
class FakePlanner:
    """Returns ``result``; records the keyword arguments of each call."""

    result: FakeResult = field(default_factory=lambda: FakeResult(True, make_plan()))
    calls: list[Obj] = field(default_factory=list)
    error: Exception | None = None

    def __call__(self, spec: Any, **kwargs: Any) -> FakeResult:
        self.calls.append(kwargs)
        if self.error is not None:
            raise self.error
        return self.result


class FakeKube:
    """In-memory API: objects by (kind, namespace, name); counts writes."""

    def __init__(self, pod_monitors: bool = False) -> None:
        self.objects: dict[tuple[str, str, str], Obj] = {}
        self.applied: list[Obj] = []
        self.status_writes = 0
        self.pod_monitors = pod_monitors
        self.nodes: list[Obj] = []
        self.nodes_error: Exception | None = None
        self.apply_error: Exception | None = None  # what applying a Deployment raises
        self.node_lists = 0
        self.pod_lists = 0
        self.deleted: list[str] = []

    def add(self, obj: Mapping[str, Any]) -> None:
        meta = obj["metadata"]
        self.objects[(obj["kind"], meta["namespace"], meta["name"])] = copy.deepcopy(dict(obj))

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> Obj | None:
        found = self.objects.get((kind, namespace, name))
        return copy.deepcopy(found) if found is not None else None

    def apply(self, obj: Mapping[str, Any]) -> None:
        if self.apply_error is not None and obj["kind"] == "Deployment":
            raise self.apply_error
        self.applied.append(copy.deepcopy(dict(obj)))
        self.add(obj)

    def list_pool_deployments(self, namespace: str, target: str) -> list[Obj]:
        return [
            copy.deepcopy(o)
            for (kind, ns, _), o in self.objects.items()
            if kind == "Deployment"
            and ns == namespace
            and o["metadata"].get("labels", {}).get(TARGET_LABEL) == target
            and "rooftop.dev/pool" in o["metadata"].get("labels", {})
        ]

    def delete_deployment(self, namespace: str, name: str) -> None:
        self.deleted.append(name)
        self.objects.pop(("Deployment", namespace, name), None)

    def has_api(self, group_version: str, plural: str) -> bool:
        return self.pod_monitors and plural == "podmonitors"

    def list_nodes(self) -> list[Obj]:
        self.node_lists += 1
        if self.nodes_error is not None:
            raise self.nodes_error
        return copy.deepcopy(self.nodes)

    def list_engine_deployments(self) -> list[Obj]:
        return [
            copy.deepcopy(o)
            for (kind, _, _), o in self.objects.items()
            if kind == "Deployment" and TARGET_LABEL in o["metadata"].get("labels", {})
        ]

    def list_unfinished_pods(self) -> list[Obj]:
        self.pod_lists += 1
        return [
            copy.deepcopy(o)
            for (kind, _, _), o in self.objects.items()
            if kind == "Pod" and (o.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
        ]

    def list_pods(self, namespace: str, labels: Mapping[str, str]) -> list[Obj]:
        self.pod_lists += 1
        return [
            copy.deepcopy(o)
            for (kind, ns, _), o in self.objects.items()
            if kind == "Pod" and ns == namespace
            and labels.items() <= (o["metadata"].get("labels") or {}).items()
        ]  # fmt: skip

    def get_target(self, namespace: str, name: str) -> Obj | None:
        return self.get("rooftop.dev/v1alpha1", "ServingTarget", namespace, name)

    def update_status(
        self, namespace: str, name: str, mutate: Callable[[Obj], Obj], uid: str | None = None,
        seen: Mapping[str, Any] | None = None,
    ) -> Obj | None:  # fmt: skip
        target = self.objects.get(("ServingTarget", namespace, name))
        if target is None or uid not in (None, target["metadata"].get("uid")):
            return None
        current = target.get("status") or {}
        new = mutate(copy.deepcopy(current))
        if new == current:
            return None
        target["status"] = new
        self.status_writes += 1
        return new

    def status(self, name: str = "chat") -> Obj:
        return dict(self.objects[("ServingTarget", NS, name)].get("status") or {})


@dataclass
class Events:
    items: list[tuple[str, str, str]] = field(default_factory=list)

    def __call__(self, body: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        self.items.append((type_, reason, message))

    @property
    def reasons(self) -> list[str]:
        return [reason for _, reason, _ in self.items]
