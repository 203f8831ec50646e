"""Every kopf handler the operator runs, registered in one place.

``register_handlers`` is called once by ``rooftop operator`` (``__main__.run``) with the
configuration read at start-up, so periods and intervals come from that configuration,
not from the environment at import time; importing ``handlers`` or ``loop`` registers
nothing. Handler ids are the functions' names, as kopf gives them: a target's handler
progress, stored under those ids, survives an upgrade.

- ``handlers.startup``: kopf's settings, the runtime, the metrics endpoint;
- ``handlers.reconcile_target`` on resume, create and spec update: plan and apply;
- ``handlers.engine_deployments`` (an index) and ``handlers.engine_deployment_event``:
  the engine Deployments' readiness and repair;
- ``handlers.target_event``: a deleted target's metrics and memory;
- ``handlers.replan_waiting``: a timer for targets waiting for GPU nodes;
- ``loop.presence`` (a daemon per target) and the one feedback-loop task.

Timers and daemons put no finalizer on the targets (``timer_without_finalizer``).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import kopf

from rooftop_api.spec import GROUP, PLURAL, VERSION
from rooftop_operator import builders, handlers
from rooftop_operator.loop import presence, start_loop, stop_loop
from rooftop_operator.reconcile import waiting_for_nodes
from rooftop_operator.runtime import runtime
from rooftop_operator.settings import OperatorConfig

# The engine Deployments the operator made, by the label builders gives them.
ENGINE_LABELS = {"app.kubernetes.io/name": builders.APP_NAME}


def register_handlers(
    config: OperatorConfig, registry: kopf.OperatorRegistry | None = None
) -> None:
    """Register every handler in ``registry`` (kopf's default one when None)."""
    real = registry if registry is not None else kopf.get_default_registry()
    _register_targets(real)
    _register_engine_deployments(real)
    _register_timers(config, real)


def _register_targets(registry: kopf.OperatorRegistry) -> None:
    kopf.on.startup(registry=registry)(handlers.startup)
    target = (GROUP, VERSION, PLURAL)
    kopf.on.resume(*target, registry=registry)(handlers.reconcile_target)
    kopf.on.create(*target, registry=registry)(handlers.reconcile_target)
    kopf.on.update(*target, field="spec", registry=registry)(handlers.reconcile_target)
    kopf.on.event(*target, registry=registry)(handlers.target_event)


def _register_engine_deployments(registry: kopf.OperatorRegistry) -> None:
    deployments = ("apps", "v1", "deployments")
    kopf.index(*deployments, labels=ENGINE_LABELS, registry=registry)(handlers.engine_deployments)
    kopf.on.event(*deployments, labels=ENGINE_LABELS, registry=registry)(
        handlers.engine_deployment_event
    )


def _register_timers(config: OperatorConfig, registry: kopf.OperatorRegistry) -> None:
    """The timer, the daemon and the loop task, whose periods are ``config``'s."""
    timer_without_finalizer(
        handlers.replan_waiting,
        interval=config.nodes_retry_s,
        when=lambda uid, status, memo, **_: runtime(memo).alive(uid) and waiting_for_nodes(status),
        registry=registry,
    )
    daemon_without_finalizer(
        presence, when=lambda uid, memo, **_: runtime(memo).alive(uid), registry=registry
    )
    start = functools.partial(start_loop, interval_s=config.loop.interval_s)
    kopf.on.startup(id="feedback_loop", registry=registry)(start)
    kopf.on.cleanup(id="feedback_loop", registry=registry)(stop_loop)


def timer_without_finalizer(
    fn: Callable[..., Any],
    *,
    interval: float,
    when: Callable[..., bool],
    registry: kopf.OperatorRegistry | None = None,
) -> None:
    """Register ``fn`` as a ServingTarget timer that puts no finalizer on the targets.

    kopf gives every object with a timer or daemon its finalizer, so that it can stop
    them before the object goes. A finalizer makes ``kubectl delete`` (and a namespace's
    deletion) hang whenever the operator is not running: after ``helm uninstall``, on a
    crash-looping operator. Ours need no last word with the object (the children go by
    garbage collection), so the finalizer is dropped and they are stopped by their
    ``when`` filter instead (``alive``).
    """
    real = registry if registry is not None else kopf.get_default_registry()
    kopf.timer(
        GROUP, VERSION, PLURAL, interval=interval, initial_delay=interval, when=when, registry=real
    )(fn)
    _without_finalizer(real)


def daemon_without_finalizer(
    fn: Callable[..., Any],
    *,
    when: Callable[..., bool],
    registry: kopf.OperatorRegistry | None = None,
) -> None:
    """Register ``fn`` as a ServingTarget daemon with no finalizer (see
    ``timer_without_finalizer``)."""
    real = registry if registry is not None else kopf.get_default_registry()
    kopf.daemon(GROUP, VERSION, PLURAL, when=when, registry=real)(fn)
    _without_finalizer(real)


def _without_finalizer(registry: kopf.OperatorRegistry) -> None:
    """Replace the spawning handler registered last by a copy that requires no finalizer.
    kopf offers no public switch for this, and its maintainer declined one (nolar/kopf#896,
    2026: timers and daemons keep their finalizers by design), so this reaches into the
    registry: ``test_timers_put_no_finalizer`` fails if its shape changes, and
    ``make floors`` runs it on the oldest kopf pyproject.toml allows (1.44.6)."""
    spawning = registry._spawning._handlers
    spawning[-1] = dataclasses.replace(spawning[-1], requires_finalizer=False)
