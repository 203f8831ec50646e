"""A mutating admission webhook, served from this host, that lowers pod CPU and memory
requests in one namespace.

Why: the real node (realnode.py) is labelled as an 8-GPU H100 node but has this
machine's CPUs and memory (2 cores, 24 GiB in CI). The operator asks for 2 CPUs and
16 GiB per GPU (builders.CPU_PER_GPU, MEMORY_GI_PER_GPU), so a second engine pod would
never fit (scheduler and kubelet admission both count requests). This webhook rewrites
the requests of pods created in the test's namespace, at creation only: the operator's
Deployment is untouched, so it sees no drift. The API server runs on this host and calls
``https://127.0.0.1:<port>``; the serving certificate is signed by a throwaway CA whose
certificate is the webhook's caBundle.
"""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
import json
import ssl
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tests.cluster.handle import ClusterHandle


def _cert(
    subject: str, issuer: x509.Name | None, key: ec.EllipticCurvePrivateKey,
    signer: ec.EllipticCurvePrivateKey, ca: bool,
) -> x509.Certificate:  # fmt: skip
    now = dt.datetime.now(dt.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer or name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
    )
    if ca:
        builder = builder.add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
    else:
        san = x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
        builder = builder.add_extension(san, False).add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False
        )
    return builder.sign(signer, hashes.SHA256())


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


class RequestsWebhook:
    """Lowers every container's cpu/memory requests (and limits above them) in pods
    created in ``namespace``; ``install()`` registers it, ``close()`` removes it."""

    def __init__(self, cluster: ClusterHandle, namespace: str, cpu: str, memory: str) -> None:
        self.cluster, self.namespace = cluster, namespace
        self.cpu, self.memory = cpu, memory
        self.name = f"rooftop-requests-{namespace}"
        self.mutated = 0
        ca_key = ec.generate_private_key(ec.SECP256R1())
        key = ec.generate_private_key(ec.SECP256R1())
        ca = _cert("rooftop-webhook-ca", None, ca_key, ca_key, ca=True)
        leaf = _cert("127.0.0.1", ca.subject, key, ca_key, ca=False)
        self.ca_pem = _pem(ca)
        self._dir = tempfile.TemporaryDirectory(prefix="rooftop-webhook-")
        crt, key_path = Path(self._dir.name, "tls.crt"), Path(self._dir.name, "tls.key")
        crt.write_bytes(_pem(leaf))
        key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                               serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))  # fmt: skip
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(crt, key_path)
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                body = json.dumps(hook.review(review)).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.server.server_address[1]}/mutate"

    def review(self, review: dict[str, Any]) -> dict[str, Any]:
        request = review["request"]
        patch: list[dict[str, Any]] = []
        for i, container in enumerate(request["object"]["spec"].get("containers", [])):
            resources = container.get("resources") or {}
            requests = dict(resources.get("requests") or {})
            if "cpu" not in requests and "memory" not in requests:
                continue
            requests |= {"cpu": self.cpu, "memory": self.memory}
            patch.append({"op": "add", "path": f"/spec/containers/{i}/resources/requests",
                          "value": requests})  # fmt: skip
            limits = dict(resources.get("limits") or {})
            if limits.pop("cpu", None) is not None or limits.pop("memory", None) is not None:
                patch.append({"op": "add", "path": f"/spec/containers/{i}/resources/limits",
                              "value": limits})  # fmt: skip
        response: dict[str, Any] = {"uid": request["uid"], "allowed": True}
        if patch:
            self.mutated += 1
            encoded = base64.b64encode(json.dumps(patch).encode()).decode()
            response |= {"patchType": "JSONPatch", "patch": encoded}
        return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                "response": response}  # fmt: skip

    def install(self) -> RequestsWebhook:
        self._thread.start()
        config = {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": self.name},
            "webhooks": [{
                "name": "requests.rooftop.dev",
                "clientConfig": {"url": self.url,
                                 "caBundle": base64.b64encode(self.ca_pem).decode()},
                "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                           "resources": ["pods"]}],
                "namespaceSelector": {
                    "matchLabels": {"kubernetes.io/metadata.name": self.namespace}},
                "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
                "failurePolicy": "Fail",
                "timeoutSeconds": 5,
            }],
        }  # fmt: skip
        self.cluster.kubectl("apply", "-f", "-", stdin=json.dumps(config))
        return self

    def close(self) -> None:
        self.cluster.kubectl("delete", "mutatingwebhookconfiguration", self.name, check=False)
        self.server.shutdown()
        self.server.server_close()
        self._dir.cleanup()
