"""`python -m tests.cluster up|down|status|kubeconfig` (what `make cluster-up/-down` run).

`up` leaves the control plane running in the background and records it in
$ROOFTOP_CACHE/cluster/state.json; `down` stops it from any later process.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tests.cluster.controlplane import (
    ControlPlane,
    StartupError,
    default_bin_dir,
    default_state_dir,
    log,
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.cluster")
    parser.add_argument("command", choices=["up", "down", "status", "kubeconfig"])
    parser.add_argument("--state-dir", type=Path, default=default_state_dir())
    parser.add_argument("--bin-dir", type=Path, default=default_bin_dir())
    args = parser.parse_args(argv)
    handlers = {"up": up, "down": down, "status": status, "kubeconfig": kubeconfig}
    return handlers[args.command](args.state_dir, args.bin_dir)


def up(state_dir: Path, bin_dir: Path) -> int:
    existing = ControlPlane.load_state(state_dir)
    if existing is not None and all(existing.running().values()):
        log(f"already running; KUBECONFIG={existing.kubeconfig}")
        print(existing.kubeconfig)
        return 0
    if existing is not None:
        log("stale state from a previous cluster: stopping its leftovers")
        existing.stop()
    cp = ControlPlane(state_dir=state_dir, bin_dir=bin_dir)
    try:
        cp.start()
    except StartupError as e:
        log(str(e))
        return 1
    cp.save_state()
    timings = ", ".join(f"{k} {v:.1f}s" for k, v in cp.timings.items())
    log(f"up in {cp.timings['total']:.1f}s ({timings})")
    log(f"export KUBECONFIG={cp.kubeconfig}   # stop with: make cluster-down")
    print(cp.kubeconfig)
    return 0


def down(state_dir: Path, bin_dir: Path) -> int:
    cp = ControlPlane.load_state(state_dir)
    if cp is None:
        log("no cluster recorded; nothing to stop")
        return 0
    cp.stop()
    cp.state_file.unlink(missing_ok=True)
    log("stopped")
    return 0


def status(state_dir: Path, bin_dir: Path) -> int:
    cp = ControlPlane.load_state(state_dir)
    if cp is None:
        log("not running")
        return 1
    running = cp.running()
    for name, alive in running.items():
        print(f"{name:26} {'running' if alive else 'DEAD'} (pid {cp.pids[name]})")
    print(f"kubeconfig                 {cp.kubeconfig}")
    print(f"server                     {cp.server}")
    return 0 if all(running.values()) else 1


def kubeconfig(state_dir: Path, bin_dir: Path) -> int:
    """Print the kubeconfig path, e.g. ROOFTOP_KUBECONFIG=$(python -m tests.cluster kubeconfig)."""
    cp = ControlPlane.load_state(state_dir)
    if cp is None or not all(cp.running().values()):
        log("not running: make cluster-up")
        return 1
    print(cp.kubeconfig)
    return 0


if __name__ == "__main__":
    sys.exit(main())
