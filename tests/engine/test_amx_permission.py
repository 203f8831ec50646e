"""Every process of the vLLM venv starts with AMX tile permission (tests/engine/amx_permission.py).

Without it, a fresh engine's worker dies with SIGILL on its first request when that
request is short (vLLM's CPU attention uses AMX; nothing has asked Linux for it yet).
The end-to-end case is tests/e2e/test_real_node_operator.py, whose restricted engine
serves a two-token prompt first; this is the quick check of the mechanism.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm

XFEATURE_XTILEDATA_BIT = 1 << 18
# Prints the process's permitted extended-state features (ARCH_GET_XCOMP_PERM), before
# the script itself could have asked for any.
PERMITTED = """
import ctypes
libc = ctypes.CDLL(None)
bits = ctypes.c_ulong(0)
assert libc.syscall(158, 0x1022, ctypes.byref(bits)) == 0
print(bits.value)
"""


def _cpu_has_amx() -> bool:
    cpuinfo = Path("/proc/cpuinfo")
    return cpuinfo.exists() and "amx_tile" in cpuinfo.read_text().split()


@pytest.mark.skipif(not _cpu_has_amx(), reason="this CPU has no AMX: nothing to ask for")
def test_the_vllm_venv_holds_amx_permission_from_the_start(vllm_python: str) -> None:
    """Any new interpreter of the venv (vLLM spawns its engine core and workers as
    such, or forks them, which keeps the permission)."""
    done = subprocess.run([vllm_python, "-c", PERMITTED], capture_output=True, text=True,
                          timeout=60, check=True)  # fmt: skip
    assert int(done.stdout.split()[-1]) & XFEATURE_XTILEDATA_BIT
