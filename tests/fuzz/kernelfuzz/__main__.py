"""Command line of nikki's kernel fuzzer.

    python3 -m kernelfuzz --cases 1000 --seed 0 [--front python|cpp|both] [--jobs 2]
    python3 -m kernelfuzz --show 1234          # print the kernel of seed 1234
    python3 -m kernelfuzz --check repro.py     # judge a (reduced) reproducer file

Run with PYTHONPATH=bindings/python:tests/fuzz from the repository root (the Makefile's
``fuzz`` target does). NIKKI_FUZZ_CASES and NIKKI_FUZZ_SEED give the defaults of --cases and --seed.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from . import harness


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="kernelfuzz", description=__doc__.split("\n")[0])
    parser.add_argument("--cases", type=int, default=int(os.environ.get("NIKKI_FUZZ_CASES", "200")))
    parser.add_argument("--seed", type=int, default=int(os.environ.get("NIKKI_FUZZ_SEED", "0")))
    parser.add_argument("--front", choices=["python", "cpp", "both"], default="both")
    parser.add_argument("--jobs", type=int, default=harness.default_jobs())
    parser.add_argument("--timeout", type=float, default=harness.DEFAULT_TIMEOUT)
    parser.add_argument("--out", type=Path, default=None, help="directory for reproducers of failures")
    parser.add_argument("--no-reduce", action="store_true", help="report failing kernels without reducing them")
    parser.add_argument("--show", type=int, metavar="SEED", help="print the Python kernel of SEED and exit")
    parser.add_argument("--check", type=Path, metavar="FILE", help="judge one kernel module and exit")
    args = parser.parse_args(argv)

    if args.show is not None:
        from . import worker

        case = worker.generate(args.show)
        print(case.source)
        if case.error:
            print(f"# expected: KernelError /{case.error.pattern}/ at lines {list(case.error.lines)} "
                  f"({case.error.what})")
        return 0
    if args.check is not None:
        from . import oracle

        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, args.check.name)
            outcome = oracle.run_source(args.check.read_text(), path, None, 0)
        print("ok" if outcome.ok else f"FAIL {outcome.kind}: {outcome.detail}")
        return 0 if outcome.ok else 1

    seeds = range(args.seed, args.seed + args.cases)
    progress = 1000 if args.cases >= 5000 else 0
    failed = 0
    if args.front in ("python", "both"):
        report = harness.PythonCampaign(args.jobs, args.timeout, args.out, not args.no_reduce,
                                        progress_every=progress).run(seeds)
        print(report.summary(), flush=True)
        failed += len(report.failures)
    if args.front in ("cpp", "both"):
        driver = harness.cpp_driver()
        if driver is None:
            print("nikki fuzz [cpp]: the nikki_fuzz program is not built (make build)", file=sys.stderr)
            return 2
        report = harness.CppCampaign(driver, args.timeout, args.out, progress_every=progress,
                                     jobs=args.jobs).run(seeds)
        print(report.summary(), flush=True)
        failed += len(report.failures)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
