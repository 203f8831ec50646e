"""The Kubernetes client wrapper against an API server that is not there."""

from __future__ import annotations

import pytest
from kubernetes import client

from rooftop_operator.kube import Kube, KubeError


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
