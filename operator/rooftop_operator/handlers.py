"""The kopf handlers for ServingTarget and its engine Deployments: thin entry points.

Each takes kopf's arguments, finds the ``Runtime`` in kopf's memo and calls the plain
function that does the work (``reconcile.reconcile``, ``readiness.deployment_event``),
turning the API server's errors into kopf's retries: ``KubeError`` raises
``kopf.TemporaryError`` with a doubling delay. ``wiring`` registers them (importing this
module registers nothing).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import kopf

from rooftop_operator import metrics
from rooftop_operator.kube import KubeError
from rooftop_operator.readiness import deployment_event, index_entry
from rooftop_operator.reconcile import WAITING_FOR_NODES, reconcile
from rooftop_operator.runtime import Runtime, build_runtime, runtime
from rooftop_operator.settings import OperatorConfig, configure

log = logging.getLogger(__name__)


RETRY_DELAY_S = 10.0  # first retry after a failed API call, doubling up to:


MAX_RETRY_DELAY_S = 600.0


def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    config = getattr(memo, "config", None) or OperatorConfig()
    configure(settings, config)
    if getattr(memo, "runtime", None) is None:
        memo.runtime = build_runtime(config)
    if config.metrics_port is not None:
        metrics.start_http_server(config.metrics_port)


def reconcile_target(body: kopf.Body, memo: kopf.Memo, retry: int = 0, **_: Any) -> None:
    rt = runtime(memo)
    try:
        result = reconcile(rt, body)
    except KubeError as err:
        rt.metrics.record_reconcile("retry")
        raise kopf.TemporaryError(str(err), delay=retry_delay_s(retry)) from err
    _record(rt, result)


def retry_delay_s(retry: int) -> float:
    """Seconds before the next attempt after ``retry`` failed ones: doubling from
    ``RETRY_DELAY_S`` up to ``MAX_RETRY_DELAY_S``, so a child the API server refuses (an
    invalid field, a full Service IP range) is retried, not logged every 10 s forever."""
    return float(min(RETRY_DELAY_S * 2 ** min(retry, 16), MAX_RETRY_DELAY_S))


def _record(rt: Runtime, result: str) -> None:
    """Count a finished pass; waiting for nodes counts as skipped (no failure:
    ``replan_waiting`` tries again, quietly)."""
    rt.metrics.record_reconcile("skipped" if result == WAITING_FOR_NODES else result)


def replan_waiting(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """Plan a target that waits for GPU nodes again, so nodes added later (by hand or by
    an autoscaler) are picked up without a spec edit. A timer, not a handler retry:
    kopf logs every retry of a failed handler as an ERROR line, and a wait of hours for
    a node pool is not an error."""
    rt = runtime(memo)
    try:
        result = reconcile(rt, body)  # the same spec generation the wait began with
    except KubeError as err:  # the next tick tries again
        log.warning("replan %s: %s", body.get("metadata", {}).get("name"), err)
        rt.metrics.record_reconcile("retry")
        return
    _record(rt, result)


# The index and the targets' watch handler are coroutines: kopf runs a plain function in
# its thread pool, a hop per watch event (several per target under a burst) for work that
# takes microseconds and makes no API call.
async def engine_deployments(
    namespace: str | None, name: str | None, body: kopf.Body, **_: Any
) -> dict[tuple[str, str], dict[str, Any]]:
    """kopf's in-memory index of the engine Deployments, kept current by the same watch
    as ``engine_deployment_event``: the feedback loop reads a target's Deployment from
    here (passed to its daemon as the ``engine_deployments`` argument) instead of a GET
    per target and tick."""
    return {(str(namespace), str(name)): index_entry(body)}


async def engine_deployment_event(
    body: kopf.Body, event: kopf.RawEvent, memo: kopf.Memo, **_: Any
) -> None:
    """Mirror readiness, or repair a deleted Deployment (``deployment_event``), in the
    Deployment events' own threads (``Runtime.deployment_events``)."""
    loop = asyncio.get_running_loop()
    rt, kind = runtime(memo), str(event.get("type"))
    await loop.run_in_executor(rt.deployment_events, deployment_event, rt, body, kind)


async def target_event(
    event: kopf.RawEvent, name: str | None, namespace: str | None, memo: kopf.Memo, **_: Any
) -> None:
    """Drop a deleted target's metric series and the loop's memory of it, and stop its
    timer and daemon (``RecentlyDeleted``). A watch event rather than on.delete: a
    deletion handler would need a finalizer, and the children go by garbage collection."""
    if event.get("type") == "DELETED":
        uid = ((event.get("object") or {}).get("metadata") or {}).get("uid")
        runtime(memo).forget(str(namespace), str(name), str(uid))
