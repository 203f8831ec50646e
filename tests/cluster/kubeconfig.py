"""Kubeconfig files: the admin one, and ServiceAccount ones minted with TokenRequest.

Why ServiceAccount kubeconfigs: the operator e2e tests run the operator out of cluster,
but with the credentials of the Helm chart's ServiceAccount, so a missing RBAC rule
fails the test instead of being hidden by admin rights. Works for any cluster reachable
through an admin kubeconfig (the local control plane or ROOFTOP_KUBECONFIG).
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import yaml

from tests.cluster.pki import Pki

TOKEN_SECONDS = 24 * 3600


def write_admin(path: Path, server: str, pki: Pki) -> Path:
    """Self-contained kubeconfig (data embedded) so it can be copied elsewhere."""
    config = _config(
        server,
        _b64(pki.ca_crt),
        {
            "client-certificate-data": _b64(pki.admin_crt),
            "client-key-data": _b64(pki.admin_key),
        },
        user="admin",
    )
    return _dump(path, config)


def serviceaccount_kubeconfig(
    admin_kubeconfig: Path, namespace: str, name: str, out_dir: Path
) -> Path:
    """Mint a token for ServiceAccount namespace/name and write a kubeconfig using it.

    The ServiceAccount must exist. The token is bound to nothing but its expiry
    (24 h), so it stays valid for the whole test session.
    """
    from kubernetes import client, config

    api = config.new_client_from_config(config_file=str(admin_kubeconfig))  # type: ignore[no-untyped-call]
    try:
        spec = client.V1TokenRequestSpec(audiences=[], expiration_seconds=TOKEN_SECONDS)
        resp = client.CoreV1Api(api).create_namespaced_service_account_token(
            name, namespace, client.AuthenticationV1TokenRequest(spec=spec)
        )
    finally:
        api.close()
    token = resp.status.token if resp.status else None
    if not token:
        raise RuntimeError(f"TokenRequest for {namespace}/{name} returned no token")
    cluster = current_cluster(admin_kubeconfig)
    user = f"system:serviceaccount:{namespace}:{name}"
    out = _config_with_cluster(cluster, {"token": token}, user=user)
    out_dir.mkdir(parents=True, exist_ok=True)
    return _dump(out_dir / f"sa-{namespace}-{name}.kubeconfig", out)


def current_cluster(kubeconfig: Path) -> dict[str, Any]:
    """The `cluster` entry of the current context, with a CA file made absolute."""
    doc = yaml.safe_load(kubeconfig.read_text())
    ctx_name = doc.get("current-context") or doc["contexts"][0]["name"]
    ctx = next(c["context"] for c in doc["contexts"] if c["name"] == ctx_name)
    cluster = dict(next(c["cluster"] for c in doc["clusters"] if c["name"] == ctx["cluster"]))
    ca = cluster.get("certificate-authority")
    if ca and not Path(ca).is_absolute():
        cluster["certificate-authority"] = str((kubeconfig.parent / ca).resolve())
    return cluster


def _config(server: str, ca_data: str, creds: dict[str, str], *, user: str) -> dict[str, Any]:
    cluster = {"server": server, "certificate-authority-data": ca_data}
    return _config_with_cluster(cluster, creds, user=user)


def _config_with_cluster(
    cluster: dict[str, Any], creds: dict[str, str], *, user: str
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "rooftop", "cluster": cluster}],
        "users": [{"name": user, "user": creds}],
        "contexts": [{"name": "rooftop", "context": {"cluster": "rooftop", "user": user}}],
        "current-context": "rooftop",
        "preferences": {},
    }


def _dump(path: Path, config: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)
    return path


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()
