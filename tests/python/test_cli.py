"""The command line: ``nikki profile`` (estimated profile of every kernel a script launches) and
``nikki disasm`` (a device program file, as a kernel author reads it)."""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np

import nikki as nki
import nikki.isa as nisa
import nikki.language as nl

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PYTHONPATH = os.path.join(REPO, "bindings", "python")

SCRIPT = textwrap.dedent('''
    import numpy as np
    import nki
    import nki.language as nl
    import nki.isa as nisa

    @nki.jit
    def scale(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray(a.shape, a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a)
        nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=3.0)
        nisa.dma_copy(dst=out, src=t)
        return out

    for n in (64, 64, 128):
        y = scale(np.ones((128, n), np.float32))
    print("result", float(y[0, 0]))
''')


def _nikki(*args, cwd):
    env = dict(os.environ, PYTHONPATH=PYTHONPATH + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "nikki", *args], env=env, capture_output=True, text=True,
                          timeout=300, cwd=cwd)


def test_profile_prints_each_specialization_and_writes_traces(tmp_path):
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    out_dir = tmp_path / "traces"
    proc = _nikki("profile", "--out", str(out_dir), str(script), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "result 3.0" in proc.stdout  # the script itself ran
    assert "2 kernel specialization(s) launched" in proc.stdout
    assert "== scale (launched 2x) ==" in proc.stdout and "== scale (launched 1x) ==" in proc.stdout
    assert "ESTIMATE" in proc.stdout and "script.py:12" in proc.stdout  # the tensor_scalar line
    traces = sorted(os.listdir(out_dir))
    assert traces == ["00_scale.json", "01_scale.json"]
    events = json.loads((out_dir / traces[0]).read_text())["traceEvents"]
    assert any(e.get("name") == "tensor_scalar" for e in events)


def test_profile_of_a_script_without_kernels_fails(tmp_path):
    script = tmp_path / "empty.py"
    script.write_text("print('nothing')\n")
    proc = _nikki("profile", str(script), cwd=tmp_path)
    assert proc.returncode == 1
    assert "launched no kernel" in proc.stderr


@nki.jit
def _add_one(a):
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray(a.shape, a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=a)
    nisa.tensor_scalar(dst=t, data=t, op0=nl.add, operand0=1.0)
    nisa.dma_copy(dst=out, src=t)
    return out


def test_disasm_prints_a_serialized_program(tmp_path):
    compiled = _add_one.specialize(np.zeros((32, 16), np.float32))
    path = tmp_path / "add_one.neff"
    path.write_bytes(compiled.programs[0].serialize())
    proc = _nikki("disasm", str(path), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == compiled.programs[0].disassemble()
    assert "tensor_scalar" in proc.stdout and "qVector" in proc.stdout


def test_disasm_reports_a_damaged_file(tmp_path):
    compiled = _add_one.specialize(np.zeros((32, 16), np.float32))
    data = compiled.programs[0].serialize()
    path = tmp_path / "cut.neff"
    path.write_bytes(data[: len(data) // 2])
    proc = _nikki("disasm", str(path), cwd=tmp_path)
    assert proc.returncode == 1
    assert proc.stderr.startswith(f"nikki disasm: {path}: ")
    assert "device program file is corrupt: its size does not match its header (truncated)" in proc.stderr
