"""Bounded memory in long processes: the in-memory specialization caches of all kernels share one
byte budget (least recently used entries are dropped and compiled again, from the disk cache, when
met again), executors borrow the simulated core's memories per run, and the disk cache rebuilds
any entry it cannot use.

Kernels here only move data or do one fp32 operation whose numpy float32 counterpart rounds
identically, so comparisons are exact.
"""

import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import nikki
import nikki as nki
import nikki.kernels as K
import nikki.language as nl
from nikki import _core
from nikki import specialization_cache

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PYTHONPATH = os.path.join(REPO, "bindings", "python")


@pytest.fixture
def cache_limit():
    """Restores the process's budget after a test changes it, and starts from an empty cache."""
    nikki.clear_cache()
    previous = nikki.set_cache_limit(nikki.cache_info()["limit"])
    yield nikki.set_cache_limit
    nikki.set_cache_limit(previous)
    nikki.clear_cache()


@pytest.fixture
def disk_cache(tmp_path, monkeypatch):
    """A fresh disk cache directory (the compile pipeline reads NIKKI_CACHE_DIR on every compile)."""
    monkeypatch.setenv("NIKKI_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def resident_bytes() -> int:
    """This process's resident set size, from /proc/self/statm (pages)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def scaled(traces):
    @nki.jit
    def scale(a, factor):
        traces.append((a.shape, factor))
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.multiply(nl.load(a), factor))
        return out

    return scale


def test_many_specializations_keep_resident_memory_bounded(cache_limit, disk_cache):
    # Before the budget and the borrowed core memories, every specialization kept its programs and
    # a simulated core's SBUF and PSUM (about 30 MB) for the life of the process: these 32 shapes
    # grew the process by about a gigabyte. A program of this kernel is about 20 KB: the budget
    # holds a dozen.
    cache_limit(256 << 10)
    traces = []
    scale = scaled(traces)
    rng = np.random.default_rng(0)

    def run(cols):
        a = rng.standard_normal((128, cols), dtype=np.float32)
        np.testing.assert_array_equal(scale(a, 3.0), a * np.float32(3.0))

    for cols in range(8, 16):  # warm up: the JIT, allocator arenas, the first core memories
        run(cols)
    before = resident_bytes()
    for cols in range(16, 48):
        run(cols)
    growth = resident_bytes() - before
    assert len(traces) == 40
    info = nikki.cache_info()
    assert info["bytes"] <= 256 << 10
    assert len(scale._cache) == info["entries"] < 20
    assert info["evictions"] >= 20
    assert _core.live_core_memories() <= 2
    # What stays: 256 KiB of programs, allocator slack. 64 MiB is far below one core memory per
    # specialization (32 x ~30 MB) and leaves the allocator room.
    assert growth < 64 << 20, f"resident memory grew by {growth / 2**20:.1f} MiB over 32 specializations"


def test_an_evicted_specialization_compiles_again_from_the_disk_cache(cache_limit, disk_cache):
    traces = []
    scale = scaled(traces)
    a = np.arange(128 * 32, dtype=np.float32).reshape(128, 32)
    b = np.arange(128 * 48, dtype=np.float32).reshape(128, 48)
    first = scale(a, 2.0)
    cache_limit(0)  # keeps only the specialization in use
    np.testing.assert_array_equal(scale(b, 2.0), b * 2)
    assert len(scale._cache) == 1 and nikki.cache_info()["evictions"] >= 1
    again = scale(a, 2.0)  # evicted: traced and compiled again
    np.testing.assert_array_equal(again, first)
    np.testing.assert_array_equal(again, a * 2)
    assert [shape for shape, _ in traces] == [(128, 32), (128, 48), (128, 32)]
    (compiled,) = scale._cache.values()
    stages = [stage for stage, _ms in compiled.programs[0].timings]
    assert "cache" in stages and "schedule" not in stages, stages  # from the disk cache
    assert compiled.programs[0].native_stats.get("origin", "disk cache") in ("disk cache", "in memory")


def test_a_used_entry_is_kept_and_the_least_recently_used_goes(cache_limit, disk_cache):
    traces = []
    scale = scaled(traces)
    arrays = [np.ones((128, cols), np.float32) for cols in (8, 16, 24)]
    for a in arrays[:2]:
        scale(a, 1.0)
    per_entry = nikki.cache_info()["bytes"] // 2
    cache_limit(per_entry * 2 + per_entry // 2)  # room for two of these entries
    scale(arrays[0], 1.0)  # now the most recently used
    scale(arrays[2], 1.0)  # evicts arrays[1]'s entry, the least recently used
    assert len(traces) == 3
    scale(arrays[0], 1.0)
    assert len(traces) == 3  # still cached
    scale(arrays[1], 1.0)
    assert [shape[1] for shape, _ in traces] == [8, 16, 24, 16]


def test_library_kernels_and_traced_outputs_share_the_budget(cache_limit, disk_cache, rng):
    cache_limit(0)
    for rows in (64, 96, 128):
        x = rng.standard_normal((rows, 64), dtype=np.float32)
        out = K.softmax(x)
        expected = np.exp(x - x.max(axis=1, keepdims=True))
        np.testing.assert_allclose(out, expected / expected.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-6)
    assert len(K.softmax._cache) == 1
    traces = []
    scale = scaled(traces)
    for cols in (8, 16, 24):
        (shape, dtype), = scale.output_specs(nikki.spec((128, cols), np.float32), 1.0)
        assert shape == (128, cols)
    assert len(scale._outputs_cache) == 1


def test_clear_cache_drops_every_kernels_entries(cache_limit, disk_cache):
    traces = []
    scale = scaled(traces)
    a = np.ones((128, 8), np.float32)
    scale(a, 1.0)
    scale[2](a, 1.0)  # a launch grid shares the kernel's cache
    assert nikki.cache_info()["entries"] == 2 and len(scale._cache) == 2
    nikki.clear_cache()
    assert nikki.cache_info()["entries"] == 0 and nikki.cache_info()["bytes"] == 0 and len(scale._cache) == 0
    np.testing.assert_array_equal(scale(a, 1.0), a)
    assert len(traces) == 4  # once, twice for the grid's two instances, once again after clearing


def test_a_collected_kernel_gives_its_bytes_back(cache_limit, disk_cache):
    scale = scaled([])
    scale(np.ones((128, 8), np.float32), 1.0)
    assert nikki.cache_info()["entries"] == 1
    del scale
    import gc

    gc.collect()
    assert nikki.cache_info() | {"limit": 0, "evictions": 0} == {"entries": 0, "bytes": 0, "limit": 0,
                                                                    "evictions": 0}


def test_set_cache_limit_accepts_byte_counts_and_suffixes(cache_limit):
    cache_limit("2M")
    assert nikki.cache_info()["limit"] == 2 << 20
    assert cache_limit(1 << 30) == 2 << 20
    cache_limit("512k")
    assert nikki.cache_info()["limit"] == 512 << 10
    cache_limit(np.int64(3 << 20))  # numpy integers, as shapes and sizes accept them
    assert nikki.cache_info()["limit"] == 3 << 20 and type(nikki.cache_info()["limit"]) is int


@pytest.mark.parametrize("bad", [-1, 1.5, True, np.bool_(True), np.float64(2.0), "lots", "12T"])
def test_set_cache_limit_rejects_what_is_not_a_byte_count(cache_limit, bad):
    with pytest.raises(nikki.KernelError) as err:
        cache_limit(bad)
    message = str(err.value)
    assert "set_cache_limit" in message
    assert "byte" in message
    assert "1G" in message or "1 << 30" in message


def test_the_budget_comes_from_nikki_memory_cache_bytes(monkeypatch):
    ledger = specialization_cache._ledger
    saved = ledger.limit
    try:
        monkeypatch.setenv("NIKKI_MEMORY_CACHE_BYTES", "3G")
        ledger.limit = None
        assert nikki.cache_info()["limit"] == 3 << 30
        monkeypatch.setenv("NIKKI_MEMORY_CACHE_BYTES", "three gigabytes")
        ledger.limit = None
        with pytest.raises(nikki.KernelError) as err:
            nikki.cache_info()
        message = str(err.value)
        assert "NIKKI_MEMORY_CACHE_BYTES='three gigabytes' is not a byte count" in message
        assert "K, M or G" in message and "1G" in message
        monkeypatch.delenv("NIKKI_MEMORY_CACHE_BYTES")
        ledger.limit = None
        assert nikki.cache_info()["limit"] == specialization_cache.DEFAULT_LIMIT_BYTES
    finally:
        ledger.limit = saved


# --- the disk cache rebuilds entries it cannot use ----------------------------------------------

_TWO_KERNELS = textwrap.dedent("""
    import sys
    import numpy as np
    import nikki as nki
    import nikki.language as nl

    @nki.jit
    def combine(a, b, op):  # one specialization, with its own native code, per operator
        result = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        nl.store(result, op(nl.load(a), nl.load(b)))
        return result

    a = np.arange(128 * 16, dtype=np.float32).reshape(128, 16)
    b = np.full((128, 16), 3.0, np.float32)
    for name in sys.argv[1:]:
        op, expected = (nl.add, a + b) if name == "add" else (nl.subtract, a - b)
        np.testing.assert_array_equal(combine(a, b, op), expected)
        compiled = combine._cache.get(combine._key((a, b, op)))
        print(name, compiled.programs[0].native_stats["origin"])
""")


def _run_kernels(cache_dir, *names, log=False):
    env = dict(os.environ, PYTHONPATH=PYTHONPATH, NIKKI_CACHE_DIR=str(cache_dir))
    env.pop("NIKKI_EXECUTOR", None)
    if log:
        env["NIKKI_LOG"] = "cache"
    else:
        env.pop("NIKKI_LOG", None)
    result = subprocess.run([sys.executable, "-c", _TWO_KERNELS, *names], env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr
    return result.stdout.split("\n"), result.stderr


def _native_entries(cache_dir):
    return {entry.name for entry in (cache_dir / "native").iterdir()}


@pytest.fixture(scope="module")
def two_native_entries(tmp_path_factory):
    """A disk cache holding the native code of the "add" and of the "sub" specialization, with the
    file names of the one entry each has of its own: native code is cached per template, and the
    two share every template but their operator's."""
    cache_dir = tmp_path_factory.mktemp("pristine") / "cache"
    _run_kernels(cache_dir, "add")
    add_entries = _native_entries(cache_dir)
    _run_kernels(cache_dir, "sub")
    (sub_name,) = _native_entries(cache_dir) - add_entries
    sub_alone = tmp_path_factory.mktemp("sub") / "cache"
    _run_kernels(sub_alone, "sub")
    (add_name,) = add_entries - _native_entries(sub_alone)
    return cache_dir, add_name, sub_name


def _damage_swap(entry, other):
    entry.write_bytes(other.read_bytes())


def _damage_truncate(entry, other):
    entry.write_bytes(entry.read_bytes()[:-5])


def _damage_flip(entry, other):
    data = bytearray(entry.read_bytes())
    data[len(data) // 2] ^= 0xFF
    entry.write_bytes(bytes(data))


def _damage_version(entry, other):
    data = bytearray(entry.read_bytes())
    data[8:12] = (99).to_bytes(4, "little")  # the entry format's version field follows the magic
    entry.write_bytes(bytes(data))


@pytest.mark.parametrize("damage, reason", [(_damage_swap, "of another key"), (_damage_truncate, "truncated"),
                                            (_damage_flip, "corrupt"), (_damage_version, "of another format version")])
def test_a_damaged_or_swapped_native_entry_is_rebuilt_in_later_processes(tmp_path, two_native_entries, damage,
                                                                         reason):
    pristine, add_name, sub_name = two_native_entries
    cache_dir = tmp_path / "cache"
    shutil.copytree(pristine, cache_dir)
    add_entry, sub_entry = cache_dir / "native" / add_name, cache_dir / "native" / sub_name
    damage(add_entry, sub_entry)
    out, err = _run_kernels(cache_dir, "add", log=True)
    assert out[0] == "add compiled"
    assert f"nikki: cache entry {add_entry} is {reason}: rebuilding it" in err
    out, err = _run_kernels(cache_dir, "add", "sub", log=True)  # rewritten: both load again
    assert out[:2] == ["add disk cache", "sub disk cache"]
    assert "rebuilding" not in err
