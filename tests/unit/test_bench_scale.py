"""The scale benchmark's pure parts (``benchmarks/bench_scale.py``): audit-log parsing
and counting, percentiles, /proc and Prometheus text parsing, the manifest and table."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml


@pytest.fixture(scope="module")
def bench(load_benchmark: Callable[[str], ModuleType]) -> ModuleType:
    return load_benchmark("bench_scale")


OPERATOR = "system:serviceaccount:rooftop-system:bench-rooftop"


def event(audit_id: str, verb: str, user: str, at: str, uri: str = "/x", stage: str =
          "ResponseComplete", **ref: str) -> str:  # fmt: skip
    """One audit log line as the API server writes it (Metadata level)."""
    raw: dict[str, Any] = {
        "kind": "Event", "apiVersion": "audit.k8s.io/v1", "level": "Metadata",
        "auditID": audit_id, "stage": stage, "requestURI": uri, "verb": verb,
        "user": {"username": user, "groups": ["system:authenticated"]},
        "requestReceivedTimestamp": f"2025-06-01T12:00:{at}Z",
        "stageTimestamp": f"2025-06-01T12:00:{at}Z",
        "responseStatus": {"metadata": {}, "code": 200},
    }  # fmt: skip
    if ref:
        raw["objectRef"] = ref
    return json.dumps(raw)


def target(name: str, verb: str, user: str, at: str, audit_id: str, **more: str) -> str:
    return event(audit_id, verb, user, at, resource="servingtargets", namespace="ns",
                 name=name, **more)  # fmt: skip


def deployment(name: str, verb: str, at: str, audit_id: str, **more: str) -> str:
    return event(audit_id, verb, OPERATOR, at, resource="deployments", namespace="ns",
                 name=f"{name}-engine", apiGroup="apps", **more)  # fmt: skip


LOG = [
    target("a", "patch", "admin", "00.000100", "1"),  # kubectl apply --server-side creates
    target("b", "patch", "admin", "00.250000", "2"),
    target("a", "patch", OPERATOR, "00.500000", "3"),  # the finalizer: not a creation
    target("a", "update", OPERATOR, "01.000000", "4", subresource="status"),
    deployment("a", "patch", "01.500000", "5"),
    deployment("b", "patch", "02.000000", "6"),
    deployment("b", "patch", "03.000000", "7"),  # b's Deployment written twice
    deployment("a", "update", "03.500000", "8", subresource="status"),  # status: not counted
    event("9", "watch", OPERATOR, "04.000000", stage="ResponseStarted", resource="pods"),
    event("9", "watch", OPERATOR, "04.000000", resource="pods"),  # same watch, ended
    deployment("a", "get", "05.000000", "10"),
    deployment("a", "patch", "30.000000", "11"),  # after the burst
    "{torn line",
]


def test_each_request_is_parsed_once_with_microseconds(bench: ModuleType) -> None:
    events = bench.parse_audit(LOG)
    assert [e.audit_id for e in events] == [str(i) for i in range(1, 12)]
    first = events[0]
    assert (first.verb, first.user, first.resource, first.namespace, first.name) == (
        "patch", "admin", "servingtargets", "ns", "a")  # fmt: skip
    assert first.received == pytest.approx(bench.parse_time("2025-06-01T12:00:00Z") + 1e-4)
    assert first.code == 200 and first.subresource == ""


def test_creation_is_the_first_write_by_someone_else(bench: ModuleType) -> None:
    created = bench.creation_times(bench.parse_audit(LOG), OPERATOR)
    base = bench.parse_time("2025-06-01T12:00:00Z")
    assert created == {"ns/a": pytest.approx(base + 1e-4), "ns/b": pytest.approx(base + 0.25)}


def test_deployment_writes_count_the_operators_within_the_burst(bench: ModuleType) -> None:
    events = bench.parse_audit(LOG)
    base = bench.parse_time("2025-06-01T12:00:00Z")
    writes = bench.deployment_writes(events, OPERATOR, base, base + 10)
    assert writes == {"ns/a": 1, "ns/b": 2}
    assert bench.deployment_writes(events, OPERATOR, base, base + 60)["ns/a"] == 2


def test_request_counts_split_reads_and_writes_in_the_window(bench: ModuleType) -> None:
    events = bench.parse_audit(LOG)
    base = bench.parse_time("2025-06-01T12:00:00Z")
    counts = bench.request_counts(events, OPERATOR, base + 0.9, base + 5)
    assert (counts.reads, counts.writes) == (2, 5)
    assert counts.by_kind == {"patch deployments": 3, "update servingtargets/status": 1,
                              "update deployments/status": 1, "watch pods": 1,
                              "get deployments": 1}  # fmt: skip
    assert bench.request_counts(events, OPERATOR, base + 6, base + 20).by_kind == {}


OPERATOR_LOG = """\
[12:00:01] kopf.objects [INFO    ] [ns/a] Handler 'reconcile_target' succeeded.
[12:00:01] kopf.objects [INFO    ] [ns/a] Creation is processed: 1 succeeded; 0 failed.
[12:00:02] kopf.objects [INFO    ] [ns/b] Creation is processed: 1 succeeded; 0 failed.
[12:00:09] kopf.objects [INFO    ] [ns/a] Creation is processed: 1 succeeded; 0 failed.
[12:00:09] kopf.objects [INFO    ] [ns/b] Updating is processed: 1 succeeded; 0 failed.
"""


def test_creation_passes_count_kopfs_creation_lines(bench: ModuleType) -> None:
    assert bench.creation_passes(OPERATOR_LOG) == {"ns/a": 2, "ns/b": 1}


def test_percentile_interpolates_like_numpy(bench: ModuleType) -> None:
    values = [4.0, 1.0, 3.0, 2.0]
    assert bench.percentile(values, 0.5) == 2.5
    assert bench.percentile(values, 0.0) == 1.0 and bench.percentile(values, 1.0) == 4.0
    assert bench.percentile(list(map(float, range(101))), 0.95) == pytest.approx(95.0)
    assert bench.percentile([7.0], 0.99) == 7.0
    assert math.isnan(bench.percentile([], 0.5))


def test_latencies_pair_each_target_with_its_creation(bench: ModuleType) -> None:
    assert bench.latencies({"ns/a": 12.5, "ns/b": 11.0, "ns/c": 9.0},
                           {"ns/a": 10.0, "ns/b": 10.5}) == [2.5, 0.5]  # fmt: skip


def test_proc_parsing(bench: ModuleType) -> None:
    stat = "4242 (python -m (x)) S 1 4242 4242 0 -1 4194560 1 0 0 0 150 25 0 0 20 0 3 0 1"
    assert bench.cpu_ticks(stat) == 175
    status = "Name:\tpython\nVmPeak:\t 300 kB\nVmRSS:\t  123456 kB\nThreads:\t3\n"
    assert bench.rss_kib(status) == 123456


PROM = """\
# HELP prometheus_http_requests_total Counter of HTTP requests.
# TYPE prometheus_http_requests_total counter
prometheus_http_requests_total{code="200",handler="/api/v1/query"} 40
prometheus_http_requests_total{code="400",handler="/api/v1/query"} 2
prometheus_http_requests_total{code="200",handler="/api/v1/query_range"} 7
prometheus_engine_query_duration_seconds_count{slice="inner_eval"} 42
prometheus_engine_query_duration_seconds_count{slice="queue_time"} 44
"""


def test_metric_sum_matches_whole_label_values(bench: ModuleType) -> None:
    assert bench.metric_sum(PROM, *bench.PROMQL) == 42.0
    assert bench.metric_sum(PROM, *bench.INNER_EVALS) == 42.0
    assert bench.metric_sum(PROM, "absent_total", {}) == 0.0


def test_target_docs_spread_distinct_names_over_namespaces(bench: ModuleType) -> None:
    doc = {"apiVersion": "rooftop.dev/v1alpha1", "kind": "ServingTarget",
           "metadata": {"name": "sim-chat"}, "spec": {"model": "m"}}  # fmt: skip
    docs = list(yaml.safe_load_all(bench.target_docs(doc, 6, ("a", "b", "c", "d"))))
    assert [d["metadata"]["name"] for d in docs] == [f"sim-chat-{i:04d}" for i in range(6)]
    assert [d["metadata"]["namespace"] for d in docs] == ["a", "b", "c", "d", "a", "b"]
    assert all(d["spec"] == {"model": "m"} for d in docs) and doc["metadata"] == {
        "name": "sim-chat"}  # fmt: skip


def test_table_has_one_row_per_n(bench: ModuleType) -> None:
    result = bench.Result(
        targets=100, all_deployed_s=12.34, all_ready_s=20.0, deployed_p50_s=1.0,
        deployed_p95_s=2.5, deployed_p99_s=3.25, reconciled_twice=2, handled_twice=0,
        rss_mib=150.4,
        cpu_pct=3.21, reads_per_s=6.667, steady_writes=0, promql_per_tick=12.0,
        inner_evals_per_tick=12.0, apply_start=0.0, apply_s=1.0, steady_s=60.0,
        loop_interval_s=15.0,
    )  # fmt: skip
    lines = bench.table([result]).splitlines()
    assert lines[0].startswith("| targets | all Deployed | all Ready | per target p50")
    assert lines[2] == ("| 100 | 12.3 s | 20.0 s | 1.00 / 2.50 / 3.25 s | 2 of 100 | 150 MiB "
                        "| 3.2 % | 6.67 | 0 | 12.0 | none |")  # fmt: skip
    result.live, result.observed_targets = True, 98
    assert "| 12.0 | live, 98 targets observed |" in bench.table([result])
    result.handled_twice = 7
    assert "| 2 of 100 (creation handled twice: 7) |" in bench.table([result])
    assert lines[-1] == "N=100: the apply took 1.0 s"
    result.apply_alone_s, result.children_alone_s, result.ready_alone_s = 0.5, 4.25, 9.0
    assert bench.table([result]).splitlines()[-1] == (
        "N=100: the apply took 1.0 s; with no operator, the same apply took 0.5 s, applying "
        "the children `rooftop render` makes for the targets 4.2 s more, and every engine "
        "was Ready 9.0 s after the start")  # fmt: skip


def test_the_no_operator_baseline_applies_what_the_operator_would(
    bench: ModuleType, tmp_path: Path
) -> None:
    """Per target: its Deployment, Service and PDB as the operator builds them, with no
    owner (the target's uid does not exist yet, and an owner that never appears would
    have the garbage collector delete them) and no PodMonitor (the bench cluster has no
    Prometheus Operator, as the operator would find)."""
    targets = tmp_path / "targets.yaml"
    targets.write_text(bench.target_docs(bench._example(), 3, ("a", "b")))
    listed = bench.rendered_children(targets)
    kinds = [(o["kind"], o["metadata"]["namespace"]) for o in listed["items"]]
    assert sorted(kinds) == sorted(
        (k, ns) for ns in ("a", "b", "a") for k in ("Deployment", "Service", "PodDisruptionBudget")
    )
    assert not any("ownerReferences" in o["metadata"] for o in listed["items"])
    names = {o["metadata"]["name"] for o in listed["items"] if o["kind"] == "Deployment"}
    assert len(names) == 3
    chunks = bench.chunked(listed, 4)
    assert [len(c["items"]) for c in chunks] == [3, 2, 2, 2]
    assert sorted(map(str, (o for c in chunks for o in c["items"]))) == sorted(
        map(str, listed["items"])) and all(c["kind"] == "List" for c in chunks)  # fmt: skip
    assert len(bench.chunked({"kind": "List", "items": [1]}, 8)) == 1


def test_quick_and_target_lists(bench: ModuleType) -> None:
    assert bench.parse_args([]).ns == [100, 300, 1000]
    quick = bench.parse_args(["--quick"])
    assert quick.ns == [20] and quick.steady_s == 30.0
    assert bench.parse_args(["--targets", "5, 10"]).ns == [5, 10]


def test_control_plane_audits_only_when_asked(tmp_path: Path) -> None:
    """tests/cluster's ControlPlane: no audit flags by default (the e2e suite's API
    server is unchanged); with ``audit_log``, the policy and the log path."""
    from tests.cluster.controlplane import AUDIT_POLICY, ControlPlane

    plain = ControlPlane(state_dir=tmp_path)._apiserver_flags()
    assert not [f for f in plain if f.startswith("--audit")]
    policy, log = tmp_path / "policy.yaml", tmp_path / "audit.log"
    audited = ControlPlane(state_dir=tmp_path, audit_log=log, audit_policy=policy)
    flags = audited._apiserver_flags()
    assert f"--audit-policy-file={policy}" in flags and f"--audit-log-path={log}" in flags
    rules = yaml.safe_load(AUDIT_POLICY)["rules"]
    assert rules[-1] == {"level": "Metadata"}  # everything not excluded above
    assert yaml.safe_load(AUDIT_POLICY)["omitStages"] == ["RequestReceived"]
