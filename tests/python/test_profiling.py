"""nikki.estimate, nki.profile and nki.benchmark: the timing model from Python. Absolute times
are checked against hand-computed costs from NKI's formulas (docs/performance-model.md)."""

import json
import os

import numpy as np
import pytest

import nikki as nki
import nikki.isa as nisa
import nikki.language as nl


@nki.jit
def copy_kernel(a):
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray(a.shape, a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=a)
    nisa.tensor_copy(dst=t, src=t)
    nisa.dma_copy(dst=out, src=t)
    return out


def test_estimate_needs_no_data_and_matches_the_cost_model():
    # trn1: DMA in and out of a [128, 512] fp32 tile (128 buffers of 2 KiB each costing 512 B more, 1300 ns latency, 16 x 17 B/ns)
    # around one VectorE copy of max(64, 512) cycles at 1.4 GHz.
    prof = nki.estimate(copy_kernel, nki.spec((128, 512), nl.float32), target="trn1")
    dma = 1300 + (128 * 512 * 4 + 128 * 512) / (16 * 17.0)
    assert prof.total_ns == pytest.approx(2 * dma + 512 / 1.4)
    assert prof.target == "trn1 (NeuronCore-v2)"
    assert prof.utilization("vector") == pytest.approx((512 / 1.4) / prof.total_ns)
    assert prof.dma_bytes == 2 * 128 * 512 * 4


def test_io_bytes_and_roofline_of_a_memory_bound_kernel():
    # [128, 512] fp32 in and out: 2 x 256 KiB at trn1's 16 queues x 17 B/ns
    prof = nki.estimate(copy_kernel, nki.spec((128, 512), nl.float32), target="trn1")
    assert prof.io_bytes() == 2 * 128 * 512 * 4
    assert prof.roofline_ns() == pytest.approx(2 * 128 * 512 * 4 / (16 * 17.0))
    assert prof.roofline_ns() < prof.total_ns
    # useful FLOPs given: the compute side of the roofline wins when it is the longer one
    flops = 1e9
    assert prof.roofline_ns(flops) == pytest.approx(max(flops / prof._peak_flops_per_ns, prof.roofline_ns()))


def test_estimate_accepts_arrays_and_target_from_the_environment(monkeypatch):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn2")
    prof = nki.estimate(copy_kernel, np.zeros((128, 512), np.float32))
    assert prof.target == "trn2 (NeuronCore-v3)"
    assert prof.total_ns > 0


def test_summary_trace_and_timeline_are_labelled_estimates(tmp_path):
    prof = nki.estimate(copy_kernel, nki.spec((128, 512), nl.bfloat16))
    text = prof.summary()
    assert "ESTIMATE" in text and "not a measurement" in text
    assert "qVector" in text and "DMA" in text
    trace = json.loads(open(prof.save_trace(str(tmp_path / "t.json"))).read())
    names = {e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "thread_name"}
    assert "qVector" in names and any(n.startswith("qDMA") for n in names)
    assert "not a measurement" in trace["otherData"]["estimate"]
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    assert {e["name"] for e in events} == {"dma_copy", "tensor_copy"}
    assert all("test_profiling.py" in e["args"]["source"] for e in events)
    png = prof.save_timeline(str(tmp_path / "t.png"))
    assert open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_matmul_utilization_on_a_compute_bound_kernel():
    @nki.jit
    def mm(lhsT, rhs):
        out = nl.ndarray((128, 512), nl.float32, buffer=nl.shared_hbm)
        st = nl.ndarray((128, 128), nl.bfloat16, buffer=nl.sbuf)
        mv = nl.ndarray((128, 512), nl.bfloat16, buffer=nl.sbuf)
        nisa.dma_copy(dst=st, src=lhsT)
        nisa.dma_copy(dst=mv, src=rhs)
        acc = nl.ndarray((128, 512), nl.float32, buffer=nl.psum)
        for _ in range(200):
            nisa.nc_matmul(acc, st, mv)
        res = nl.ndarray((128, 512), nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=res, src=acc)
        nisa.dma_copy(dst=out, src=res)
        return out

    prof = nki.estimate(mm, nki.spec((128, 128), nl.bfloat16), nki.spec((128, 512), nl.bfloat16), target="trn2")
    assert prof.matmul_flops == 200 * 2 * 128 * 128 * 512
    # 200 matmuls of 512 cycles at 2.4 GHz dominate the few microseconds of DMA around them
    assert prof.utilization("tensor") == pytest.approx(200 * 512 / 2.4 / prof.total_ns)
    assert 0.8 < prof.tensor_flop_utilization() < 1.0


def test_legacy_benchmark_reports_latency_percentiles_in_microseconds(capsys):
    @nki.benchmark(warmup=2, iters=5)
    def bench(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.load(a))
        return out

    a = np.ones((128, 64), np.float32)
    out = bench(a)
    assert out.shape == a.shape  # outputs are undefined, as in NKI
    p50 = bench.benchmark_result.nc_latency.get_latency_percentile(50)
    assert p50 == pytest.approx(nki.estimate(bench.__wrapped__ if hasattr(bench, "__wrapped__") else copy_kernel,
                                             a).total_us) or p50 > 0
    assert bench.benchmark_result.nc_latency.get_latency_percentile(99) == p50
    assert "ESTIMATE" in capsys.readouterr().err
    with pytest.raises(ValueError, match="percentile 37"):
        bench.benchmark_result.nc_latency.get_latency_percentile(37)


def test_legacy_profile_writes_program_trace_summary_and_timeline(tmp_path):
    @nki.profile(working_directory=str(tmp_path), save_neff_name="k.neff", save_trace_name="k.ntff")
    def prof_kernel(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.exp(nl.load(a)))
        return out

    a = np.linspace(-1, 1, 128 * 32, dtype=np.float32).reshape(128, 32)
    out = prof_kernel(a)
    np.testing.assert_allclose(out, np.exp(a), rtol=2e-7)  # the kernel really ran
    for name in ("k.neff", "k.json", "k_summary.txt", "k_timeline.png"):
        assert os.path.getsize(tmp_path / name) > 0
    assert open(tmp_path / "k.neff", "rb").read(8) == b"NIKKIDP\0"
    assert "ESTIMATE" in open(tmp_path / "k_summary.txt").read()
    with pytest.raises(nki.KernelError, match="exists"):
        prof_kernel(a)  # overwrite=False by default


def test_estimate_of_a_data_dependent_loop_explains_what_it_needs():
    @nki.jit
    def loop(a, n):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray((1, 1), nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=n)
        count = nisa.register_alloc()
        nisa.register_load(count, t)
        acc = nl.zeros(a.shape, a.dtype, buffer=nl.sbuf)

        def body(i):
            nisa.tensor_scalar(dst=acc, data=acc, op0=nl.add, operand0=1.0)

        nl.fori_loop(0, count, body)
        nisa.dma_copy(dst=out, src=acc)
        return out

    with pytest.raises(nki.KernelError, match="loop's bounds at compile time") as info:
        nki.estimate(loop, nki.spec((4, 4), nl.float32), nki.spec((1, 1), nl.int32))
    assert "test_profiling.py" in str(info.value)


def test_estimate_with_static_loop_bounds_runs_every_iteration():
    @nki.jit
    def loop(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        acc = nl.zeros(a.shape, a.dtype, buffer=nl.sbuf)

        def body(i):
            nisa.tensor_scalar(dst=acc, data=acc, op0=nl.add, operand0=1.0)

        nl.fori_loop(0, 10, body)
        nisa.dma_copy(dst=out, src=acc)
        return out

    prof = nki.estimate(loop, nki.spec((128, 512), nl.float32), target="trn1")
    vector = prof.engines()["qVector"]
    assert vector[1] == 11  # the memset of nl.zeros and ten loop iterations
    np.testing.assert_array_equal(loop(np.zeros((128, 512), np.float32)), np.full((128, 512), 10.0, np.float32))


# --- Profile.explain ----------------------------------------------------------------------------

@nki.jit
def load_scale_store(a):
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray(a.shape, a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=a)  # explain: load
    nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=2.0)  # explain: scale
    nisa.dma_copy(dst=out, src=t)
    return out


def _line_of(marker):
    with open(__file__) as f:
        return next(n for n, line in enumerate(f, 1) if line.rstrip().endswith(f"# {marker}"))


def test_explain_partitions_the_run_along_its_critical_path():
    prof = nki.estimate(load_scale_store, nki.spec((128, 512), nl.float32), target="trn2")
    e = prof.explain()
    # load -> scale -> store depend on each other: the path is all three, and owns the whole run
    assert e.critical_path and sum(step[3] for step in e.critical_path) == pytest.approx(prof.total_ns)
    assert sum(step[4] for step in e.critical_path) == 3
    # VectorE idles until the load has landed, waiting for the DMA queue at the load's line
    load = f"test_profiling.py:{_line_of('explain: load')}"
    waits = [r for r in e.idle if r[0] == "qVector" and r[1].startswith("waiting for qDMA")]
    assert len(waits) == 1 and waits[0][1].endswith(f"dma_copy at {load}"), e.idle
    scale = [r for r in prof.instructions() if r[1] == "tensor_scalar"][0]
    assert waits[0][2] == pytest.approx(scale[2])  # the idle time is exactly the scale's start
    # roofline: 2 x 256 KiB at the DMA peak, no FLOPs
    assert e.io_bytes == 2 * 128 * 512 * 4 and e.flops == 0
    assert e.memory_roofline_ns == pytest.approx(prof.roofline_ns())
    text = str(e)
    assert "ESTIMATED" in text and "critical path: 3 instructions" in text and "limit:" in text


@nki.jit
def vector_heavy(a):
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray(a.shape, a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=a)
    for _ in range(40):
        nisa.tensor_tensor(dst=t, data1=t, data2=t, op=nl.add)  # explain: hot vector line
    nisa.dma_copy(dst=out, src=t)
    return out


def test_explain_names_the_saturated_engine_and_its_line():
    prof = nki.estimate(vector_heavy, nki.spec((128, 2048), nl.float32), target="trn2")
    e = prof.explain()
    assert e.limit.startswith("VectorE (qVector) is busy"), e.limit
    hot = f"test_profiling.py:{_line_of('explain: hot vector line')}"
    assert e.critical_path[0][0] == hot and e.critical_path[0][1] == "qVector"
    assert e.suggestions and e.suggestions[0][0].startswith("VectorE is busy") and hot in e.suggestions[0][0]
    assert len(e.suggestions) <= 3


@nki.jit
def narrow_rows(a):
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray(a.shape, a.dtype, buffer=nl.sbuf)
    for i in range(a.shape[1] // 8):  # [128, 8] fp32 pieces: 32 B per partition row
        nisa.dma_copy(dst=t[:, i * 8:(i + 1) * 8], src=a[:, i * 8:(i + 1) * 8])
    for i in range(a.shape[1] // 8):
        nisa.dma_copy(dst=out[:, i * 8:(i + 1) * 8], src=t[:, i * 8:(i + 1) * 8])
    return out


def test_explain_suggests_wider_transfers_when_descriptors_are_small():
    prof = nki.estimate(narrow_rows, nki.spec((128, 512), nl.float32), target="trn2")
    texts = [s[0] for s in prof.explain().suggestions]
    assert any("32 B per descriptor" in t and "512 B or more" in t for t in texts), texts


def test_explain_rows_must_be_positive():
    prof = nki.estimate(load_scale_store, nki.spec((128, 512), nl.float32))
    with pytest.raises(Exception, match="Profile.explain: rows"):
        prof.explain(rows=0)


def test_profile_command_explains(tmp_path):
    import subprocess
    import sys

    script = tmp_path / "k.py"
    script.write_text(
        "import numpy as np\n"
        "import nki\n"
        "import nki.language as nl\n"
        "@nki.jit\n"
        "def add_one(a):\n"
        "    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)\n"
        "    nl.store(out, nl.add(nl.load(a), 1.0))\n"
        "    return out\n"
        "add_one(np.ones((128, 64), np.float32))\n")
    env = dict(os.environ, PYTHONPATH=os.path.join(os.path.dirname(__file__), "..", "..", "bindings", "python"))
    done = subprocess.run([sys.executable, "-m", "nikki", "profile", "--explain", "--out", str(tmp_path / "p"),
                           str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "limit:" in done.stdout and "critical path:" in done.stdout and "what would help most:" in done.stdout
