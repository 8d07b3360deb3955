"""Command line: ``python -m nikki run file.py [args...]`` runs an NKI script on nikki."""

from __future__ import annotations

import argparse
import os
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
        # As `python file.py` does: the script's directory comes first on sys.path, so the script
        # can import the modules next to it (NKI samples import their kernels that way).
        script_dir = os.path.dirname(os.path.abspath(ns.file))
        if sys.path and sys.path[0] in ("", os.getcwd()):
            sys.path[0] = script_dir
        else:
            sys.path.insert(0, script_dir)
        runpy.run_path(ns.file, run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
