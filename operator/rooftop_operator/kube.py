"""The few Kubernetes API calls the operator makes, behind one small class.

Why not kopf's ``patch`` for everything: children are written with server-side apply
(fieldManager ``rooftop``, force), which is idempotent by construction and takes back
fields someone edited by hand; and ``status`` is written with read-modify-write guarded
by ``resourceVersion`` (``update_status``), because three writers share
``status.conditions`` (the reconcile handler, the readiness watcher and the feedback
loop) and a merge patch would let one overwrite another's condition.

``Kube`` is the only place that imports the kubernetes client; handler tests pass a fake
with the same methods. ``check_cluster`` is the operator's pre-flight: the credentials
kopf will load, and one cheap call to the API server, before kopf starts.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import os
import re
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Final

import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from rooftop_api import exit_codes
from rooftop_api.spec import (
    API_VERSION,
    GROUP,
    KIND,
    PLURAL,
    POOL_LABEL,
    TARGET_LABEL,
    VERSION,
)
from rooftop_operator.errors import OperatorError

FIELD_MANAGER: Final = "rooftop"
APPLY_CONTENT_TYPE: Final = "application/apply-patch+yaml"
STATUS_RETRIES: Final = 5
# Kept-alive connections to the API server: one per thread that may call it at once
# (kopf's handler pool, the Deployment events' pool, the loop's workers). The client's
# default (5 per CPU) made a burst open and discard connections ("pool is full").
CONNECTIONS: Final = 32
# How long an answer of API discovery (is the PodMonitor kind served?) is reused: a
# burst's reconciles ask once per period instead of once each, and a Prometheus Operator
# installed meanwhile is noticed by the targets reconciled after it.
DISCOVERY_TTL_S: Final = 10.0
# Group, version and plural of the ServingTarget API.
TARGET_GVP: Final = (GROUP, VERSION, PLURAL)

log = logging.getLogger(__name__)

Obj = dict[str, Any]
# A finished pod's resources are free again; the API server filters them out.
UNFINISHED_PODS: Final = "status.phase!=Succeeded,status.phase!=Failed"
StatusMutation = Callable[[Obj], Obj]


class KubeError(OperatorError, RuntimeError):
    """An API call failed. ``transient`` errors are worth retrying as they are."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.message = message

    @property
    def transient(self) -> bool:
        """A lost connection (0), a conflict, throttling or a server error."""
        return self.status in (0, 409, 429) or self.status >= 500

    @property
    def namespace_terminating(self) -> bool:
        """The namespace is being deleted and takes no new objects (HTTP 403 with the
        NamespaceLifecycle admission plugin's message): nothing to repair or report."""
        return self.status == 403 and "being terminated" in self.message

    @classmethod
    def from_api(cls, err: ApiException) -> KubeError:
        message = str(err.reason)
        with contextlib.suppress(TypeError, ValueError, KeyError):
            message = json.loads(err.body or "")["message"]
        return cls(int(err.status or 0), message)


@contextlib.contextmanager
def api_errors() -> Iterator[None]:
    """Turn the client's failures into ``KubeError``: an HTTP error keeps its status; a
    connection that fails (API server restarting, network blip) is status 0, transient,
    so callers handle both the same way instead of one as an unexpected traceback."""
    try:
        yield
    except ApiException as err:
        raise KubeError.from_api(err) from err
    except (HTTPError, OSError) as err:
        raise KubeError(0, f"API server unreachable: {err}") from err


class ClusterUnavailable(OperatorError, RuntimeError):
    """No cluster to talk to. ``exit_code``: 2, no usable configuration (credentials);
    1, the API server cannot be reached (or answers with a server error)."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def load_credentials() -> str:
    """Load credentials as kopf does: in-cluster (a pod's ServiceAccount), else the
    kubeconfig ($KUBECONFIG or ~/.kube/config). Returns the API server's URL."""
    try:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    except config.ConfigException as in_cluster:
        try:
            config.load_kube_config()  # type: ignore[no-untyped-call]
        except (config.ConfigException, yaml.YAMLError, OSError) as err:
            raise ClusterUnavailable(_no_config(in_cluster, err), exit_codes.BAD_INPUT) from None
    return str(client.Configuration.get_default_copy().host)


def _no_config(in_cluster: Exception, kubeconfig: Exception) -> str:
    """Why neither way of loading credentials worked, and what to do: one line."""
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        pod = f"the in-cluster credentials are unusable ({_one_line(in_cluster)})"
    else:
        pod = "not in a cluster (KUBERNETES_SERVICE_HOST is unset)"
    named = os.environ.get("KUBECONFIG")
    where = f"KUBECONFIG={named}" if named else "~/.kube/config"
    paths = [os.path.expanduser(p) for p in (named or "~/.kube/config").split(os.pathsep) if p]
    if any(os.path.exists(p) for p in paths):
        kube = f"the kubeconfig ({where}) is unusable: {_one_line(kubeconfig)}"
    else:
        kube = f"no kubeconfig ({where} not found)"
    return (
        f"no Kubernetes configuration: {pod} and {kube}; point KUBECONFIG at a "
        "kubeconfig, or run in a pod with a ServiceAccount"
    )


def _one_line(err: BaseException, limit: int = 200) -> str:
    """An error's message on one line, at most ``limit`` characters."""
    text = " ".join(str(err).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_cluster(timeout_s: float = 5.0) -> str:
    """The operator's pre-flight: load the credentials (``load_credentials``) and ask
    the API server its version, once, within ``timeout_s``. Returns the server's URL;
    raises ``ClusterUnavailable`` saying what is wrong."""
    host = load_credentials()
    settings = client.Configuration.get_default_copy()
    settings.retries = 0  # one try: a pre-flight, not a wait for the cluster
    with client.ApiClient(settings) as api:
        try:
            # raw: whether it answers matters, not whether its answer fits the client's model
            client.VersionApi(api).get_code(
                _request_timeout=(timeout_s, timeout_s), _preload_content=False
            )
        except ApiException as err:
            _judge_answer(err, host)
        except (HTTPError, OSError) as err:
            unreachable = f"cannot reach the API server at {host}: {_reason(err)}"
            raise ClusterUnavailable(unreachable, exit_codes.INFEASIBLE) from None
    return host


def _judge_answer(err: ApiException, host: str) -> None:
    """Raise for a 401 (credentials refused), a server error or no HTTP answer (status
    0: TLS failed). Any other answer passes: the server is there, and the operator's own
    calls report their permissions."""
    if err.status == 401:
        refused = (
            f"the API server at {host} refused the credentials (HTTP 401); check the "
            "kubeconfig's user or the ServiceAccount token"
        )
        raise ClusterUnavailable(refused, exit_codes.BAD_INPUT) from None
    if not err.status or err.status >= 500:
        unreachable = f"cannot reach the API server at {host}: {_one_line(err)}"
        raise ClusterUnavailable(unreachable, exit_codes.INFEASIBLE) from None


def _reason(err: Exception) -> str:
    """urllib3's innermost reason, without the connection object's description
    (``HTTPSConnection(host=..., port=...): `` or ``<...Connection object at 0x...>: ``)."""
    reason = getattr(err, "reason", None) or err
    return re.sub(r"^(<[^>]*>|\w+\([^)]*\)): ", "", _one_line(reason))


# A UTF-16 surrogate pair as json.dumps escapes a character beyond U+FFFF ("🚀" ->
# "\ud83d\ude80"), not preceded by an escaping backslash.
_SURROGATE_PAIR = re.compile(r"(?<!\\)((?:\\\\)*)\\u(d[89ab][0-9a-f]{2})\\u(d[c-f][0-9a-f]{2})")


def apply_body(obj: Mapping[str, Any]) -> bytes:
    """``obj`` as the body of a server-side apply: JSON (valid YAML), ASCII-escaped except
    characters beyond U+FFFF, which are written as themselves.

    Why: the API server reads an apply body as YAML, and its YAML reader refuses the
    surrogate-pair escapes JSON uses for those characters (an emoji in an env value made
    the apply fail with HTTP 400). Written raw they are printable YAML; everything else
    stays escaped, so no control character reaches the YAML reader raw.
    """
    text = json.dumps(obj, separators=(",", ":"))

    def joined(match: re.Match[str]) -> str:
        high, low = int(match.group(2), 16), int(match.group(3), 16)
        return match.group(1) + chr(0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00))

    return _SURROGATE_PAIR.sub(joined, text).encode("utf-8")


def _plural(kind: str) -> str:
    """Kinds the operator writes all pluralize regularly (Deployment -> deployments)."""
    return kind.lower() + "s"


def _object_path(obj: Mapping[str, Any]) -> str:
    """The API path of a namespaced object: /api/v1/... for the core group, else /apis/..."""
    meta, api_version = obj["metadata"], str(obj["apiVersion"])
    root = "/api" if "/" not in api_version else "/apis"
    return (
        f"{root}/{api_version}/namespaces/{meta['namespace']}/{_plural(obj['kind'])}/{meta['name']}"
    )


class Kube:
    """Thin synchronous API wrapper; kopf runs our sync handlers in worker threads."""

    def __init__(self, api: Any) -> None:
        self.api = api
        # (group/version, plural) -> (expiry on the monotonic clock, served?)
        self._discovered: dict[tuple[str, str], tuple[float, bool]] = {}

    @classmethod
    def from_environment(cls) -> Kube:
        """In-cluster credentials when running in a pod, else $KUBECONFIG / ~/.kube
        (``load_credentials``)."""
        load_credentials()
        configuration = client.Configuration.get_default_copy()
        configuration.connection_pool_maxsize = CONNECTIONS
        api = client.ApiClient(configuration)
        # Also the field manager of status updates in managedFields.
        api.user_agent = "rooftop-operator"
        # The client imports each API class on first use; CoreV1Api's module takes over a
        # second of CPU, which would otherwise land in the first reconciles of a burst.
        _ = client.CoreV1Api, client.CustomObjectsApi
        return cls(api)

    def _core(self) -> Any:
        return client.CoreV1Api(self.api)

    def _custom(self) -> Any:
        return client.CustomObjectsApi(self.api)

    def _apps(self) -> Any:
        return client.AppsV1Api(self.api)

    def _plain(self, result: Any) -> Obj:
        """Typed client models (V1Service) -> the plain dicts everything else uses."""
        return dict(self.api.sanitize_for_serialization(result) or {})

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> Obj | None:
        """The object, or None when it does not exist."""
        try:
            with api_errors():
                if api_version == "v1":
                    return self._plain(self._read_core(kind, namespace, name))
                group, version = api_version.split("/")
                found = self._custom().get_namespaced_custom_object(
                    group, version, namespace, _plural(kind), name
                )
                return dict(found)
        except KubeError as err:
            if err.status == 404:
                return None
            raise

    def _read_core(self, kind: str, namespace: str, name: str) -> Any:
        if kind == "Service":
            return self._core().read_namespaced_service(name, namespace)
        if kind == "ConfigMap":
            return self._core().read_namespaced_config_map(name, namespace)
        raise ValueError(f"core kind {kind} is not used by the operator")

    def apply(self, obj: Mapping[str, Any]) -> None:
        """Server-side apply ``obj`` as field manager ``rooftop``, forcing conflicts:
        the operator is the source of truth for every field it sets. (No return value:
        the client deserializes 200 but not the 201 of a first apply.)"""
        with api_errors():
            self._patch_apply(_object_path(obj), apply_body(obj))

    def _patch_apply(self, path: str, body: bytes) -> None:
        """PATCH ``path`` with an apply body as bytes, through the client's own request
        plumbing (auth, TLS, proxies). The generated methods only take a dict, which the
        client encodes with the surrogate escapes the API server's YAML reader refuses."""
        method, url, headers, _, _ = self.api.param_serialize(
            "PATCH",
            path,
            query_params=[("fieldManager", FIELD_MANAGER), ("force", "true")],
            header_params={"Content-Type": APPLY_CONTENT_TYPE, "Accept": "application/json"},
            auth_settings=["BearerToken"],
        )
        response = self.api.call_api(method, url, header_params=headers, body=body)
        data = response.read()
        if not 200 <= response.status < 300:
            text = data.decode("utf-8", "replace") if data else None
            raise ApiException(http_resp=response, body=text, data=None)

    def has_api(self, group_version: str, plural: str) -> bool:
        """Whether the API server serves ``plural`` in ``group_version`` (discovery),
        e.g. ``has_api("monitoring.coreos.com/v1", "podmonitors")``. Remembered for
        ``DISCOVERY_TTL_S``: every reconcile asks, and a burst of 1,000 new targets
        would otherwise ask 1,000 times for an answer that changes only when someone
        installs or removes a CRD."""
        key = (group_version, plural)
        cached = self._discovered.get(key)
        if cached is not None and time.monotonic() < cached[0]:
            return cached[1]
        found = self._discover(group_version, plural)
        self._discovered[key] = (time.monotonic() + DISCOVERY_TTL_S, found)
        return found

    def _discover(self, group_version: str, plural: str) -> bool:
        group, version = group_version.split("/")
        try:
            with api_errors():
                found = self._custom().get_api_resources(group, version)
        except KubeError as err:
            if err.status in (403, 404, 503):
                return False
            raise
        return any(r.name == plural for r in found.resources or [])

    def list_nodes(self) -> list[Obj]:
        """Every Node, as plain dicts (for the GPU inventory; needs cluster RBAC)."""
        with api_errors():
            found = self._core().list_node()
        return [self._plain(node) for node in found.items or []]

    def list_unfinished_pods(self) -> list[Obj]:
        """Every pod of every namespace that has not finished, as plain dicts: what holds
        or waits for GPUs, for the GPU inventory (needs cluster RBAC)."""
        with api_errors():
            found = self._core().list_pod_for_all_namespaces(field_selector=UNFINISHED_PODS)
        return [self._plain(pod) for pod in found.items or []]

    def list_engine_deployments(self) -> list[Obj]:
        """Every namespace's Rooftop engine Deployments (those with the target label), as
        plain dicts: the fleet's own view of the GPUs it holds and asks for."""
        with api_errors():
            found = self._apps().list_deployment_for_all_namespaces(label_selector=TARGET_LABEL)
        return [self._plain(d) for d in found.items or []]

    def list_pool_deployments(self, namespace: str, target: str) -> list[Obj]:
        """A target's mixed-fleet pool Deployments (``builders.POOL_LABEL``), as plain dicts."""
        selector = f"{TARGET_LABEL}={target},{POOL_LABEL}"
        with api_errors():
            found = self._apps().list_namespaced_deployment(namespace, label_selector=selector)
        return [self._plain(d) for d in found.items or []]

    def delete_deployment(self, namespace: str, name: str) -> None:
        """Delete a Deployment (its pods go with it, each drained by its preStop hook);
        one already gone is no error."""
        with api_errors():
            try:
                self._apps().delete_namespaced_deployment(
                    name, namespace, propagation_policy="Background"
                )
            except ApiException as err:
                if err.status != 404:
                    raise

    def list_pods(self, namespace: str, labels: Mapping[str, str]) -> list[Obj]:
        """Pods in ``namespace`` carrying all of ``labels``, as plain dicts."""
        selector = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
        with api_errors():
            found = self._core().list_namespaced_pod(namespace, label_selector=selector)
        return [self._plain(pod) for pod in found.items or []]

    def get_target(self, namespace: str, name: str) -> Obj | None:
        return self.get(API_VERSION, KIND, namespace, name)

    def update_status(
        self,
        namespace: str,
        name: str,
        mutate: StatusMutation,
        uid: str | None = None,
        seen: Mapping[str, Any] | None = None,
    ) -> Obj | None:
        """Read the target, let ``mutate`` compute the new ``status`` from the current
        one, and write it back only if it changed. A concurrent writer makes the write
        fail with 409 (resourceVersion precondition); then read again and retry.

        ``seen``: the target as the caller's watch event carried it; the first try
        writes against it instead of reading (a GET less per write: under a burst of new
        targets the API server's CPU is the bottleneck), and a newer version on the
        server makes that write a 409 like any concurrent change.

        Returns the written status, or None when unchanged or the target is gone (or,
        with ``uid``, replaced by another of the same name).
        """
        for attempt in range(STATUS_RETRIES):
            target = dict(seen) if seen and attempt == 0 else self.get_target(namespace, name)
            if target is None or uid not in (None, target["metadata"].get("uid")):
                return None
            current = target.get("status") or {}
            new = mutate(copy.deepcopy(current))
            if new == current:
                return None
            body = {**target, "status": new}
            try:
                with api_errors():
                    self._custom().replace_namespaced_custom_object_status(
                        *TARGET_GVP[:2], namespace, TARGET_GVP[2], name, body
                    )
            except KubeError as err:
                if err.status == 409:
                    log.debug("status of %s/%s changed under us; retrying", namespace, name)
                    continue
                raise
            return new
        raise KubeError(409, f"status of {namespace}/{name} kept changing; gave up")
