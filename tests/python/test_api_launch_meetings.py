"""Program instances of one launch that meet: nisa.core_barrier between them and nisa.sendrecv
to a partner core, against numpy.

The instances of ``kernel[2]`` (an LNC=2 launch) run in turn, each until its next meeting, so a
kernel that reads what its partner wrote before a barrier, or what it sent, sees it. Data is only
moved (dma_copy, sendrecv) or copied through tensor_copy, so results are compared exactly; the
sanitized run (the reference interpreter) and every stream order of the executor must give the
same bytes.
"""

import numpy as np
import pytest

import nikki as nki
import nikki.isa as nisa
import nikki.language as nl


def load(src):
    t = nl.ndarray(src.shape, src.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=src)
    return t


@nki.jit
def swap_halves_through_hbm(a):
    """Instance r writes a[r] into a shared scratch, waits at the barrier, then copies its
    partner's half: only correct when the barrier makes the partner's write happen first."""
    rank = nl.program_id(0)
    scratch = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=scratch[rank], src=load(a[rank]))
    nisa.core_barrier(scratch, (0, 1))
    nisa.dma_copy(dst=out[rank], src=load(scratch[1 - rank]))
    return out


@nki.jit
def swap_halves_by_sendrecv(a):
    """Instance r sends a[r] * 1 (a computed tile) to its partner and stores what it receives."""
    rank = nl.program_id(0)
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    mine = nl.ndarray(a.shape[1:], a.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=mine, src=load(a[rank]))
    got = nl.ndarray(a.shape[1:], a.dtype, buffer=nl.sbuf)
    nisa.sendrecv(src=mine, dst=got, send_to_rank=1 - rank, recv_from_rank=1 - rank, pipe_id=0)
    nisa.dma_copy(dst=out[rank], src=got)
    return out


@pytest.mark.parametrize("dtype", [np.float32, np.int32])
@pytest.mark.parametrize("shape", [(2, 128, 64), (2, 3, 5)])
@pytest.mark.parametrize("kernel", [swap_halves_through_hbm, swap_halves_by_sendrecv])
def test_instances_see_their_partners_data(kernel, shape, dtype, rng):
    a = (rng.standard_normal(shape) * 100).astype(dtype)
    np.testing.assert_array_equal(kernel[2](a), a[::-1])


def test_lnc2_environment_launches_two_instances_that_meet(rng, monkeypatch):
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "2")
    a = rng.standard_normal((2, 16, 8)).astype(np.float32)
    np.testing.assert_array_equal(swap_halves_by_sendrecv(a), a[::-1])


@nki.jit
def ring_of_sends(a, rounds):
    """Every instance passes its tile to the next one, `rounds` times, accumulating what passes."""
    rank, size = nl.program_id(0), nl.num_programs(0)
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    tile = load(a[rank])
    total = nl.ndarray(tile.shape, nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=total, src=tile)
    for step in range(rounds):
        passed = nl.ndarray(tile.shape, tile.dtype, buffer=nl.sbuf)
        nisa.sendrecv(src=tile, dst=passed, send_to_rank=(rank + 1) % size, recv_from_rank=(rank - 1) % size,
                      pipe_id=step % 2)
        nisa.tensor_tensor(dst=total, data1=total, data2=passed, op=nl.add)
        tile = passed
    nisa.dma_copy(dst=out[rank], src=total)
    return out


@pytest.mark.parametrize("instances,rounds", [(2, 1), (3, 2), (4, 5)])
def test_a_ring_of_sendrecvs_completes_together(instances, rounds, rng):
    a = rng.integers(-50, 50, (instances, 4, 6)).astype(np.float32)
    expected = sum(np.roll(a, step, axis=0) for step in range(rounds + 1))
    np.testing.assert_array_equal(ring_of_sends[instances](a, rounds), expected)


@nki.jit
def barrier_in_every_iteration(a):
    """Instance r adds its partner's running value, read back after a barrier, in each step: the
    two instances pass barrier n together, n = 0..3."""
    rank = nl.program_id(0)
    shared = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    value = load(a[rank])
    for _step in range(4):
        nisa.dma_copy(dst=shared[rank], src=value)
        nisa.core_barrier(shared, (0, 1))
        other = load(shared[1 - rank])
        nisa.core_barrier(shared, (0, 1))  # both read before either overwrites
        summed = nl.ndarray(value.shape, value.dtype, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=summed, data1=value, data2=other, op=nl.add)
        value = summed
    nisa.dma_copy(dst=out[rank], src=value)
    return out


def test_barriers_in_a_loop_meet_in_order(rng):
    a = rng.integers(-8, 8, (2, 8, 4)).astype(np.float32)
    x, y = a[0].astype(np.float64), a[1].astype(np.float64)
    for _ in range(4):
        x, y = x + y, y + x
    np.testing.assert_array_equal(barrier_in_every_iteration[2](a), np.stack([x, y]))


KERNELS = [(swap_halves_through_hbm, ()), (swap_halves_by_sendrecv, ()), (barrier_in_every_iteration, ())]


@pytest.mark.parametrize("order", ["latest", "earliest", "random:7"])
def test_stream_orders_and_the_sanitizer_give_the_same_bytes(order, rng, monkeypatch):
    a = rng.standard_normal((2, 32, 16)).astype(np.float32)
    for kernel, extra in KERNELS:
        monkeypatch.delenv("NIKKI_SANITIZE", raising=False)
        monkeypatch.delenv("NIKKI_STREAM_ORDER", raising=False)
        plain = kernel[2](a, *extra).tobytes()
        monkeypatch.setenv("NIKKI_STREAM_ORDER", order)
        assert kernel[2](a, *extra).tobytes() == plain
        monkeypatch.setenv("NIKKI_SANITIZE", "1")
        compiled = kernel[2].specialize(a, *extra)
        assert kernel[2](a, *extra).tobytes() == plain
        assert {p.executor for p in compiled.programs} == {"sanitizer"}


def test_sanitizer_refuses_to_send_a_tile_never_written(line_of):
    @nki.jit(sanitize=True)
    def kernel(a):
        rank = nl.program_id(0)
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        never_written = nl.ndarray(a.shape[1:], a.dtype, buffer=nl.sbuf)
        got = nl.ndarray(a.shape[1:], a.dtype, buffer=nl.sbuf)
        nisa.sendrecv(src=never_written, dst=got, send_to_rank=1 - rank, recv_from_rank=1 - rank, pipe_id=0)  # E:send
        nisa.dma_copy(dst=out[rank], src=got)
        return out

    with pytest.raises(nki.KernelError, match="is sent to another core") as err:
        kernel[2](np.ones((2, 4, 4), np.float32))
    assert f":{line_of('send')}" in str(err.value)


def test_a_core_barrier_alone_on_the_core_changes_nothing(rng):
    @nki.jit
    def kernel(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=a)
        nisa.core_barrier(out, (0, 1))
        nisa.core_barrier(out, 0)  # a single core as an int, as `cores=(0)` spells it
        again = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=again, src=out)
        return again

    a = rng.standard_normal((16, 8)).astype(np.float32)
    np.testing.assert_array_equal(kernel(a), a)
    assert kernel.specialize(a).text().count("core_barrier") == 2


# --- deadlocks and bad arguments -------------------------------------------------------------

def test_barriers_that_do_not_pair_up_are_a_deadlock_naming_each_instance(line_of):
    @nki.jit
    def kernel(a):
        rank = nl.program_id(0)
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out[rank], src=load(a[rank]))
        nisa.core_barrier(out, (0, 1))  # E:first
        if rank == 0:
            nisa.core_barrier(out, (0, 1))  # E:extra
        return out

    with pytest.raises(nki.KernelError, match="wait for each other forever") as err:
        kernel[2](np.ones((2, 4, 4), np.float32))
    text = str(err.value)
    assert f"instance 0 waits at its 2nd meeting, core_barrier(cores=[0, 1]) at " in text
    assert f":{line_of('extra')}" in text
    assert "instance 1 ended after 1 meeting" in text
    assert "every instance passes the same meetings in the same order" in text


def test_a_sendrecv_whose_partner_waits_at_a_barrier_is_a_deadlock(line_of):
    @nki.jit
    def kernel(a):
        rank = nl.program_id(0)
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        tile = load(a[rank])
        if rank == 0:
            got = nl.ndarray(tile.shape, tile.dtype, buffer=nl.sbuf)
            nisa.sendrecv(src=tile, dst=got, send_to_rank=1, recv_from_rank=1, pipe_id=0)  # E:unpaired
            tile = got
        else:
            nisa.core_barrier(out, (0, 1))  # E:barrier
        nisa.dma_copy(dst=out[rank], src=tile)
        return out

    with pytest.raises(nki.KernelError, match="wait for each other forever") as err:
        kernel[2](np.ones((2, 4, 4), np.float32))
    text = str(err.value)
    assert f"instance 0 waits at its 1st meeting, sendrecv(send_to_rank=1, recv_from_rank=1) at " in text
    assert f":{line_of('unpaired')}" in text and f":{line_of('barrier')}" in text


def test_partners_whose_tiles_differ_in_size_are_an_error():
    @nki.jit
    def kernel(a):
        rank = nl.program_id(0)
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        rows = 4 if rank == 0 else 2
        got = nl.ndarray((rows, 4), a.dtype, buffer=nl.sbuf)
        nisa.sendrecv(src=load(a[rank, :rows]), dst=got, send_to_rank=1 - rank, recv_from_rank=1 - rank,
                      pipe_id=0)
        nisa.dma_copy(dst=out[rank, :rows], src=got)
        return out

    with pytest.raises(nki.KernelError, match=r"instance 0 receives 8 float32 elements from instance 1 into dst "
                       r"'\w+' of 16 float32 elements"):
        kernel[2](np.ones((2, 4, 4), np.float32))


def test_a_rank_outside_the_launch_is_an_error():
    @nki.jit
    def kernel(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        got = nl.ndarray(a.shape, a.dtype, buffer=nl.sbuf)
        nisa.sendrecv(src=load(a), dst=got, send_to_rank=1, recv_from_rank=0, pipe_id=0)
        nisa.dma_copy(dst=out, src=got)
        return out

    with pytest.raises(nki.KernelError, match=r"nisa.sendrecv: send_to_rank=1, but the launch has 1 program instance"
                       r"[\s\S]*kernel\[2\]"):
        kernel(np.ones((4, 4), np.float32))
    with pytest.raises(nki.KernelError, match=r"nisa.sendrecv: recv_from_rank=2, but the launch has 2 program "
                       r"instances[\s\S]*0 to 1"):
        @nki.jit
        def two(a):
            out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
            got = nl.ndarray(a.shape[1:], a.dtype, buffer=nl.sbuf)
            nisa.sendrecv(src=load(a[0]), dst=got, send_to_rank=0, recv_from_rank=2, pipe_id=0)
            nisa.dma_copy(dst=out[0], src=got)
            return out

        two[2](np.ones((2, 4, 4), np.float32))


@pytest.mark.parametrize("call,message", [
    (lambda t, g: nisa.sendrecv(src=t, dst=g, send_to_rank=-1, recv_from_rank=0, pipe_id=0),
     r"nisa.sendrecv: send_to_rank must be an integer at least 0, got -"),
    (lambda t, g: nisa.sendrecv(src=t, dst=g, send_to_rank=0, recv_from_rank=0, pipe_id=-2),
     r"nisa.sendrecv: pipe_id must be an integer at least 0, got -"),
    (lambda t, g: nisa.sendrecv(src=t, dst=g, send_to_rank=0, recv_from_rank=0, pipe_id=0, dma_engine=3),
     r"nisa.sendrecv: dma_engine"),
    (lambda t, g: nisa.core_barrier(g, ()), r"nisa.core_barrier: cores"),
    (lambda t, g: nisa.core_barrier(g, (0, -1)), r"nisa.core_barrier: cores\[1\] must be an integer at least 0, got -"),
    (lambda t, g: nisa.core_barrier(g, (1, 2)), r"cores=\(1, 2\) leaves out this program instance \(0\)"),
    (lambda t, g: nisa.core_barrier(g, (0,), engine="sync"), r"nisa.core_barrier: engine"),
])
def test_bad_meeting_arguments_are_errors_naming_them(call, message):
    @nki.jit
    def kernel(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        tile = load(a)
        got = nl.ndarray(a.shape, a.dtype, buffer=nl.sbuf)
        call(tile, got)
        nisa.dma_copy(dst=out, src=tile)
        return out

    with pytest.raises(nki.KernelError, match=message):
        kernel(np.ones((4, 4), np.float32))


@pytest.mark.parametrize("case,message", [
    ("psum", r"sendrecv moves tiles between the SBUFs of two NeuronCores"),
    ("dtype", r"src is float32 but dst is int32"),
    ("shape", r"dst has 8 elements \[2, 4\] but src has 16 \[4, 4\]"),
])
def test_the_verifier_checks_sendrecv_operands(case, message):
    @nki.jit
    def kernel(a):
        rank = nl.program_id(0)
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        tile = load(a[rank])
        got = nl.ndarray(tile.shape, tile.dtype, buffer=nl.sbuf)
        if case == "psum":
            got = nl.ndarray(tile.shape, tile.dtype, buffer=nl.psum)
        elif case == "dtype":
            got = nl.ndarray(tile.shape, nl.int32, buffer=nl.sbuf)
        elif case == "shape":
            got = nl.ndarray((2, 4), tile.dtype, buffer=nl.sbuf)
        nisa.sendrecv(src=tile, dst=got, send_to_rank=1 - rank, recv_from_rank=1 - rank, pipe_id=0)
        nisa.dma_copy(dst=out[rank], src=tile)
        return out

    with pytest.raises(nki.KernelError, match=message):
        kernel[2](np.ones((2, 4, 4), np.float32))


def test_meetings_need_neuroncore_v3():
    @nki.jit(platform_target="trn1")
    def kernel(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=a)
        nisa.core_barrier(out, (0,))
        return out

    with pytest.raises(nki.KernelError, match=r"core_barrier"):
        kernel(np.ones((4, 4), np.float32))


# --- the estimate ---------------------------------------------------------------------------

@nki.jit
def unequal_work_then_barrier(a):
    """Instance 0 does eight copies before the barrier, instance 1 one: instance 1 waits."""
    rank = nl.program_id(0)
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    tile = load(a[rank])
    for _ in range(8 if rank == 0 else 1):
        copied = nl.ndarray(tile.shape, tile.dtype, buffer=nl.sbuf)
        nisa.activation(dst=copied, op=nl.exp, data=tile)
        tile = copied
    nisa.core_barrier(out, (0, 1))
    nisa.dma_copy(dst=out[rank], src=tile)
    return out


def test_the_estimate_runs_meeting_instances_in_parallel_and_charges_the_wait(rng):
    a = rng.standard_normal((2, 128, 512)).astype(np.float32)
    profile = nki.estimate(unequal_work_then_barrier[2], a)
    rows = profile.instructions()
    barriers = [(s, e) for _q, op, s, e, _src in rows if op == "core_barrier"]
    assert len(barriers) == 2
    (start0, end0), (start1, end1) = barriers
    # Both leave the barrier together, when the busier instance 0 has drained; instance 1 arrives
    # earlier and waits.
    assert end0 == pytest.approx(end1)
    assert start1 < start0 <= end0
    assert end0 - start0 > 0  # the cross-core semaphore latency
    # In parallel: the launch lasts as long as its longest instance; instance 1 ends right after
    # its store, not after instance 0's whole run plus its own.
    assert profile.total_ns == pytest.approx(max(e for *_x, e, _src in rows))
    assert profile.total_ns < end0 + (end0 - start1)


def test_shared_hbm_tensors_that_differ_between_instances_are_an_error():
    @nki.jit
    def kernel(a):
        rank = nl.program_id(0)
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        scratch = nl.ndarray((2, 4 + rank, 4), a.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=scratch[rank, :4], src=load(a[rank]))
        nisa.core_barrier(scratch, (0, 1))
        nisa.dma_copy(dst=out[rank], src=load(scratch[1 - rank, :4]))
        return out

    with pytest.raises(nki.KernelError, match=r"shared_hbm tensor '\w+' is float32 \[2, 5, 4\] but the first program "
                       r"instance's tensor '\w+' it shares is float32 \[2, 4, 4\]"):
        kernel[2](np.ones((2, 4, 4), np.float32))


def test_an_output_written_by_one_instance_of_a_launch_that_meets(rng):
    @nki.jit
    def kernel(a):
        rank = nl.program_id(0)
        out = nl.ndarray(a.shape[1:], a.dtype, buffer=nl.shared_hbm)
        mine = load(a[rank])
        theirs = nl.ndarray(mine.shape, mine.dtype, buffer=nl.sbuf)
        nisa.sendrecv(src=mine, dst=theirs, send_to_rank=1 - rank, recv_from_rank=1 - rank, pipe_id=0)
        if rank == 0:  # the partner leaves the shared output to instance 0
            both = nl.ndarray(mine.shape, mine.dtype, buffer=nl.sbuf)
            nisa.tensor_tensor(dst=both, data1=mine, data2=theirs, op=nl.maximum)
            nisa.dma_copy(dst=out, src=both)
        return out

    a = rng.standard_normal((2, 16, 32)).astype(np.float32)
    np.testing.assert_array_equal(kernel[2](a), np.maximum(a[0], a[1]))
