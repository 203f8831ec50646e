"""Every kopf handler the operator runs, registered in one place.

``register`` is called once by ``rooftop operator`` (``__main__.run``) with the
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

Timers and daemons put no finalizer on the targets (``handlers.timer_without_finalizer``).
"""

from __future__ import annotations

import functools

import kopf

from rooftop_api.spec import GROUP, PLURAL, VERSION
from rooftop_operator import builders, handlers
from rooftop_operator.loop import presence, start_loop, stop_loop
from rooftop_operator.settings import OperatorConfig

# The engine Deployments the operator made, by the label builders gives them.
ENGINE_LABELS = {"app.kubernetes.io/name": builders.APP_NAME}


def register(config: OperatorConfig, registry: kopf.OperatorRegistry | None = None) -> None:
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
    handlers.timer_without_finalizer(
        handlers.replan_waiting,
        interval=config.nodes_retry_s,
        when=lambda uid, status, memo, **_: (
            handlers.runtime(memo).alive(uid) and handlers.waiting_for_nodes(status)
        ),
        registry=registry,
    )
    handlers.daemon_without_finalizer(
        presence, when=lambda uid, memo, **_: handlers.runtime(memo).alive(uid), registry=registry
    )
    start = functools.partial(start_loop, interval_s=config.loop.interval_s)
    kopf.on.startup(id="feedback_loop", registry=registry)(start)
    kopf.on.cleanup(id="feedback_loop", registry=registry)(stop_loop)
