"""``rooftop operator`` / ``python -m rooftop_operator``: run the kopf operator.

Why not plain ``kopf run``: the operator's options (watched namespaces, peering, the
engine images, metrics port) become one ``OperatorConfig`` handed to the handlers through
kopf's memo, instead of each handler reading the environment.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from rooftop_api import exit_codes
from rooftop_operator.settings import (
    MIN_PEERING_LIFETIME_S,
    PEERING_LIFETIME_S,
    OperatorConfig,
    add_setting_flags,
    configured,
    read_settings,
    seniority_priority,
    setting_flags,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-n",
        "--namespace",
        action="append",
        default=[],
        dest="namespaces",
        help="namespace to watch (repeatable); without it, --all-namespaces is required",
    )
    parser.add_argument("-A", "--all-namespaces", action="store_true", help="watch every namespace")
    parser.add_argument(
        "--peering",
        default=None,
        help="kopf peering name for several replicas (default: standalone)",
    )
    parser.add_argument(
        "--priority",
        type=int,
        default=None,
        help="with --peering: the highest-priority replica is active (default: minus the "
        "start time, so the longest-running replica is)",
    )
    parser.add_argument(
        "--peering-lifetime",
        type=peering_lifetime,
        default=PEERING_LIFETIME_S,
        metavar="SECONDS",
        help="with --peering: a replica silent this long counts as gone and a standby takes over",
    )
    parser.add_argument("--liveness", default=None, help="e.g. http://0.0.0.0:8080/healthz")
    parser.add_argument(
        "--metrics-port", type=int, default=None, help="serve Prometheus metrics here"
    )
    add_setting_flags(parser)  # the images and --gpu-inventory, as declared in SETTINGS
    parser.add_argument("-v", "--verbose", action="store_true", help="log handler details")
    parser.add_argument("--debug", action="store_true", help="log kopf internals")


def peering_lifetime(text: str) -> int:
    """--peering-lifetime: whole seconds; kopf renews its record 5-10 s before it
    expires, so a shorter lifetime would let a live replica look gone."""
    try:
        seconds = int(text)
    except ValueError:
        seconds = -1
    if seconds < MIN_PEERING_LIFETIME_S:
        raise argparse.ArgumentTypeError(
            f"{text!r}: give whole seconds >= {MIN_PEERING_LIFETIME_S}"
        )
    return seconds


def config_from_args(args: argparse.Namespace) -> OperatorConfig:
    """Command-line flags over ROOFTOP_* environment variables over defaults."""
    return configured(
        read_settings(flags=setting_flags(args)),
        namespaces=tuple(args.namespaces),
        clusterwide=bool(args.all_namespaces),
        peering=args.peering,
        peering_priority=seniority_priority() if args.priority is None else args.priority,
        peering_lifetime_s=args.peering_lifetime,
        liveness_endpoint=args.liveness,
        metrics_port=args.metrics_port,
    )


def run(args: argparse.Namespace) -> int:
    """Run the operator until SIGINT/SIGTERM."""
    if not args.namespaces and not args.all_namespaces:
        print(
            "rooftop operator: give --namespace NS (repeatable) or --all-namespaces",
            file=sys.stderr,
        )
        return exit_codes.BAD_INPUT
    import kopf

    try:
        config = config_from_args(args)  # the one read of flags and ROOFTOP_* variables
    except ValueError as err:
        print(f"rooftop operator: {err}", file=sys.stderr)
        return exit_codes.BAD_INPUT
    if (code := preflight()) != 0:
        return code
    load_handlers(config)
    # log_prefix: every per-object line starts with [namespace/name].
    kopf.configure(debug=args.debug, verbose=args.verbose or args.debug, log_prefix=True)
    kopf.run(
        clusterwide=config.clusterwide,
        namespaces=() if config.clusterwide else config.namespaces,
        standalone=config.peering is None,
        peering_name=config.peering,
        liveness_endpoint=config.liveness_endpoint,
        memo=kopf.Memo(config=config),
    )
    return exit_codes.OK


def preflight() -> int:
    """0 when there is a cluster to talk to (``kube.check_cluster``), else its exit code
    after one line on stderr: kopf would log a traceback and retry every minute."""
    from rooftop_operator.kube import ClusterUnavailable, check_cluster

    try:
        check_cluster()
    except ClusterUnavailable as err:
        print(f"rooftop operator: {err}", file=sys.stderr)
        return err.exit_code
    return exit_codes.OK


def load_handlers(config: OperatorConfig, registry: Any = None) -> None:
    """Register every handler with kopf (``wiring``), with ``config``'s periods."""
    from rooftop_operator import wiring

    wiring.register_handlers(config, registry)


EPILOG = """\
credentials: in a pod, its ServiceAccount; elsewhere the kubeconfig ($KUBECONFIG, else
~/.kube/config). Before starting, the operator loads them and asks the API server its
version (5 s timeout).

exit codes:
  0  stopped by SIGINT/SIGTERM
  1  the API server cannot be reached (or answers with a server error)
  2  bad flags or ROOFTOP_* settings, or no usable Kubernetes configuration
     (none found, unreadable, or credentials refused with HTTP 401)
"""


def register(subparsers: Any) -> None:
    """Add ``rooftop operator`` (see rooftop_cli.main)."""
    parser = subparsers.add_parser(
        "operator",
        help="run the Kubernetes operator",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    parser.set_defaults(func=run)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m rooftop_operator",
        description=__doc__,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
