"""``python -m rooftop_sim.engine``: the same server as ``rooftop engine-sim``."""

from __future__ import annotations

import argparse
import sys

from rooftop_sim.engine.server import add_arguments, run


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m rooftop_sim.engine")
    add_arguments(parser)
    return run(parser.parse_args())


if __name__ == "__main__":
    sys.exit(main())
