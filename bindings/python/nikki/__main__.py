"""Command line: ``python -m nikki run file.py [args...]`` runs an NKI script on nikki."""

from __future__ import annotations

import argparse
import runpy
import sys


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nikki", description="nikki: NKI kernels on a simulated NeuronCore")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a Python file whose `import nki` / `neuronxcc.nki` imports resolve to nikki")
    run.add_argument("file")
    run.add_argument("args", nargs=argparse.REMAINDER)
    ns = parser.parse_args(argv)

    if ns.command == "run":
        from . import compat

        compat.install()
        sys.argv = [ns.file, *ns.args]
        runpy.run_path(ns.file, run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
