"""Security settings of the engine pods, per Kubernetes Pod Security level.

Pure functions, like ``builders``: the builder asks this module for the pod and
container ``securityContext``, and for the extra volumes and environment a non-root
vLLM needs, and this module knows nothing else about the pod.

Two levels, chosen once for the whole operator (``ROOFTOP_ENGINE_POD_SECURITY``, chart
value ``engine.podSecurity``):

- ``baseline`` (default) passes Pod Security "baseline". The engine keeps running as
  its image's user, because the public vLLM image (vllm/vllm-openai) runs as root and
  writes its caches under /root (~/.cache/vllm, ~/.triton, ~/.config): ``runAsNonRoot``
  would refuse that image outright, and dropping ALL capabilities would take from its
  root processes the DAC_OVERRIDE/CHOWN/FOWNER they use on files another uid owns (a
  model cache PVC filled by a download job, say). What costs vLLM nothing is still
  added: the runtime's default seccomp profile and no privilege escalation (setuid).
- ``restricted`` passes Pod Security "restricted": a fixed non-root uid/gid, no
  capabilities, a read-only root filesystem, and writable emptyDirs for $HOME, the
  caches vLLM, Triton and torch inductor write, and /tmp, with the environment pointing
  each cache there.

Both levels mount the model cache at ``MODEL_CACHE_PATH`` and set ``HF_HOME`` to it: a
path under /root would be unreadable to any uid but root, and a user's PVC cache then
works unchanged at either level.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Final

MODEL_CACHE_PATH: Final = "/var/cache/rooftop/huggingface"
# Non-root uid/gid for vLLM under "restricted". Any uid works: nothing in the image
# needs to be owned by it, since everything vLLM writes is on the volumes below.
ENGINE_UID: Final = 1000
HOME_PATH: Final = "/home/rooftop"
TMP_PATH: Final = "/tmp"
ENV_VAR: Final = "ROOFTOP_ENGINE_POD_SECURITY"


class PodSecurity(StrEnum):
    """Pod Security Standards level the engine pods are built to pass."""

    BASELINE = "baseline"
    RESTRICTED = "restricted"


def parse_pod_security(text: str) -> PodSecurity:
    """``baseline`` or ``restricted`` (any case); ValueError naming the variable."""
    try:
        return PodSecurity(text.strip().lower())
    except ValueError:
        raise ValueError(
            f"{ENV_VAR}={text!r}: use baseline or restricted "
            "(the Pod Security level the engine pods must pass)"
        ) from None


def _runtime_default() -> dict[str, str]:
    return {"type": "RuntimeDefault"}


def pod_security_context(level: PodSecurity, vllm: bool) -> dict[str, Any]:
    """The pod's ``securityContext``. Under "restricted" a simulated engine sets no uid:
    it runs the operator's image, whose user is already non-root (10001)."""
    context: dict[str, Any] = {"seccompProfile": _runtime_default()}
    if level is PodSecurity.BASELINE:
        return context
    context["runAsNonRoot"] = True
    if vllm:
        context |= {
            "runAsUser": ENGINE_UID,
            "runAsGroup": ENGINE_UID,
            "fsGroup": ENGINE_UID,
            # chown a model cache PVC only when its root is not ours yet: a
            # recursive chown of hundreds of GB on every start would delay it.
            "fsGroupChangePolicy": "OnRootMismatch",
        }
    return context


def container_security_context(level: PodSecurity) -> dict[str, Any]:
    """The engine container's ``securityContext``. Under "restricted" the root
    filesystem is read-only too: everything an engine writes goes to the volumes of
    ``writable_volumes`` and the model cache."""
    context: dict[str, Any] = {"allowPrivilegeEscalation": False}
    if level is PodSecurity.RESTRICTED:
        context |= {"capabilities": {"drop": ["ALL"]}, "readOnlyRootFilesystem": True}
    return context


def writable_volumes(level: PodSecurity) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(volumes, mounts) a non-root vLLM writes to; none under "baseline", where root
    writes to the image's own /root and /tmp."""
    if level is PodSecurity.BASELINE:
        return [], []
    paths = {"engine-home": HOME_PATH, "tmp": TMP_PATH}
    volumes = [{"name": name, "emptyDir": {}} for name in paths]
    mounts = [{"name": name, "mountPath": path} for name, path in paths.items()]
    return volumes, mounts


def vllm_env(level: PodSecurity) -> list[dict[str, str]]:
    """Environment for a vLLM container: HF_HOME on the model cache always; under
    "restricted" also a writable $HOME and every cache directory vLLM and its
    libraries would otherwise put under the (unwritable) image's home. Set explicitly,
    not only through HOME, so an image that sets one of them does not win."""
    env = {"HF_HOME": MODEL_CACHE_PATH}
    if level is PodSecurity.RESTRICTED:
        env |= {
            "HOME": HOME_PATH,
            "XDG_CACHE_HOME": f"{HOME_PATH}/.cache",
            "XDG_CONFIG_HOME": f"{HOME_PATH}/.config",
            "VLLM_CACHE_ROOT": f"{HOME_PATH}/.cache/vllm",
            "TRITON_CACHE_DIR": f"{HOME_PATH}/.triton/cache",
            # torch's default, /tmp/torchinductor_$USER, asks getpass for the user
            # name, which fails for a uid the image's /etc/passwd does not know.
            "TORCHINDUCTOR_CACHE_DIR": f"{TMP_PATH}/torchinductor",
        }
    return [{"name": name, "value": value} for name, value in env.items()]
