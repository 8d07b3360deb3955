"""Command line (``nikki`` or ``python -m nikki``):

- ``nikki run file.py [args...]`` runs an NKI script on nikki (``import nki`` / ``neuronxcc.nki``
  resolve to nikki);
- ``nikki pytest [pytest args...]`` runs an NKI test suite with pytest, its NKI imports resolved to
  nikki the same way;
- ``nikki profile [--out DIR] [--top N] [--explain] file.py [args...]`` runs it the same way and
  prints the estimated profile of every kernel it launched (``--explain``: what limits it),
  writing a Perfetto trace per kernel;
- ``nikki disasm file`` prints a device program file (``Program.serialize()``, ``nki.profile``'s
  NEFF-named output) as a kernel author reads it;
- ``nikki kernels [--markdown]`` lists the library kernels (``--markdown``: the table of
  docs/kernels.md, generated from the registry);
- ``nikki bench [--kernel NAME] [--quick] [--json FILE] ...`` benchmarks the library kernels over
  a size sweep (bench/python/kernel_bench.py of a source checkout; ``make bench``).
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys

from . import _core, compat
from . import kernel as kernel_module
from .errors import KernelError
from .library import kernels_table, library_kernels
from .profiling import Profile


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["pytest"]:  # every later argument is pytest's, options included
        return _pytest(argv[1:])
    if argv[:1] == ["bench"]:  # the benchmark script parses its own options
        return _bench(argv[1:])
    parser = argparse.ArgumentParser(prog="nikki", description="nikki: NKI kernels on a simulated NeuronCore")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a Python file whose `import nki` / `neuronxcc.nki` imports resolve to nikki")
    run.add_argument("file")
    run.add_argument("args", nargs=argparse.REMAINDER)
    test = sub.add_parser("pytest", help="run an NKI test suite with pytest, its `import nki` / `neuronxcc.nki` "
                                         "imports resolved to nikki (arguments go to pytest)")
    test.add_argument("args", nargs=argparse.REMAINDER)
    prof = sub.add_parser("profile", help="run a Python file and print the estimated profile of each kernel it "
                                          "launches (Perfetto traces in --out)")
    prof.add_argument("--out", default="nikki-profile", help="directory for traces (default: ./nikki-profile)")
    prof.add_argument("--top", type=int, default=8, help="longest instructions listed per kernel")
    prof.add_argument("--explain", action="store_true",
                      help="also explain what limits each kernel: roofline, idle time by cause, critical path, "
                           "the changes that would help most")
    prof.add_argument("file")
    prof.add_argument("args", nargs=argparse.REMAINDER)
    dis = sub.add_parser("disasm", help="print a device program file")
    dis.add_argument("file")
    kern = sub.add_parser("kernels", help="list the library kernels")
    kern.add_argument("--markdown", action="store_true", help="print the table of docs/kernels.md")
    sub.add_parser("bench", help="benchmark the library kernels over a size sweep (`nikki bench --help`)")
    ns = parser.parse_args(argv)

    if ns.command == "run":
        _run_script(ns.file, ns.args)
    elif ns.command == "pytest":
        return _pytest(ns.args)
    elif ns.command == "profile":
        return _profile_script(ns.file, ns.args, ns.out, ns.top, ns.explain)
    elif ns.command == "disasm":
        return _disassemble(ns.file)
    elif ns.command == "kernels":
        _list_kernels(ns.markdown)
    return 0


def _pytest(args) -> int:
    import pytest

    compat.install()
    compat.present_simulated_instance()
    return int(pytest.main(list(args)))


def _bench(args) -> int:
    """Runs bench/python/kernel_bench.py of the source checkout this package is in."""
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "bench", "python",
                          "kernel_bench.py")
    if not os.path.exists(script):
        print("nikki bench: the kernel benchmarks live in nikki's source tree (bench/python/kernel_bench.py), "
              "which is not beside this installed package; run it from a checkout", file=sys.stderr)
        return 2
    module = runpy.run_path(os.path.normpath(script), run_name="nikki_kernel_bench")
    return int(module["main"](list(args), prog="nikki bench"))


def _list_kernels(markdown: bool) -> None:
    if markdown:
        sys.stdout.write(kernels_table())
        return
    for name, kernel in sorted(library_kernels().items()):
        print(f"{name:24} {kernel.info['summary']}")


def _run_script(path: str, args) -> None:
    compat.install()
    compat.present_simulated_instance()
    sys.argv = [path, *args]
    # As `python file.py` does: the script's directory comes first on sys.path, so the script
    # can import the modules next to it (NKI samples import their kernels that way).
    script_dir = os.path.dirname(os.path.abspath(path))
    if sys.path and sys.path[0] in ("", os.getcwd()):
        sys.path[0] = script_dir
    else:
        sys.path.insert(0, script_dir)
    runpy.run_path(path, run_name="__main__")


def _profile_script(path: str, args, out_dir: str, top: int, explain: bool = False) -> int:
    launched: dict = {}  # id(compiled) -> (kernel, compiled, launches)

    def observe(k, compiled):
        entry = launched.get(id(compiled))
        launched[id(compiled)] = (k, compiled, (entry[2] if entry else 0) + 1)

    kernel_module.launch_observers.append(observe)
    try:
        _run_script(path, args)
    finally:
        kernel_module.launch_observers.remove(observe)
    if not launched:
        print(f"nikki profile: {path} launched no kernel", file=sys.stderr)
        return 1
    os.makedirs(out_dir, exist_ok=True)
    print(f"\nnikki profile: {len(launched)} kernel specialization(s) launched by {path}. All times are ESTIMATES "
          "of nikki's timing model, not measurements.")
    for n, (k, compiled, launches) in enumerate(launched.values()):
        prof = Profile.of(k.fn.__name__, compiled)
        trace = prof.save_trace(os.path.join(out_dir, f"{n:02d}_{k.fn.__name__}.json"))
        print(f"\n== {k.fn.__name__} (launched {launches}x) ==")
        print(prof.summary(top))
        if explain:
            print(prof.explain())
        print(f"trace: {trace} (open in https://ui.perfetto.dev or chrome://tracing)")
    return 0


def _disassemble(path: str) -> int:
    with open(path, "rb") as f:
        data = f.read()
    try:
        program = _core.load_program(data)
    except KernelError as err:
        print(f"nikki disasm: {path}: {err.summary}", file=sys.stderr)
        return 1
    sys.stdout.write(program.disassemble())
    return 0


if __name__ == "__main__":
    sys.exit(main())
