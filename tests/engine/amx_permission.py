"""Ask Linux for permission to use Intel AMX tiles, at every start of the vLLM venv's Python.

Why: vLLM's CPU attention picks its AMX kernel for bf16 on a CPU with AMX
(``vllm/v1/attention/backends/cpu_attn.py``, ``_get_attn_isa``) but never asks the
kernel for the tile state that AMX needs (``arch_prctl(ARCH_REQ_XCOMP_PERM,
XFEATURE_XTILEDATA)``). Until some library in the process has asked, the first AMX
instruction raises SIGILL and the worker dies. Whether one has asked depends on the
traffic: oneDNN asks when it first runs a matrix product large enough for its own
AMX kernel, which a long prompt does and a two-token prompt does not. So a fresh
engine whose first request is short dies on it ("Worker proc VllmWorker-0 died
unexpectedly (exit code: -4)"), and one whose first request is long serves on.

install-vllm.sh puts this module and a ``.pth`` line that imports it into the venv's
site-packages, so every process (the API server, the engine core, and workers however
they are started) holds the permission before any kernel runs. The engine image reuses
those site-packages, so its pods do too. Asking is harmless where AMX is absent (the
call fails with EINVAL) and is only made on x86-64, where syscall 158 is arch_prctl.
"""

from __future__ import annotations

import ctypes
import os

SYS_ARCH_PRCTL = 158  # x86-64 syscall number
ARCH_REQ_XCOMP_PERM = 0x1023
XFEATURE_XTILEDATA = 18


def request() -> bool:
    """True when the kernel granted the tile data permission to this process."""
    if os.uname().machine != "x86_64":
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return False
    return int(libc.syscall(SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)) == 0


request()
