"""The Python benchmark scripts in bench/python run end to end in their quick modes.

These are not timing tests (figures are never asserted): the scripts are deliverables that
would otherwise only run by hand and rot unnoticed. Their own checks do run: native and interp
bit-identical and numpy-eager within its bound (simulation_throughput), each tutorial matmul
against numpy (matmul_tutorial --check), and each tutorial Mamba and LayerNorm against float64
references (model_validation --check)."""

import os
import subprocess
import sys
import textwrap

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
    ("model_validation.py", ["--check", "--quick", "--markdown"], "published rankings kept"),
])
def test_bench_script_runs(script, args, expect):
    """Each script exits cleanly and prints its table."""
    assert expect in _run(script, *args)


def test_model_validation_rankings_name_rows_of_the_table():
    """A published ranking naming no row of the table would be skipped silently."""
    sys.path.insert(0, BENCH)
    try:
        import model_validation
    finally:
        sys.path.remove(BENCH)
    names = [row.name for row in model_validation.rows()]
    for slower, faster in model_validation.RANKINGS:
        assert slower in names and faster in names, (slower, faster)
    assert {row.split for row in model_validation.rows()} == {"calibrate", "check"}


def _write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))


def test_conformance_quick_mode_on_a_fixture_tree(tmp_path):
    """The conformance runner classifies a small nki-samples-like tree: a script that runs and
    matches, one whose printed comparison fails, a kernels-only module, a framework driver and a
    pytest file, each on its own row."""
    root = tmp_path / "samples"
    kernel = """
        from neuronxcc import nki
        import neuronxcc.nki.language as nl
        import numpy as np

        @nki.jit
        def add_one(a):
            out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
            nl.store(out, nl.add(nl.load(a), 1.0))
            return out
    """
    tutorials = root / "src" / "nki_samples" / "tutorials" / "add"
    _write(tutorials / "add_kernels.py", kernel)
    _write(tutorials / "add_runs.py", kernel + """
        if __name__ == "__main__":
            a = np.arange(8, dtype=np.float32).reshape(2, 4)
            print("match:", np.allclose(nki.simulate_kernel(add_one, a), a + 1))
    """)
    _write(tutorials / "add_wrong.py", kernel + """
        if __name__ == "__main__":
            a = np.arange(8, dtype=np.float32).reshape(2, 4)
            print("match:", np.allclose(nki.simulate_kernel(add_one, a), a + 2))
    """)
    _write(tutorials / "test_add.py", kernel + """
        def test_add_one():
            a = np.ones((2, 4), np.float32)
            assert np.array_equal(nki.simulate_kernel(add_one, a), a + 1)
    """)
    _write(root / "contributed" / "jax_driver.py", "import jax\nif __name__ == '__main__':\n    pass\n")
    unit = root / "test" / "unit"
    _write(unit / "conftest.py", """
        def pytest_addoption(parser):
            parser.addoption("--simulation-only", action="store_true")
    """)
    _write(unit / "test_unit_add.py", """
        import sys
        sys.path.insert(0, "src/nki_samples/tutorials/add")
        import numpy as np
        from add_kernels import add_one, nki

        def test_adds_one():
            assert np.array_equal(nki.simulate_kernel(add_one, np.zeros((2, 4), np.float32)), np.ones((2, 4)))

        def test_wrong():
            assert np.array_equal(nki.simulate_kernel(add_one, np.zeros((2, 4), np.float32)), np.zeros((2, 4)))
    """)
    out = tmp_path / "conformance.md"
    text = _run("conformance.py", "--quick", "--samples", str(root), "--samples-unit", str(root), "--out", str(out))
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in text.splitlines() if line.startswith("| src/") or line.startswith("| contributed/")}
    base = "src/nki_samples/tutorials/add/"
    assert rows[base + "add_runs.py"][:2] == ["script", "pass"]
    assert rows[base + "add_wrong.py"][:2] == ["script", "fail"]
    assert rows[base + "add_kernels.py"][:2] == ["kernels", "module"]
    assert rows[base + "test_add.py"][:2] == ["test", "pass"]
    assert rows["contributed/jax_driver.py"][:2] == ["driver", "excluded"]
    assert "| nki-samples tutorials and contributed kernels |" in out.read_text()
    tests = {line.split("|")[1].strip(): line.split("|")[2].strip() for line in text.splitlines()
             if line.startswith("| test/unit/")}
    assert tests == {"test/unit/test_unit_add::test_adds_one": "pass", "test/unit/test_unit_add::test_wrong": "fail"}


def test_conformance_library_rows_for_missing_and_invalid_kernel_files(tmp_path):
    """A library checkout without a case's kernel file gives a 'missing' row, one whose file does not
    parse as Python an 'invalid' row naming the line; neither is counted."""
    root = tmp_path / "library"
    _write(root / "src" / "nkilib_src" / "nkilib" / "core" / "cumsum" / "cumsum.py", """
        def cumsum(x):
            return x
              broken = True
    """)
    text = _run("conformance.py", "--quick", "--library", str(root), "--cases", "cumsum", "rope")
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in text.splitlines() if line.startswith("| cumsum") or line.startswith("| rope")}
    assert rows["cumsum"][1] == "invalid" and "not valid Python (line 4: unexpected indent)" in rows["cumsum"][3]
    assert rows["rope"][1] == "missing" and "core/embeddings/rope.py is not in this checkout" in rows["rope"][3]
    assert "| 0 | 0 | 2 not in the checkout or not valid Python there |" in text


def test_kernel_benchmarks_quick_mode_covers_every_kernel(tmp_path):
    """`nikki bench --quick` runs every registered kernel with a benchmark shape, writes JSON,
    markdown and the three plots; every row has estimates on both targets, and host times unless
    its work is above the host limit (1 MiB here, so the test times a few kernels on the host, not
    all: host timing is most of the command's time)."""
    import json

    from nikki.library import library_kernels

    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.join(ROOT, "bindings", "python")
    out, md, plots = tmp_path / "bench.json", tmp_path / "bench.md", tmp_path / "plots"
    host_limit = 1 << 20
    done = subprocess.run([sys.executable, "-m", "nikki", "bench", "--quick", "--host-limit", str(host_limit), "--json",
                           str(out), "--markdown", str(md), "--plots", str(plots)], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    rows = json.loads(out.read_text())["kernels"]
    expected = {n for n, k in library_kernels().items() if k.info["benchmark"] is not None}
    assert {r["kernel"] for r in rows} == expected
    for r in rows:
        for target in ("trn2", "trn1"):
            est = r[target]
            if target == "trn1" and "unsupported" in est:  # an instruction trn1 lacks (nonzero_with_count)
                assert "which trn1 does not have" in est["unsupported"], r
                continue
            assert est["us"] > 0 and 0 < est["utilization"] <= 1.0 and 0 < est["roofline_us"] <= est["us"], r
        if max(r["trn2"]["io_bytes"], r["trn2"]["useful_flops"] / 640) <= host_limit:
            assert r["host"]["nikki_s"] > 0, r
        else:
            assert "host" not in r, r
    timed = sum("host" in r for r in rows)
    assert 0 < timed < len(rows), timed  # both kinds of row are checked
    text = md.read_text()
    assert all(f"## {name}" in text for name in expected)
    assert sorted(p.name for p in plots.iterdir()) == ["host.png", "scaling.png", "utilization.png"]
    assert "] " in done.stderr  # the progress bar


def test_kernel_benchmarks_reject_an_unknown_kernel():
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "bindings", "python"))
    done = subprocess.run([sys.executable, "-m", "nikki", "bench", "--kernel", "no_such_kernel"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "unknown kernel(s) no_such_kernel; the library has" in done.stderr and "softmax" in done.stderr


def test_kernel_benchmarks_put_nki_library_kernels_beside_nikkis(tmp_path):
    """With --nki-library, a kernel of the checkout (here a fixture tree: a row-wise RMS norm in the
    nki-library's module layout and calling convention) is estimated beside nikki's rmsnorm."""
    library = tmp_path / "nki-library"
    _write(library / "src" / "nkilib_src" / "__init__.py", "")
    _write(library / "src" / "nkilib_src" / "nkilib" / "__init__.py", "")
    _write(library / "src" / "nkilib_src" / "nkilib" / "core" / "__init__.py", "")
    _write(library / "src" / "nkilib_src" / "nkilib" / "core" / "subkernels" / "__init__.py", "")
    _write(library / "src" / "nkilib_src" / "nkilib" / "core" / "subkernels" / "rmsnorm_tkg.py", """
        import nki
        import nki.language as nl

        @nki.jit
        def rmsnorm_tkg(input, gamma, output, eps=1e-6):
            rows = input.shape[0] * input.shape[1]
            x = nl.load(input.reshape((rows, input.shape[2])))
            mean_square = nl.mean(nl.square(x), axis=1, keepdims=True)
            normed = nl.multiply(x, nl.rsqrt(nl.add(mean_square, eps)))
            out = nl.ndarray((rows, input.shape[2]), input.dtype, buffer=nl.shared_hbm)
            nl.store(out, nl.multiply(normed, nl.load(gamma).broadcast_to((rows, input.shape[2]))))
            return out
    """)
    md = tmp_path / "bench.md"
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "bindings", "python"))
    done = subprocess.run([sys.executable, "-m", "nikki", "bench", "--quick", "--kernel", "rmsnorm", "--nki-library",
                           str(library), "--markdown", str(md)], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    text = md.read_text()
    assert "## Reference kernels: AWS's nki-library" in text
    rows = [line for line in text.splitlines() if "`core.subkernels.rmsnorm_tkg:rmsnorm_tkg`" in line]
    assert len(rows) == 2 and all("does not run" not in r for r in rows), text
    assert all(r.rstrip(" |").endswith("x") for r in rows)  # both estimated: a ratio is printed
