"""The API server, reachable from pods on the real node through the `kubernetes` Service.

Why: the local control plane (controlplane.py) listens on 127.0.0.1, which a pod's
network namespace cannot reach, and its endpoint reconciler is off (loopback is not a
valid endpoint), so in-cluster clients (the operator installed with helm) have no API
server. This does what a real cluster's control plane provides:

- a TCP relay on the real node's bridge address (``RealNode.gateway``) forwards each
  connection to the API server's loopback port, bytes unchanged: TLS passes through,
  and the serving certificate already names 10.0.0.1, the `kubernetes` Service's
  ClusterIP (pki.py);
- an EndpointSlice gives the `default/kubernetes` Service that address, as the API
  server's own reconciler would, so kube-proxy routes the ClusterIP to it and a pod's
  ``KUBERNETES_SERVICE_HOST`` works as on any cluster.

Pods authenticate with their projected ServiceAccount token and verify the server
against the ``kube-root-ca.crt`` ConfigMap the controller manager publishes.
"""

from __future__ import annotations

import contextlib
import json
import selectors
import socket
import threading
from collections.abc import Iterator
from urllib.parse import urlparse

import yaml

from tests.cluster.handle import ClusterHandle

SLICE_NAME = "kubernetes-real-node"
BUFFER = 65536


def _pump(a: socket.socket, b: socket.socket) -> None:
    """Copy bytes both ways until either side closes."""
    sel = selectors.DefaultSelector()
    sel.register(a, selectors.EVENT_READ, b)
    sel.register(b, selectors.EVENT_READ, a)
    try:
        while True:
            for key, _ in sel.select():
                src: socket.socket = key.fileobj  # type: ignore[assignment]
                data = src.recv(BUFFER)
                if not data:
                    return
                key.data.sendall(data)
    except OSError:
        return
    finally:
        sel.close()
        a.close()
        b.close()


class Relay:
    """Accept on (host, any port) and connect each client to ``upstream``."""

    def __init__(self, host: str, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.listener = socket.create_server((host, 0))
        self.port: int = self.listener.getsockname()[1]
        self._thread = threading.Thread(target=self._accept, name="apiserver-relay", daemon=True)

    def start(self) -> Relay:
        self._thread.start()
        return self

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return  # closed
            try:
                server = socket.create_connection(self.upstream, timeout=10)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            threading.Thread(target=_pump, args=(client, server), daemon=True).start()

    def close(self) -> None:
        self.listener.close()


def endpoint_slice(address: str, port: int) -> dict[str, object]:
    """The `kubernetes` Service's endpoint: its port is named ``https``."""
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": SLICE_NAME,
            "namespace": "default",
            "labels": {"kubernetes.io/service-name": "kubernetes"},
        },  # fmt: skip
        "addressType": "IPv4",
        "endpoints": [{"addresses": [address], "conditions": {"ready": True}}],
        "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
    }


@contextlib.contextmanager
def api_server_for_pods(cluster: ClusterHandle, gateway: str) -> Iterator[Relay]:
    """While inside: pods reach the API server at the `kubernetes` Service."""
    config = yaml.safe_load(cluster.kubeconfig.read_text())
    url = urlparse(config["clusters"][0]["cluster"]["server"])
    relay = Relay(gateway, (url.hostname or "127.0.0.1", url.port or 443)).start()
    slice_doc = json.dumps(endpoint_slice(gateway, relay.port))
    cluster.kubectl("apply", "-f", "-", stdin=slice_doc)
    try:
        yield relay
    finally:
        cluster.kubectl("-n", "default", "delete", "endpointslice", SLICE_NAME,
                        "--ignore-not-found", check=False)  # fmt: skip
        relay.close()
