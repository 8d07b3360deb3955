"""The Python benchmark scripts in bench/python run end to end in their quick modes.

These are not timing tests (figures are never asserted): the scripts are deliverables that
would otherwise only run by hand and rot unnoticed. Their own checks do run: native and interp
bit-identical and numpy-eager within its bound (simulation_throughput), each tutorial matmul
against numpy (matmul_tutorial --check)."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
BENCH = os.path.join(ROOT, "bench", "python")


def _run(script, *args):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (os.path.join(ROOT, "bindings", "python"), env.get("PYTHONPATH"))
                                        if p)
    done = subprocess.run([sys.executable, os.path.join(BENCH, script), *args], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, f"{script} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    return done.stdout


@pytest.mark.parametrize("script, args, expect", [
    ("native_vs_numpy.py", ["--quick"], "tensor_scalar_reduce mul + row sum"),
    ("simulation_throughput.py", ["--quick"], "layernorm_bn_narrow"),
    ("bench_frontend.py", ["--quick"], "numpy a + b"),
    ("matmul_tutorial.py", ["--check"], "ranking (slowest first)"),
])
def test_bench_script_runs(script, args, expect):
    """Each script exits cleanly and prints its table."""
    assert expect in _run(script, *args)
