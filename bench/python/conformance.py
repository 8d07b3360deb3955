#!/usr/bin/env python3
"""Runs public NKI code, unmodified, on nikki and reports what runs.

    # the latest table in docs/conformance.md comes from (checkouts of the public repositories):
    PYTHONPATH=bindings/python python bench/python/conformance.py \\
        --samples ~/src/nki-samples --samples-unit ~/src/nki-samples-8370e11 \\
        --library ~/src/nki-library --out docs/conformance.md
    # smoke run on a small tree (tests/python/test_bench_scripts.py writes one):
    PYTHONPATH=bindings/python python bench/python/conformance.py --quick --samples FIXTURE

Not a test: it prints (and with --out writes) a markdown report. Three parts, each optional:

* ``--samples DIR`` (aws-neuron/nki-samples): every tutorial and contributed script that runs
  itself (``if __name__ == "__main__"``) runs as ``python -m nikki run FILE`` in its folder, and
  every pytest file there as ``python -m nikki pytest FILE``. A script passes when it exits 0 and
  prints no failed comparison ("... False", "do not match"). Modules of kernels without a
  ``__main__`` are run by their drivers and are listed, not counted. Drivers that need a framework
  nikki does not replace (JAX, torch-neuronx) are listed as such.
* ``--samples-unit DIR`` (nki-samples at commit 8370e11, the last with its unit suite and
  ``src/nki_samples/reference``): ``python -m nikki pytest test/unit/FILE --simulation-only`` with
  ``PYTHONPATH=src``, one subprocess per file, per test (pytest's junit report).
* ``--library DIR`` (aws-neuron/nki-library): each kernel of LIBRARY_CASES below, called once at a
  small shape through ``nki.simulate``, compared with the library's own torch reference on the
  same inputs (``np.allclose`` with the case's tolerances). Cases run in subprocesses, one each.

Each subprocess has --timeout seconds. ``--quick`` lowers the timeout and runs only what a small
fixture tree holds (it is what the test runs).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
PYTHON_PACKAGE = os.path.join(ROOT, "bindings", "python")

# Printed by the samples when their comparison with a reference fails.
_FAILED_COMPARISON = re.compile(r"(?:\bFalse\s*$|do not match|does not match|mismatch)", re.IGNORECASE | re.MULTILINE)
# Imports that make a script a driver of a framework nikki does not stand in for.
_FRAMEWORKS = {"jax": "JAX", "torch_neuronx": "torch-neuronx", "torch_xla": "torch-xla (XLA devices)",
               "neuronxcc.nki.kernels": "neuronx-cc's kernels"}


def _parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--samples", help="checkout of nki-samples (tutorials and contributed kernels)")
    p.add_argument("--samples-unit", help="checkout of nki-samples at 8370e11 (its unit suite)")
    p.add_argument("--library", help="checkout of nki-library")
    p.add_argument("--out", help="write the report to this markdown file")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per subprocess (default 1800)")
    p.add_argument("--quick", action="store_true", help="short timeout, for a small fixture tree")
    p.add_argument("--cases", nargs="*", help="library cases to run (default: all)")
    return p.parse_args(argv)


def _env(extra_path=()) -> dict:
    env = dict(os.environ)
    paths = [PYTHON_PACKAGE, *extra_path, env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def _run(cmd, cwd, timeout, extra_path=()) -> tuple:
    """(returncode or "timeout", stdout + stderr, seconds) of a subprocess."""
    start = time.monotonic()
    try:
        done = subprocess.run(cmd, cwd=cwd, env=_env(extra_path), capture_output=True, text=True, timeout=timeout)
        return done.returncode, done.stdout + done.stderr, time.monotonic() - start
    except subprocess.TimeoutExpired as err:
        out = (err.stdout or b"") + (err.stderr or b"")
        return "timeout", out.decode(errors="replace") if isinstance(out, bytes) else out, time.monotonic() - start


def _reason(output: str) -> str:
    """The line that says why a run failed: the last exception line, else the last line."""
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    for line in reversed(lines):
        if re.match(r"^(E\s+)?[A-Za-z_.]*(Error|Exception|NotImplementedError|KernelError)\b", line):
            return _short(line)
    return _short(lines[-1]) if lines else ""


def _short(text: str, limit: int = 160) -> str:
    text = text.replace("|", "/").replace("\n", " ")
    return text if len(text) <= limit else text[:limit - 3] + "..."


# --- nki-samples: tutorials and contributed kernels --------------------------------------------

def _imports(path: str) -> set:
    try:
        tree = ast.parse(open(path, encoding="utf-8").read())
    except (OSError, SyntaxError):
        return set()
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def _framework(imports: set) -> str:
    for module, name in _FRAMEWORKS.items():
        if any(i == module or i.startswith(module + ".") for i in imports):
            return name
    return ""


def sample_files(root: str) -> list:
    """The tutorial and contributed .py files of an nki-samples checkout, sorted."""
    found = []
    for top in ("src/nki_samples/tutorials", "contributed"):
        base = os.path.join(root, top)
        for folder, _dirs, files in os.walk(base):
            found += [os.path.join(folder, f) for f in files if f.endswith(".py") and f != "__init__.py"]
    return sorted(found)


def run_samples(root: str, timeout: float) -> list:
    """[{file, kind, status, seconds, reason}] for the tutorials and contributed kernels."""
    rows = []
    for path in sample_files(root):
        rel = os.path.relpath(path, root)
        text = open(path, encoding="utf-8").read()
        imports = _imports(path)
        framework = _framework(imports)
        is_test = os.path.basename(path).startswith("test_")
        if framework:
            rows.append(dict(file=rel, kind="driver", status="excluded", seconds=0.0,
                             reason=f"needs {framework}, which nikki does not stand in for"))
            continue
        if not is_test and "__main__" not in text:
            rows.append(dict(file=rel, kind="kernels", status="module", seconds=0.0,
                             reason="kernels only (no __main__): run by the scripts and tests that import them"))
            continue
        cmd = [sys.executable, "-m", "nikki", "pytest" if is_test else "run", os.path.basename(path)]
        if is_test:
            cmd += ["-q", "-p", "no:cacheprovider"]
        rc, out, seconds = _run(cmd, os.path.dirname(path), timeout)
        if rc == "timeout":
            status, reason = "timeout", f"still running after {timeout:.0f} s"
        elif rc != 0:
            status, reason = "fail", _reason(out)
        elif _FAILED_COMPARISON.search(out):
            status, reason = "fail", _short(_FAILED_COMPARISON.search(out).string.splitlines()[-1])
        else:
            status, reason = "pass", ""
        rows.append(dict(file=rel, kind="test" if is_test else "script", status=status, seconds=seconds, reason=reason))
    return rows


# --- nki-samples unit suite ----------------------------------------------------------------------

def run_unit_suite(root: str, timeout: float) -> list:
    """[{test, status, seconds, reason}] of ``nikki pytest FILE --simulation-only`` for each file of
    test/unit, one subprocess per file (a file that crashes or runs out of time is one row)."""
    rows = []
    folder = os.path.join(root, "test", "unit")
    for name in sorted(f for f in os.listdir(folder) if f.startswith("test_") and f.endswith(".py")):
        with tempfile.TemporaryDirectory() as tmp:
            report = os.path.join(tmp, "junit.xml")
            cmd = [sys.executable, "-m", "nikki", "pytest", os.path.join("test", "unit", name), "--simulation-only",
                   "-q", "-p", "no:cacheprovider", f"--junitxml={report}"]
            rc, out, seconds = _run(cmd, root, timeout, extra_path=[os.path.join(root, "src")])
            if os.path.exists(report):
                rows += junit_rows(report)
            else:
                rows.append(dict(test=f"test/unit/{name}", status="timeout" if rc == "timeout" else "fail",
                                 seconds=seconds, reason=_reason(out)))
    return rows


def junit_rows(report: str) -> list:
    """[{test, status, seconds, reason}] of a pytest junit XML report."""
    rows = []
    for case in ElementTree.parse(report).getroot().iter("testcase"):
        name = f"{case.get('classname', '').replace('.', '/')}::{case.get('name')}"
        status, reason = "pass", ""
        for child in case:
            if child.tag in ("failure", "error"):
                status, reason = "fail", _short((child.get("message") or child.text or "").splitlines()[0]
                                                if (child.get("message") or child.text) else child.tag)
            elif child.tag == "skipped":
                status, reason = "skipped", _short(child.get("message") or "")
        rows.append(dict(test=name, status=status, seconds=float(case.get("time", 0.0)), reason=reason))
    return rows


# --- nki-library kernels against their torch references ----------------------------------------

def _to_torch(value):
    """A torch tensor of a numpy array (bfloat16 / fp8 through their bit patterns), else value."""
    import numpy as np
    import torch

    if not isinstance(value, np.ndarray):
        return value
    name = value.dtype.name
    if name == "bfloat16":
        return torch.from_numpy(value.view(np.uint16).copy()).view(torch.bfloat16)
    if name in ("float8_e4m3fn", "float8_e5m2"):
        return torch.from_numpy(value.view(np.uint8).copy()).view(getattr(torch, name))
    return torch.from_numpy(value.copy())


def _to_float_array(value):
    import numpy as np

    if hasattr(value, "detach"):
        value = value.detach().to(dtype=__import__("torch").float32).cpu().numpy()
    return np.asarray(value).astype(np.float32)


def _stand_in_for_neuron_dtypes() -> None:
    """Some torch references import ``neuron_dtypes`` (a package of the Neuron SDK, not public) for
    their MX paths; the cases here take other paths, so a stand-in with its casting helpers lets
    those modules import."""
    import types

    import numpy as np

    if "neuron_dtypes" in sys.modules:
        return
    import nki.language as nl

    module = types.ModuleType("neuron_dtypes", "stand-in of the Neuron SDK's dtype helpers for the conformance runner")
    module.static_cast = nl.static_cast
    module.is_float_type = lambda dtype: np.dtype(dtype).kind in "fV"
    module.__getattr__ = lambda attr: getattr(nl, attr)
    sys.modules["neuron_dtypes"] = module


def run_case_here(name: str, library: str) -> dict:
    """Runs one library case in this process: {status, reason, max_error}."""
    import importlib

    import numpy as np

    sys.path.insert(0, os.path.join(library, "src"))
    sys.path.insert(0, library)  # some torch references import helpers of the library's test tree
    sys.path.insert(0, HERE)
    from nikki import compat

    compat.install()
    compat.present_simulated_instance()
    _stand_in_for_neuron_dtypes()
    import conformance_library
    import nki

    case = next(c for c in conformance_library.CASES if c.name == name)

    def resolve(spec):
        module, function = spec.split(":")
        return getattr(importlib.import_module("nkilib_src.nkilib." + module), function)

    kernel = case.kernel() if callable(case.kernel) else resolve(case.kernel)
    reference = resolve(case.reference) if case.reference else None
    inputs = case.inputs()
    torch_inputs = {k: _to_torch(v) for k, v in inputs.items()}
    expected = (case.call_reference(reference, torch_inputs) if case.call_reference is not None
                else reference(**torch_inputs))
    expected = list(expected.values()) if isinstance(expected, dict) else list(
        expected if isinstance(expected, (tuple, list)) else [expected])
    kernel_inputs = {k: v.copy() if isinstance(v, np.ndarray) else v for k, v in inputs.items()}
    got = nki.simulate(kernel)[case.lnc](**kernel_inputs)
    got = list(got) if isinstance(got, (tuple, list)) else [got]
    if len(got) != len(expected):
        return dict(status="fail", reason=f"kernel returned {len(got)} outputs, the reference {len(expected)}")
    worst = 0.0
    for index, (g, e) in enumerate(zip(got, expected)):
        g, e = _to_float_array(g), _to_float_array(e)
        if g.size != e.size:
            return dict(status="fail", reason=f"output {index}: shape {g.shape}, reference {e.shape}")
        g = g.reshape(e.shape)
        if index in case.own_checks:
            problem = case.own_checks[index](g, e, inputs)
            if problem:
                return dict(status="fail", max_error=worst, reason=f"output {index}: {problem}")
            continue
        finite = np.isfinite(e)
        worst = max(worst, float(np.max(np.abs(g - e)[finite], initial=0.0)))
        if not np.allclose(g, e, atol=case.atol, rtol=case.rtol, equal_nan=True):
            bad = int(np.sum(~np.isclose(g, e, atol=case.atol, rtol=case.rtol, equal_nan=True)))
            return dict(status="fail", max_error=worst,
                        reason=f"output {index}: {bad} of {e.size} elements differ (max abs error {worst:.3g})")
    return dict(status="pass", reason="", max_error=worst)


def _syntax_error(path: str) -> str:
    """'line N: message' when the file does not parse as Python, else ''."""
    import ast

    try:
        with open(path, encoding="utf-8") as f:
            ast.parse(f.read(), path)
    except SyntaxError as err:
        return f"line {err.lineno}: {err.msg}"
    return ""


def _kernel_name(case) -> str:
    return f"{case.kernel.__name__} (wraps the kernel)" if callable(case.kernel) else case.kernel


def run_library(root: str, timeout: float, names=None) -> list:
    """[{case, kernel, status, seconds, reason}] for LIBRARY_CASES, one subprocess each."""
    sys.path.insert(0, HERE)
    import conformance_library

    rows = []
    for case in conformance_library.CASES:
        if names and case.name not in names:
            continue
        module = (case.reference if callable(case.kernel) else case.kernel).split(":")[0].replace(".", "/") + ".py"
        path = os.path.join(root, "src", "nkilib_src", "nkilib", module)
        if not os.path.exists(path):
            rows.append(dict(case=case.name, kernel=_kernel_name(case), status="missing", seconds=0.0,
                             reason=f"{module} is not in this checkout"))
            continue
        invalid = _syntax_error(path)
        if invalid:
            rows.append(dict(case=case.name, kernel=_kernel_name(case), status="invalid", seconds=0.0,
                             reason=f"{module} in this checkout is not valid Python ({invalid}): no NKI runs it"))
            continue
        cmd = [sys.executable, os.path.abspath(__file__), "--run-case", case.name, "--library", root]
        rc, out, seconds = _run(cmd, root, timeout)
        result = None
        for line in out.splitlines():
            if line.startswith("CONFORMANCE-RESULT "):
                result = json.loads(line[len("CONFORMANCE-RESULT "):])
        if rc == "timeout":
            result = dict(status="timeout", reason=f"still running after {timeout:.0f} s")
        elif result is None:
            result = dict(status="fail", reason=_reason(out))
        rows.append(dict(case=case.name, kernel=_kernel_name(case), seconds=seconds, **result))
    return rows


# --- report --------------------------------------------------------------------------------------

def _git_head(path: str) -> str:
    try:
        return subprocess.run(["git", "-C", path, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _count(rows, counted=("pass", "fail", "timeout")) -> tuple:
    runs = sum(r["status"] == "pass" for r in rows)
    return runs, sum(r["status"] in counted for r in rows)


def _table(rows, columns) -> list:
    lines = ["| " + " | ".join(title for title, _ in columns) + " |", "|" + "---|" * len(columns)]
    for r in rows:
        cells = []
        for _title, key in columns:
            value = r.get(key, "")
            cells.append(f"{value:.1f}" if isinstance(value, float) else str(value).replace("|", "/"))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def report(args, samples, unit, library) -> str:
    command = "PYTHONPATH=bindings/python python bench/python/conformance.py" + "".join(
        f" --{flag} {value}" for flag, value in (("samples", args.samples), ("samples-unit", args.samples_unit),
                                                 ("library", args.library)) if value)
    lines = ["# Conformance: public NKI code on nikki", "",
             f"Generated by `bench/python/conformance.py` on {time.strftime('%Y-%m-%d')} at nikki commit "
             f"`{_git_head(ROOT)}`:", "", "```", command + " --out docs/conformance.md", "```", "",
             "| part | checkout | runs | counted | not counted |", "|---|---|---:|---:|---|"]
    parts = []
    if samples is not None:
        runs, counted = _count(samples)
        other = len(samples) - counted
        parts.append(("nki-samples tutorials and contributed kernels", args.samples, runs, counted,
                      f"{other} kernel modules and framework drivers (listed)"))
    if unit is not None:
        runs, counted = _count(unit)
        parts.append(("nki-samples unit suite (`--simulation-only`)", args.samples_unit, runs, counted,
                      f"{len(unit) - counted} skipped"))
    if library is not None:
        runs, counted = _count(library)
        parts.append(("nki-library kernels vs their torch references", args.library, runs, counted,
                      f"{len(library) - counted} not in the checkout or not valid Python there"))
    for title, path, runs, counted, other in parts:
        lines.append(f"| {title} | `{_git_head(path)}` | {runs} | {counted} | {other} |")
    if samples is not None:
        lines += ["", "## nki-samples: tutorials and contributed kernels", "",
                  "Scripts run as `python -m nikki run FILE` in their folder, pytest files as "
                  "`python -m nikki pytest FILE`.", ""]
        lines += _table(samples, [("file", "file"), ("kind", "kind"), ("status", "status"), ("s", "seconds"),
                                  ("why not", "reason")])
    if unit is not None:
        lines += ["", "## nki-samples unit suite", "",
                  "`PYTHONPATH=src python -m nikki pytest test/unit/FILE --simulation-only` in the checkout, one "
                  "process per file.", ""]
        lines += _table(unit, [("test", "test"), ("status", "status"), ("s", "seconds"), ("why not", "reason")])
    if library is not None:
        lines += ["", "## nki-library kernels", "",
                  "Each case of `bench/python/conformance_library.py`: the kernel through `nki.simulate`, at a "
                  "small single-core shape, against the library's torch reference on the same inputs.", ""]
        lines += _table(library, [("case", "case"), ("kernel", "kernel"), ("status", "status"), ("s", "seconds"),
                                  ("why not", "reason")])
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    if argv is None and len(sys.argv) > 2 and sys.argv[1] == "--run-case":
        args = argparse.ArgumentParser()
        args.add_argument("--run-case")
        args.add_argument("--library")
        ns = args.parse_args()
        try:
            result = run_case_here(ns.run_case, ns.library)
        except Exception as err:  # the case failed: say how, in one line (the traceback goes to stderr)
            import traceback

            traceback.print_exc()
            result = dict(status="fail", reason=_short(f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"))
        print("CONFORMANCE-RESULT " + json.dumps(result), flush=True)
        return 0
    args = _parse_args(argv)
    timeout = min(args.timeout, 240.0) if args.quick else args.timeout
    samples = run_samples(args.samples, timeout) if args.samples else None
    unit = run_unit_suite(args.samples_unit, timeout) if args.samples_unit else None
    library = run_library(args.library, timeout, args.cases) if args.library else None
    text = report(args, samples, unit, library)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
