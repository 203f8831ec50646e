"""What every handler and the feedback loop need, built once at start-up: the ``Runtime``.

It holds the API wrapper, the catalog, the planner, the event sink, the operator's metrics
and what this process remembers of each target (readiness written, pods listed, the
loop's memory, the targets deleted lately). Tests build one with fakes and no cluster;
kopf hands it to each handler through its memo (``runtime(memo)``).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

import kopf

from rooftop_api import conditions as cnd
from rooftop_operator import metrics
from rooftop_operator.kube import Kube
from rooftop_operator.loop_memory import LoopMemory
from rooftop_operator.settings import OperatorConfig
from rooftop_planner.catalog import Catalog, load_catalog
from rooftop_planner.result import SearchResult
from rooftop_planner.search import plan_target

DEPLOYMENT_EVENT_THREADS = 4  # see Runtime.deployment_events

Obj = dict[str, Any]


EmitFn = Callable[[Mapping[str, Any], str, str, str], None]


class KubeLike(Protocol):
    """The subset of ``kube.Kube`` the handlers use (tests pass a fake)."""

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> Obj | None: ...
    def apply(self, obj: Mapping[str, Any]) -> None: ...
    def has_api(self, group_version: str, plural: str) -> bool: ...
    def list_nodes(self) -> list[Obj]: ...
    def list_unfinished_pods(self) -> list[Obj]: ...
    def list_engine_deployments(self) -> list[Obj]: ...
    def list_pods(self, namespace: str, labels: Mapping[str, str]) -> list[Obj]: ...
    def delete_deployment(self, namespace: str, name: str) -> None: ...
    def list_pool_deployments(self, namespace: str, target: str) -> list[Obj]: ...
    def get_target(self, namespace: str, name: str) -> Obj | None: ...
    def update_status(
        self,
        namespace: str,
        name: str,
        mutate: Callable[[Obj], Obj],
        uid: str | None = None,
        seen: Mapping[str, Any] | None = None,
    ) -> Obj | None: ...


def kopf_emit(body: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
    """Post a Kubernetes Event about the target through kopf's event queue."""
    kopf.event(body, type=type_, reason=reason, message=message[:1000])  # type: ignore[arg-type]


class RecentlyDeleted:
    """The uids of the last ``size`` targets whose DELETED watch event arrived.

    Why: a timer or daemon without kopf's finalizer is not stopped by the deletion
    itself. kopf runs the watch handlers of an event before it re-matches the object's
    timers and daemons against their ``when`` filters, so ``target_event`` recording the
    uid here makes their ``alive`` filter fail in that same event, and kopf stops them.
    The uid is needed only for that moment; the bound keeps a long-lived operator's
    memory flat.
    """

    def __init__(self, size: int = 4096) -> None:
        self._uids: OrderedDict[str, None] = OrderedDict()
        self._size = size

    def add(self, uid: str) -> None:
        self._uids[uid] = None
        while len(self._uids) > self._size:
            self._uids.popitem(last=False)

    def __contains__(self, uid: object) -> bool:
        return uid in self._uids


@dataclass
class Runtime:
    """What every handler needs; built once at startup and kept in kopf's memo."""

    kube: KubeLike
    catalog: Catalog
    plan: Callable[..., SearchResult]
    config: OperatorConfig = field(default_factory=OperatorConfig)
    emit: EmitFn = kopf_emit
    metrics: metrics.OperatorMetrics = metrics.DEFAULT
    now: Callable[[], str] = cnd.now_iso
    # What this process last wrote of each target's readiness, by target uid (see
    # ``sync_readiness``); a deleted target's entry goes with its DELETED event.
    readiness_written: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    # When each target's pods were last listed (``clock``), by target uid.
    pods_listed: dict[str, float] = field(default_factory=dict)
    clock: Callable[[], float] = time.monotonic
    # What the feedback loop keeps between ticks, and the targets deleted lately.
    loop: LoopMemory = field(default_factory=LoopMemory)
    deleted: RecentlyDeleted = field(default_factory=RecentlyDeleted)
    # Threads for the engine Deployments' events, apart from kopf's pool: a burst of new
    # targets brings several Deployment events per target (the controller's rollout
    # updates), and in one shared pool they queued the reconciles of targets not yet
    # deployed behind the readiness of those that were. Threads start on first use.
    # Held by a reconcile from reading the free GPUs to applying its engine Deployment
    # (``gpuInventory: nodes``), so two targets never plan onto the same free GPUs.
    inventory_lock: threading.Lock = field(default_factory=threading.Lock)
    deployment_events: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(DEPLOYMENT_EVENT_THREADS, "deployment-events")
    )

    def alive(self, uid: str | None) -> bool:
        """Whether the target with ``uid`` has not been deleted (``RecentlyDeleted``)."""
        return uid not in self.deleted

    def forget(self, namespace: str, name: str, uid: str) -> None:
        """Drop what this process keeps of a deleted target: its metric series, its
        readiness memory and the loop's, and stop its timer and daemon."""
        self.deleted.add(uid)
        self.metrics.forget(namespace, name)
        self.readiness_written.pop(uid, None)
        self.pods_listed.pop(uid, None)
        self.loop.forget(uid)


def runtime(memo: Any) -> Runtime:
    rt: Runtime = memo.runtime
    return rt


def build_runtime(config: OperatorConfig) -> Runtime:
    """The production runtime: real API client, packaged catalog, the planner."""
    return Runtime(
        kube=Kube.from_environment(), catalog=load_catalog(), plan=plan_target, config=config
    )
