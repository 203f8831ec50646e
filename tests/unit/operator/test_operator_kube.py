"""The Kubernetes client wrapper against an API server that is not there."""

from __future__ import annotations

import json

import pytest
import yaml
from kubernetes import client

from rooftop_operator.kube import Kube, KubeError, apply_body


@pytest.fixture
def unreachable() -> Kube:
    """A client whose API server refuses connections (nothing listens on port 1)."""
    cfg = client.Configuration()
    cfg.host = "http://127.0.0.1:1"
    cfg.retries = 0
    return Kube(client.ApiClient(cfg))


def test_a_refused_connection_is_a_transient_kube_error(unreachable: Kube) -> None:
    """Callers handle it like any other API error (skip, retry) instead of letting an
    urllib3 exception escape as a traceback."""
    with pytest.raises(KubeError) as err:
        unreachable.get("apps/v1", "Deployment", "ns", "chat")
    assert err.value.status == 0 and err.value.transient
    assert "API server unreachable" in str(err.value)


@pytest.mark.parametrize(
    "call",
    [
        lambda k: k.apply({"apiVersion": "apps/v1", "kind": "Deployment",
                           "metadata": {"name": "x", "namespace": "ns"}}),
        lambda k: k.list_pods("ns", {"app": "x"}),
        lambda k: k.update_status("ns", "chat", lambda s: {**s, "x": 1}),
    ],
)  # fmt: skip
def test_every_call_reports_the_outage_the_same_way(unreachable: Kube, call: object) -> None:
    with pytest.raises(KubeError, match="unreachable"):
        call(unreachable)  # type: ignore[operator]


@pytest.mark.parametrize(
    "value",
    ["héllo 🚀 שלום", "🚀🚀", "nul\x00 and \u0085 stay escaped", "a\\ud83d\\ude80 is text", "\\🚀"],
)
def test_an_apply_body_is_yaml_the_api_server_reads(value: str) -> None:
    """Characters beyond U+FFFF go raw (the API server's YAML reader refuses their JSON
    surrogate escapes); everything else stays escaped; the value round-trips."""
    body = apply_body({"env": [{"name": "X", "value": value}]})
    assert json.loads(body) == {"env": [{"name": "X", "value": value}]}
    assert yaml.safe_load(body.decode("utf-8")) == {"env": [{"name": "X", "value": value}]}
    assert b"\\ud83d\\ude80" not in body.replace(b"\\\\ud83d\\\\ude80", b"")


def test_api_discovery_is_asked_once_a_minute_not_per_reconcile(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from rooftop_operator import kube as kube_mod

    asked: list[str] = []
    clock = [0.0]
    monkeypatch.setattr(kube_mod.Kube, "_discover", lambda self, gv, plural: not asked.append(gv))
    monkeypatch.setattr(kube_mod.time, "monotonic", lambda: clock[0])
    kube = kube_mod.Kube(api=None)
    for _ in range(100):  # a burst of reconciles
        assert kube.has_api("monitoring.coreos.com/v1", "podmonitors")
    assert len(asked) == 1
    clock[0] = kube_mod.DISCOVERY_TTL_S + 1  # someone may have installed the CRD since
    kube.has_api("monitoring.coreos.com/v1", "podmonitors")
    assert len(asked) == 2


class _StatusApi:
    """The two calls ``update_status`` makes, with a server-side resourceVersion."""

    def __init__(self) -> None:
        self.stored = {"metadata": {"name": "chat", "uid": "u", "resourceVersion": "2"},
                       "status": {"x": 0}}  # fmt: skip
        self.gets = 0
        self.writes: list[dict[str, object]] = []

    def get(self) -> dict[str, object]:
        self.gets += 1
        return json.loads(json.dumps(self.stored))

    def replace(self, body: dict[str, object]) -> None:
        meta = body["metadata"]
        assert isinstance(meta, dict)
        if meta["resourceVersion"] != self.stored["metadata"]["resourceVersion"]:  # type: ignore[index]
            raise KubeError(409, "the object has been modified")
        self.writes.append(body)


def _status_kube(monkeypatch: pytest.MonkeyPatch, server: _StatusApi) -> Kube:
    kube = Kube(api=None)
    monkeypatch.setattr(kube, "get_target", lambda namespace, name: server.get())

    class Custom:
        @staticmethod
        def replace_namespaced_custom_object_status(*args: object) -> None:
            server.replace(args[-1])  # type: ignore[arg-type]

    monkeypatch.setattr(kube, "_custom", lambda: Custom)
    return kube


def test_a_status_write_uses_the_body_in_hand_and_reads_only_on_a_conflict(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server = _StatusApi()
    kube = _status_kube(monkeypatch, server)
    fresh = server.get()
    server.gets = 0
    assert kube.update_status("ns", "chat", lambda s: {**s, "x": 1}, seen=fresh) == {"x": 1}
    assert server.gets == 0 and len(server.writes) == 1  # no read: the event's body
    stale = {**fresh, "metadata": {**fresh["metadata"], "resourceVersion": "1"}}
    assert kube.update_status("ns", "chat", lambda s: {**s, "x": 2}, seen=stale) == {"x": 2}
    assert server.gets == 1 and len(server.writes) == 2  # 409, then read and written
