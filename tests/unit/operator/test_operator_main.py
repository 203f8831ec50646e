"""The `rooftop operator` command line."""

from __future__ import annotations

import argparse
import logging
import subprocess
import sys
import time
from typing import Any

import kopf
import pytest
from operator_fakes import FakeKube, FakePlanner
from prometheus_client import CollectorRegistry

from rooftop_api import spec
from rooftop_cli.main import build_parser
from rooftop_operator import __main__ as main_mod
from rooftop_operator import handlers, wiring
from rooftop_operator.metrics import OperatorMetrics
from rooftop_operator.runtime import DEPLOYMENT_EVENT_THREADS, RecentlyDeleted, Runtime
from rooftop_operator.settings import (
    VLLM_IMAGE,
    LoopSettings,
    OperatorConfig,
    RoutineSuccesses,
    configure,
    configured,
    digest,
    read_settings,
    seniority_priority,
)
from rooftop_planner.catalog import load_catalog


def loop_settings(environ: dict[str, str]) -> LoopSettings:
    """The loop's settings the operator reads from ``environ``."""
    return configured(read_settings(environ)).loop


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    main_mod.add_arguments(parser)
    return parser.parse_args(argv)


def test_registered_as_rooftop_operator() -> None:
    args = build_parser(["operator"]).parse_args(["operator", "-n", "a", "-n", "b"])
    assert args.func is main_mod.run
    assert args.namespaces == ["a", "b"]


def test_config_from_args(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROOFTOP_SELF_IMAGE", "reg/rooftop:1")
    config = main_mod.config_from_args(parse("-A", "--metrics-port", "9090", "--peering", "p"))
    assert config.clusterwide and config.namespaces == ()
    assert (config.metrics_port, config.peering, config.self_image) == (9090, "p", "reg/rooftop:1")
    assert config.vllm_image == VLLM_IMAGE


def test_flags_beat_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROOFTOP_SELF_IMAGE", "from-env")
    assert main_mod.config_from_args(parse("-n", "x", "--self-image", "flag")).self_image == "flag"


def test_no_namespace_is_a_usage_error() -> None:
    assert main_mod.run(parse()) == 2


def test_the_settings_given_in_the_environment_are_read_by_field() -> None:
    env = {"ROOFTOP_FAULT_PAUSE_AFTER_APPLY_S": "2.5", "ROOFTOP_VLLM_IMAGE": "v"}
    assert read_settings(env) == {"fault_pause_after_apply_s": 2.5, "vllm_image": "v"}


@pytest.mark.parametrize(
    ("name", "value", "fix"),
    [
        ("ROOFTOP_LOOP_INTERVAL_S", "-5", "> 0"),
        ("ROOFTOP_LOOP_INTERVAL_S", "0", "> 0"),
        ("ROOFTOP_LOOP_STALE_AFTER_S", "soon", "> 0"),
        ("ROOFTOP_LOOP_STARTUP_S", "-1", ">= 0"),
        ("ROOFTOP_LOOP_SCALE_DOWN_WINDOW_S", "abc", ">= 0"),
        ("ROOFTOP_LOOP_SCALE_DOWN_WINDOW_S", "inf", ">= 0"),
        ("ROOFTOP_LOOP_WINDOW", "5 minutes", "PromQL duration"),
    ],
)
def test_a_bad_loop_setting_names_its_variable(name: str, value: str, fix: str) -> None:
    with pytest.raises(ValueError) as err:
        loop_settings({name: value})
    assert name in str(err.value) and repr(value) in str(err.value) and fix in str(err.value)


def test_a_bad_loop_setting_stops_the_operator_before_it_starts(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("ROOFTOP_LOOP_SCALE_DOWN_WINDOW_S", "3m")
    assert main_mod.run(parse("-n", "x")) == 2
    assert "ROOFTOP_LOOP_SCALE_DOWN_WINDOW_S='3m': give a number of seconds" in (
        capsys.readouterr().err
    )


def test_loop_settings_from_the_environment() -> None:
    env = {"ROOFTOP_LOOP_INTERVAL_S": "30", "ROOFTOP_LOOP_WINDOW": "2m",
           "ROOFTOP_LOOP_STARTUP_S": "0", "ROOFTOP_LOOP_SCALE_DOWN_WINDOW_S": "600"}  # fmt: skip
    loop = loop_settings(env)
    assert (loop.interval_s, loop.window_s, loop.startup_s) == (30.0, 120.0, 0.0)
    assert loop.scale_down_window_s == 600.0
    assert loop_settings({"ROOFTOP_LOOP_INTERVAL_S": ""}) == LoopSettings()


def test_kopf_settings() -> None:
    import kopf

    settings = kopf.OperatorSettings()
    configure(settings, OperatorConfig(namespaces=("a",)))
    assert settings.watching.server_timeout == 300
    assert settings.watching.client_timeout > settings.watching.server_timeout
    assert settings.peering.standalone is True
    assert isinstance(settings.persistence.progress_storage, kopf.AnnotationsProgressStorage)
    assert isinstance(settings.persistence.diffbase_storage, kopf.AnnotationsDiffBaseStorage)
    # kopf's 5 s default made 77 of 100 new targets reconcile twice (bench_scale.py); at
    # 60 s none of 1,000 did: a target waits for kopf's own write on a lagging watch
    assert settings.persistence.consistency_timeout >= 60
    assert settings.scanning.disabled is True  # namespaced: no cluster-wide scans
    # every thread that may call the API server at once keeps its connection: kopf's
    # reconciles, the Deployment events' pool, the loop's workers (each hops to a thread)
    from rooftop_operator import kube, loop
    from rooftop_operator.settings import RECONCILE_THREADS

    assert settings.execution.max_workers == RECONCILE_THREADS
    threads = RECONCILE_THREADS + DEPLOYMENT_EVENT_THREADS + loop.TICK_WORKERS
    assert threads <= kube.CONNECTIONS
    configure(settings, OperatorConfig(clusterwide=True, peering="rooftop"))
    assert settings.peering.standalone is False and settings.scanning.disabled is False


def test_peering_priority_and_lifetime_reach_kopf() -> None:
    settings = kopf.OperatorSettings()
    args = parse("-A", "--peering", "ha", "--priority", "7", "--peering-lifetime", "15")
    configure(settings, main_mod.config_from_args(args))
    assert (settings.peering.name, settings.peering.clusterwide) == ("ha", True)
    assert (settings.peering.priority, settings.peering.lifetime) == (7, 15)
    default = main_mod.config_from_args(parse("-n", "x", "--peering", "ha"))
    assert default.peering_lifetime_s == 20  # kopf's own 60 s would make failover slow


def test_the_longest_running_replica_has_the_highest_priority(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without --priority, a replica started later ranks lower, so it stands by rather
    than take over from a healthy active one; 1 µs apart is enough to differ."""
    first = seniority_priority(1_750_000_000_000_000_000)
    assert first > seniority_priority(1_750_000_000_000_001_000) > -(2**53)
    assert seniority_priority() < first < 0  # and any explicit priority >= 0 outranks it
    monkeypatch.setattr(time, "time_ns", lambda: 1_750_000_000_000_000_000)
    config = main_mod.config_from_args(parse("-n", "x", "--peering", "ha"))
    assert config.peering_priority == first


@pytest.mark.parametrize("lifetime", ["9", "0", "-20", "15.5", "soon"])
def test_peering_lifetime_below_kopfs_renewal_margin_is_a_usage_error(lifetime: str) -> None:
    with pytest.raises(SystemExit) as exit_:
        parse("-n", "x", "--peering", "ha", "--peering-lifetime", lifetime)
    assert exit_.value.code == 2


def test_handler_modules_load_and_their_timers_take_the_startup_config() -> None:
    """Timer periods come from the one configuration read at start-up, not the
    environment at import: the loop's ROOFTOP_LOOP_INTERVAL_S and the inventory retry."""
    registry = kopf.OperatorRegistry()
    config = OperatorConfig(nodes_retry_s=7.0, loop=LoopSettings(interval_s=3.0))
    main_mod.load_handlers(config, registry)
    spawning = registry._spawning.get_all_handlers()  # kopf keeps timers with daemons
    timers = [h for h in spawning if type(h).__name__ == "TimerHandler"]
    assert [t.interval for t in timers] == [7.0]
    starts = [h.fn for h in registry._activities.get_all_handlers() if h.id == "feedback_loop"]
    assert [s.keywords["interval_s"] for s in starts if hasattr(s, "keywords")] == [3.0]


def test_loop_settings_come_from_the_environment_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROOFTOP_LOOP_INTERVAL_S", "9")
    assert main_mod.config_from_args(parse("-n", "x")).loop.interval_s == 9.0
    monkeypatch.setenv("ROOFTOP_LOOP_INTERVAL_S", "soon")
    with pytest.raises(ValueError):
        main_mod.config_from_args(parse("-n", "x"))


def test_gpu_inventory_from_env_or_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    assert main_mod.config_from_args(parse("-n", "x")).gpu_inventory is False
    monkeypatch.setenv("ROOFTOP_GPU_INVENTORY", "Nodes")
    assert main_mod.config_from_args(parse("-n", "x")).gpu_inventory is True
    assert (
        main_mod.config_from_args(parse("-n", "x", "--gpu-inventory", "off")).gpu_inventory is False
    )


def test_a_bad_gpu_inventory_mode_is_a_usage_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("ROOFTOP_GPU_INVENTORY", "yes")
    assert main_mod.run(parse("-n", "x")) == 2
    err = capsys.readouterr().err
    assert "ROOFTOP_GPU_INVENTORY" in err and "use nodes or off" in err


@pytest.mark.parametrize("value", ["soon", "-1", "nan"])
def test_a_bad_duration_in_the_environment_names_the_variable(value: str) -> None:
    with pytest.raises(ValueError, match=f"ROOFTOP_NODES_RETRY_S='{value}': give a number"):
        read_settings({"ROOFTOP_NODES_RETRY_S": value})


def test_the_default_pricing_is_read_and_checked_at_startup() -> None:
    pricing = read_settings({"ROOFTOP_DEFAULT_PRICING": '{"owned": {"l4": {"count": 8}}}'})
    assert pricing["default_pricing"].owned["l4"].count == 8


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            '{"owned": {"l44": {"count": 8}}}',
            r"ROOFTOP_DEFAULT_PRICING.owned: unknown GPU id\(s\) l44",
        ),
        (
            '{"owned": {"l4": {"count": 0}}}',
            "ROOFTOP_DEFAULT_PRICING: owned.l4.count: Input should",
        ),
        ("not json", "ROOFTOP_DEFAULT_PRICING: "),
    ],
)
def test_a_bad_default_pricing_names_the_variable(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        read_settings({"ROOFTOP_DEFAULT_PRICING": text})


def test_bad_prometheus_headers_stop_the_operator_before_it_starts() -> None:
    """The loop reads ROOFTOP_PROMETHEUS_* when its module is imported: a fresh process
    (as in a pod) must exit 2 naming the variable, not crash with a traceback."""
    import os
    import subprocess
    import sys

    env = os.environ | {"ROOFTOP_PROMETHEUS_HEADERS": "X-Scope-OrgID=team-a"}
    proc = subprocess.run(
        [sys.executable, "-m", "rooftop_operator", "--namespace", "ns"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "ROOFTOP_PROMETHEUS_HEADERS='X-Scope-OrgID=team-a': give a JSON object" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("message", "level", "shown_at_info"),
    [
        ("Daemon 'presence' succeeded.", logging.INFO, False),
        ("Handler 'engine_deployment_event' succeeded.", logging.INFO, False),
        ("Handler 'reconcile_target' succeeded.", logging.INFO, True),  # a user's change
        ("Timer 'replan_waiting' failed with an exception", logging.ERROR, True),
    ],
)
def test_routine_successes_are_debug(message: str, level: int, shown_at_info: bool) -> None:
    record = logging.LogRecord("kopf.objects", level, __file__, 1, message, None, None)
    root = logging.getLogger()
    before = root.level
    try:
        root.setLevel(logging.INFO)
        assert RoutineSuccesses().filter(record) is shown_at_info
        root.setLevel(logging.DEBUG)  # --verbose: everything, routine lines as DEBUG
        assert RoutineSuccesses().filter(record) is True
    finally:
        root.setLevel(before)


def _spawning_cause(uid: str, memo: Any) -> Any:
    """kopf's own cause for a ServingTarget event, as its reactor builds one."""
    from kopf._cogs.structs import bodies, patches, references
    from kopf._core.engines import indexing
    from kopf._core.intents import causes

    resource = references.Resource(group=spec.GROUP, version=spec.VERSION, plural=spec.PLURAL,
                                   kind="ServingTarget", namespaced=True)  # fmt: skip
    body = bodies.Body({"apiVersion": f"{spec.GROUP}/{spec.VERSION}", "kind": "ServingTarget",
                        "metadata": {"name": "t", "namespace": "ns", "uid": uid},
                        "status": {"conditions": []}})  # fmt: skip
    return causes.SpawningCause(
        logger=logging.getLogger("test"), indices=indexing.OperatorIndexers().indices,
        memo=memo, resource=resource, patch=patches.Patch(), body=body, reset=False,
    )  # fmt: skip


def _runtime() -> Runtime:
    """A runtime with a fake API and its own metrics registry."""
    return Runtime(kube=FakeKube(), catalog=load_catalog(), plan=FakePlanner(),
                            metrics=OperatorMetrics(CollectorRegistry()))  # fmt: skip


async def test_timers_put_no_finalizer_and_stop_when_their_target_is_deleted() -> None:
    """kopf would block every target's deletion with a finalizer for its timers; ours
    ask for none, and the DELETED event's watch handler makes kopf's re-match of the
    timers drop the deleted target's (kopf stops timers whose filter stops matching)."""
    registry = kopf.OperatorRegistry()
    main_mod.load_handlers(OperatorConfig(), registry)
    memo = kopf.Memo(runtime=_runtime())
    cause = _spawning_cause("uid-1", memo)
    assert {h.id for h in registry._spawning.get_handlers(cause=cause)} == {"presence"}
    assert not registry._spawning.requires_finalizer(cause=cause)
    deleted = {"type": "DELETED", "object": dict(cause.body)}
    await handlers.target_event(event=deleted, name="t", namespace="ns", memo=memo)
    assert registry._spawning.get_handlers(cause=cause) == []
    assert registry._spawning.get_handlers(cause=_spawning_cause("uid-2", memo)) != []


def test_recently_deleted_keeps_a_bounded_number_of_uids() -> None:
    recent = RecentlyDeleted(size=2)
    for uid in ("a", "b", "c"):
        recent.add(uid)
    assert "a" not in recent and "b" in recent and "c" in recent


def _target(spec: dict[str, Any], **annotations: str) -> kopf.Body:
    return kopf.Body({"apiVersion": "rooftop.dev/v1alpha1", "kind": "ServingTarget",
                      "metadata": {"name": "t", "namespace": "ns", "annotations": annotations},
                      "spec": spec})  # fmt: skip


def test_kopfs_record_of_the_handled_spec_stays_small_whatever_the_spec() -> None:
    """64 env values of 2,048 accented characters: kopf's JSON copy would be ~800 KiB of
    annotation (over the 256 KiB limit); the digest is a few dozen bytes and still tells
    a spec change from none."""
    settings = kopf.OperatorSettings()
    configure(settings, OperatorConfig(namespaces=("ns",)))
    storage = settings.persistence.diffbase_storage
    env = [{"name": f"V{i}", "value": "é" * 2048} for i in range(64)]
    big = _target({"model": "m", "engine": {"env": env}})
    patch = kopf.Patch()
    storage.store(body=big, patch=patch, essence=storage.build(body=big))
    key = "rooftop.dev/last-handled-configuration"
    stored = patch["metadata"]["annotations"][key]
    assert len(stored) < 200
    handled = _target(big["spec"], **{key: stored})
    assert storage.fetch(body=handled) == storage.build(body=handled)  # nothing new
    edited = _target({**big["spec"], "model": "n"}, **{key: stored})
    from kopf._cogs.structs.diffs import diff  # what kopf's on.update(field="spec") reads

    changes = diff(storage.fetch(body=edited), storage.build(body=edited))
    assert [path for _, path, _, _ in changes] == [("spec", "sha256")]


def test_the_handled_spec_digest_ignores_status_and_bookkeeping_as_kopfs_own_essence() -> None:
    """The digest is built from the body without status and managedFields (kopf would
    deep-copy them only to drop them): it must equal the digest of kopf's own essence of
    the whole body, and still change with a label or the spec."""
    settings = kopf.OperatorSettings()
    configure(settings, OperatorConfig(namespaces=("ns",)))
    storage = settings.persistence.diffbase_storage
    raw = dict(_target({"model": "m"}, note="kept"))
    raw["metadata"] = {
        **raw["metadata"],
        "labels": {"team": "a"},
        "uid": "u",
        "resourceVersion": "7",
        "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}],
    }
    raw["status"] = {"conditions": [{"type": "Ready", "status": "True"}] * 50}
    body = kopf.Body(raw)
    plain = kopf.AnnotationsDiffBaseStorage(prefix="rooftop.dev", key="last-handled-configuration")
    whole = plain.build(body=body)
    assert storage.build(body=body) == {part: {"sha256": digest(value)}
                                        for part, value in whole.items()}  # fmt: skip
    assert set(whole) == {"spec", "metadata"}
    relabelled = kopf.Body({**raw, "metadata": {**raw["metadata"], "labels": {"team": "b"}}})
    assert storage.build(body=relabelled) != storage.build(body=body)


def test_importing_the_handler_modules_registers_nothing() -> None:
    """Only ``wiring.register_handlers`` registers, with the start-up configuration: a handler
    that registered itself at import would run with the defaults, whatever the chart
    said, or twice. (kopf's own login handlers are kopf's.)"""
    script = (
        "import kopf, rooftop_operator.handlers, rooftop_operator.loop\n"
        "import rooftop_operator.reconcile, rooftop_operator.readiness\n"
        "r = kopf.get_default_registry()\n"
        "kinds = (r._changing, r._activities, r._spawning, r._watching, r._indexing)\n"
        "print([h.id for k in kinds for h in k.get_all_handlers()"
        " if getattr(h.fn, '__module__', '').startswith('rooftop')])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "[]"


def test_wiring_registers_every_handler_once() -> None:
    registry = kopf.OperatorRegistry()
    wiring.register_handlers(OperatorConfig(), registry)
    kinds = (registry._changing, registry._watching, registry._indexing)
    ids = sorted(h.id for kind in kinds for h in kind.get_all_handlers())
    on_resume_create_update = ["reconcile_target"] * 2 + ["reconcile_target/spec"]
    watches = ["engine_deployment_event", "engine_deployments", "target_event"]
    assert ids == sorted(on_resume_create_update + watches)
