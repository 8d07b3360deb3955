"""The in-memory caches of compiled specializations, under one process-wide byte budget.

Every kernel (``@nki.jit`` and library kernels alike) keeps the programs it compiled for each
specialization, so that calling it again with the same shapes skips tracing and compiling. A
process that meets many shapes (a test suite, a training loop with changing batch sizes) would keep
all of them forever; instead, the caches of all kernels share one budget, and when their entries
hold more bytes than it allows, the least recently used ones are dropped. A dropped specialization
is traced and compiled again when it is met again, which the disk cache makes cheap.

The budget comes from ``NIKKI_MEMORY_CACHE_BYTES`` (a byte count, optionally with a ``K``, ``M`` or
``G`` suffix for KiB, MiB, GiB) and can be changed with :func:`set_cache_limit`;
:func:`clear_cache` drops everything and :func:`cache_info` tells what is held.
"""

from __future__ import annotations

import collections
import itertools
import numbers
import os
import threading
import weakref

from .errors import KernelError

__all__ = ["SpecializationCache", "set_cache_limit", "clear_cache", "cache_info", "DEFAULT_LIMIT_BYTES"]

#: The budget when NIKKI_MEMORY_CACHE_BYTES is not set: 512 MiB of compiled programs.
DEFAULT_LIMIT_BYTES = 512 << 20

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def _parse_bytes(text: str, source: str) -> int:
    value = text.strip().upper().removesuffix("B").removesuffix("I")
    unit = value[-1:] if value[-1:] in _UNITS else ""
    digits = value[: len(value) - len(unit)]
    if not digits.isdigit():
        raise KernelError(f"{source}={text!r} is not a byte count",
                          limit="a non-negative integer, optionally followed by K, M or G",
                          hint=f"set {source} to e.g. 1073741824 or 1G")
    return int(digits) * _UNITS[unit]


class _Ledger:
    """The order of use and the sizes of every cached entry of every kernel."""

    def __init__(self):
        self.lock = threading.RLock()
        self.order: collections.OrderedDict = collections.OrderedDict()  # id -> (cache ref, key, bytes)
        self.bytes = 0
        self.limit: int | None = None  # read from the environment on first use
        self.evictions = 0
        self.ids = itertools.count()
        # Entry ids of caches that were garbage collected: their finalizers may run at any
        # allocation, even inside the ledger's own methods, so they only queue the ids here.
        self.dead: list = []

    def current_limit(self) -> int:
        if self.limit is None:
            env = os.environ.get("NIKKI_MEMORY_CACHE_BYTES")
            self.limit = DEFAULT_LIMIT_BYTES if not env else _parse_bytes(env, "NIKKI_MEMORY_CACHE_BYTES")
        return self.limit

    def add(self, cache, key, nbytes: int) -> int:
        with self.lock:
            self.forget_dead()
            entry_id = next(self.ids)
            self.order[entry_id] = (weakref.ref(cache), key, nbytes)
            self.bytes += nbytes
            self.shrink(keep=entry_id)
            return entry_id

    def shrink(self, keep=None):
        """Drops least recently used entries until the budget holds (never `keep`, the entry just
        added: the call that made it is about to use it)."""
        limit = self.current_limit()
        while self.bytes > limit and self.order:
            entry_id = next(iter(self.order))
            if entry_id == keep:
                if len(self.order) == 1:
                    break
                self.order.move_to_end(entry_id)
                continue
            self.drop(entry_id)
            self.evictions += 1

    def drop(self, entry_id):
        """Removes an entry from the ledger and from its kernel's cache."""
        cache_ref, key, _nbytes = self.order[entry_id]
        self.forget(entry_id)
        cache = cache_ref()
        if cache is not None:
            cache._ids.discard(entry_id)
            found = cache._entries.get(key)
            if found is not None and found[1] == entry_id:
                del cache._entries[key]

    def forget(self, entry_id):
        found = self.order.pop(entry_id, None)
        if found is not None:
            self.bytes -= found[2]

    def forget_dead(self):
        while self.dead:
            for entry_id in self.dead.pop():
                self.forget(entry_id)


_ledger = _Ledger()
_mark_used = _ledger.order.move_to_end  # bound once: get() runs on every kernel call


class SpecializationCache:
    """One kernel's cached values (compiled specializations, traced output specs) by key.

    A mapping whose entries count against the process-wide budget: ``get`` marks an entry as used,
    ``put`` adds one with its size in bytes and may drop least recently used entries of any kernel.
    """

    __slots__ = ("_entries", "_ids", "__weakref__")

    def __init__(self):
        self._entries: dict = {}  # key -> (value, ledger id)
        ids: set = set()
        self._ids = ids
        # A kernel that goes away takes its entries' bytes out of the budget.
        weakref.finalize(self, _forget_all, ids)

    def get(self, key, default=None):
        found = self._entries.get(key)
        if found is None:
            return default
        value, entry_id = found
        try:
            _mark_used(entry_id)
        except KeyError:  # dropped by another thread between the two look-ups
            pass
        return value

    def put(self, key, value, nbytes: int):
        with _ledger.lock:
            old = self._entries.pop(key, None)
            if old is not None:
                _ledger.forget(old[1])
                self._ids.discard(old[1])
            entry_id = _ledger.add(self, key, int(nbytes))
            self._ids.add(entry_id)
            self._entries[key] = (value, entry_id)
        return value

    def clear(self):
        with _ledger.lock:
            for entry_id in self._ids:
                _ledger.forget(entry_id)
            self._ids.clear()
            self._entries.clear()

    def __len__(self):
        return len(self._entries)

    def __contains__(self, key):
        return key in self._entries

    def keys(self):
        return self._entries.keys()

    def values(self):
        return [value for value, _entry_id in self._entries.values()]


def _forget_all(ids: set):
    _ledger.dead.append(ids)


def set_cache_limit(limit_bytes: int | str) -> int:
    """Sets the byte budget of the in-memory specialization caches of all kernels and returns the
    previous one. Least recently used entries are dropped at once if they hold more; ``0`` keeps
    only the specialization in use. Accepts what ``NIKKI_MEMORY_CACHE_BYTES`` accepts ("1G")."""
    if isinstance(limit_bytes, str):
        limit = _parse_bytes(limit_bytes, "set_cache_limit")
    elif isinstance(limit_bytes, numbers.Integral) and not isinstance(limit_bytes, bool) and limit_bytes >= 0:
        limit = int(limit_bytes)  # numpy integers too, as every other integer argument of nikki
    else:
        raise KernelError(f"set_cache_limit({limit_bytes!r}): the limit must be a non-negative number of bytes",
                          hint="pass e.g. nikki.set_cache_limit(1 << 30) or nikki.set_cache_limit('1G')")
    with _ledger.lock:
        previous = _ledger.current_limit()
        _ledger.limit = limit
        _ledger.shrink()
    return previous


def clear_cache() -> None:
    """Drops every compiled specialization held in memory by any kernel (the disk cache, which
    makes compiling them again cheap, is kept)."""
    with _ledger.lock:
        _ledger.forget_dead()
        while _ledger.order:
            _ledger.drop(next(iter(_ledger.order)))


def cache_info() -> dict:
    """``{"entries", "bytes", "limit", "evictions"}`` of the in-memory specialization caches:
    entries held by all kernels, their estimated bytes, the budget and how many were dropped."""
    with _ledger.lock:
        _ledger.forget_dead()
        return {"entries": len(_ledger.order), "bytes": _ledger.bytes, "limit": _ledger.current_limit(),
                "evictions": _ledger.evictions}
