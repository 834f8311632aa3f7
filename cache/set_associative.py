"""A fixed-capacity, set-associative store of embeddings: the dynamic cache's table.

Layout (after HugeCTR's gpu_cache).  The table has ``num_sets`` sets of ``ways`` slots;
capacity is ``num_sets * ways`` and never grows.  Slot ``set * ways + way`` is described by
three ``xp`` arrays:

- ``keys[num_sets, ways]`` int64: one row per set, so one gather of a 16-byte row (2 ways)
  tells whether and where a key is cached; empty slots hold ``EMPTY`` (``-2**63``, a key
  that is never cached);
- ``values[capacity, dim]`` float32: the embeddings;
- ``ticks[capacity]`` uint32: the batch number that last used the slot, compared as an age
  ``(now - tick) mod 2**32`` so the counter may wrap.

A key's set is :func:`tierserve.cache.hashing.set_of`.  A lookup gathers the key's row of
``keys``, compares all ways (one vectorised pass per way), gathers the embedding and stamps
the slot's tick.  Inserting fills, per set, the empty ways first and then evicts the oldest
ones; a slot used by the current batch is never evicted: LRU at batch granularity.  To keep
lookups cheap, batches of more than ``STAMP_ALL`` keys stamp only the hits at every
``STAMP_STRIDE``-th position (the phase rotates with the batch number): a key hit several
times in a batch, or in several batches, is stamped almost surely, and a lukewarm key a few
batches late.  The CUDA kernel stamps every hit.

On numpy the work is done by the numba kernels of :mod:`tierserve.cache.cpu_kernels`
(software-pipelined loops, one pass per step); on cupy by the array passes written against
``xp`` below (``*_xp`` methods), which the tests also run on numpy as the kernels' reference,
or, where the cache sets :attr:`kernels`, by the CUDA kernels (lookup in the cache, insert
here; same results as the numpy kernels, key by key).

This class does no locking; :class:`~tierserve.cache.embedding_cache.EmbeddingCache`
serialises writers and validates readers with a sequence number.
"""

from __future__ import annotations

import contextlib

import numpy as np

from tierserve.ps.aligned import cache_aligned

from .hashing import set_of
from .slots import EMPTY, STAMP_ALL, STAMP_STRIDE

_EMPTY = np.int64(EMPTY)
_NONE = np.empty(0, dtype=np.int64)  # "no room": the lookup kernel skips what it would fill
_AGE_EMPTY = np.int64(2**32)  # older than any real age: empty slots are taken first


def unlogged(slots) -> contextlib.AbstractContextManager:
    """The default ``changing`` of the write methods: no sequence number, no log."""
    return contextlib.nullcontext()


def _zeros(xp, shape: tuple, dtype):
    """Zeros, starting on a cache line (cupy's allocations are aligned already)."""
    if xp is not np:
        return xp.zeros(shape, dtype=dtype)
    return cache_aligned(shape, dtype, zeros=True)


class SetAssociativeTable:
    """``capacity // ways * ways`` embeddings of length ``dim`` (see the module doc).

    ``xp`` is numpy or cupy; every array this class returns belongs to it.  Keys passed in
    must be contiguous 1-D int64 ``xp`` arrays, values float32 ``[n, dim]`` ``xp`` arrays.
    """

    def __init__(self, capacity: int, dim: int, ways: int = 2, xp=np) -> None:
        if capacity <= 0:
            raise ValueError(f"capacity must be positive, got {capacity}")
        if dim <= 0:
            raise ValueError(f"dim must be positive, got {dim}")
        if ways <= 0:
            raise ValueError(f"ways must be positive, got {ways}")
        ways = min(ways, capacity)
        self.xp = xp
        self.dim = int(dim)
        self.ways = int(ways)
        self.num_sets = capacity // ways
        self.capacity = self.num_sets * self.ways
        self.keys = _zeros(xp, (self.num_sets, self.ways), np.int64)
        self.keys[...] = _EMPTY
        self.ticks = _zeros(xp, (self.capacity,), np.uint32)
        self.values = _zeros(xp, (self.capacity, self.dim), np.float32)
        self._flat = self.keys.reshape(-1)
        self.size = 0
        #: on cupy, :class:`~tierserve.cache.kernels.CacheKernels` to insert with (one launch
        #: instead of the ``xp`` passes); ``None``: the ``xp`` passes
        self.kernels = None
        self._cpu = None
        if xp is np:
            from . import cpu_kernels

            cpu_kernels.warm_up()
            self._cpu = cpu_kernels

    @property
    def nbytes(self) -> int:
        return int(self.keys.nbytes + self.ticks.nbytes + self.values.nbytes)

    # --- reads ------------------------------------------------------------------------------

    def probe(self, keys):
        """``(slots, hit)``: each key's slot and whether it is cached (``slots`` is
        meaningless where ``hit`` is False)."""
        if self._cpu is None:
            return self.probe_xp(keys)
        slots = np.empty(keys.size, dtype=np.int64)
        hit = np.empty(keys.size, dtype=bool)
        self._cpu.probe(keys, self.keys, slots, hit)
        return slots, hit

    def probe_xp(self, keys):
        """:meth:`probe` in array passes (the cupy path)."""
        xp = self.xp
        sets = set_of(keys, self.num_sets)
        rows = xp.take(self.keys, sets, axis=0)
        hit = rows[:, 0] == keys
        slots = sets * self.ways if self.ways > 1 else sets
        for w in range(1, self.ways):
            match = rows[:, w] == keys
            hit |= match
            slots += match if w == 1 else match.view(np.uint8) * np.uint8(w)
        if keys.size and bool(keys.min() == _EMPTY):
            hit &= keys != _EMPTY  # the empty marker matches empty slots: never a hit
        return slots, hit

    def lookup(self, keys, tick: int | None = None, slots=None, misses=None, codec=None):
        """``(embeddings, hit, hits)``: each key's cached vector (garbage where ``hit`` is
        False) and the number of hits.  With ``tick`` (the batch number), hit slots are
        stamped with it, sampled in large batches (see the module doc).  On numpy, int64
        arrays of ``len(keys)`` receive the slot each hit was read from (``slots``) and the
        positions of the misses (``misses[:len(keys) - hits]``).  With ``codec`` (a
        :class:`~tierserve.ps.row_codec.RowCodec` of the compact rows this table holds) the
        embeddings come decoded, ``[len(keys), codec.dim]`` float32."""
        if self._cpu is None:
            out, hit, hits = self.lookup_xp(keys, tick)
            return (out if codec is None else codec.decode(out, self.xp)), hit, hits
        width, layout = (self.dim, 0) if codec is None else (codec.dim, codec.layout)
        out = np.empty((keys.size, width), dtype=np.float32)
        hit = np.empty(keys.size, dtype=bool)
        if slots is None:
            slots = np.empty(keys.size, dtype=np.int64)
        hits = self._cpu.lookup(keys, self.keys, self.ticks, self.values, out, hit, slots,
                                _NONE if misses is None else misses,
                                -1 if tick is None else int(tick), layout)
        return out, hit, int(hits)

    def lookup_xp(self, keys, tick: int | None = None):
        """:meth:`lookup` in array passes (the cupy path; misses gather some slot's row)."""
        xp = self.xp
        slots, hit = self.probe_xp(keys)
        embeddings = xp.take(self.values, slots, axis=0)
        hits = int(xp.count_nonzero(hit))
        if tick is not None and hits:
            if keys.size > STAMP_ALL:  # the hits among every STAMP_STRIDE-th position
                every = slice(tick % STAMP_STRIDE, None, STAMP_STRIDE)
                slots, hit = slots[every], hit[every]
            self.ticks[slots if bool(hit.all()) else slots[hit]] = np.uint32(tick & 0xFFFFFFFF)
        return embeddings, hit, hits

    def cached_keys(self):
        """All keys held now (an ``xp`` int64 array, in slot order)."""
        return self._flat[self._flat != _EMPTY]

    # --- writes (the caller holds the writer lock) ------------------------------------------
    #
    # ``changing(slots)`` is the caller's context manager around the change of the table's
    # ``slots`` (on numpy: an int64 array; ``None``: any slot); the cache bumps its sequence
    # number there and logs the slots for its readers.  Default: nothing.

    def clear(self, changing=unlogged) -> None:
        """Drop every embedding."""
        with changing(None):
            self.keys[...] = _EMPTY
        self.size = 0

    def overwrite(self, keys, values, changing=unlogged) -> int:
        """Replace the vectors of those ``keys`` that are cached; return how many were."""
        slots, hit = self.probe(keys)
        idx = self.xp.flatnonzero(hit)
        if idx.size:
            at = slots[idx]
            with changing(at if self._cpu is not None else None):
                self.values[at] = values[idx]
        return int(idx.size)

    def invalidate(self, keys, changing=unlogged) -> int:
        """Drop those ``keys`` that are cached (give unique keys); return how many were."""
        slots, hit = self.probe(keys)
        idx = self.xp.flatnonzero(hit)
        if idx.size:
            at = slots[idx]
            with changing(at if self._cpu is not None else None):
                self._flat[at] = _EMPTY
            self.size -= int(idx.size)
        return int(idx.size)

    def insert(self, keys, values, tick: int, changing=unlogged) -> tuple[int, int]:
        """Insert those of the unique ``keys`` that are not cached, with their ``values``,
        stamped ``tick``; as :meth:`place` otherwise.  Returns ``(inserted, evicted)``."""
        if self._cpu is None:
            with changing(None):
                if self.kernels is None:
                    return self.insert_xp(keys, values, tick)
                _, inserted, evicted = self.kernels.insert(self, keys, values, tick)
            self.size += inserted - evicted
            return inserted, evicted
        slots = np.empty(keys.size, dtype=np.int64)
        evicted = int(self._cpu.plan_insert(keys, self.keys, self.ticks, int(tick), slots))
        with changing(slots[slots >= 0]):
            inserted = int(self._cpu.apply_insert(
                keys, np.ascontiguousarray(values, dtype=np.float32), slots, self.keys,
                self.values,
            ))
        self.size += inserted - evicted
        return inserted, evicted

    def insert_xp(self, keys, values, tick: int) -> tuple[int, int]:
        """:meth:`insert` in array passes (the cupy path)."""
        _, cached = self.probe_xp(keys)
        absent = self.xp.flatnonzero(~cached)
        if absent.size != keys.size:
            keys, values = keys[absent], values[absent]
        return self.place_xp(keys, values, tick)

    def place(self, keys, values, tick: int) -> tuple[int, int]:
        """Insert unique, uncached ``keys`` with ``values``, stamped ``tick``.

        Per set the empty ways fill first, then the oldest ways are evicted; a way stamped
        ``tick`` (used by the current batch) is never evicted, so keys beyond what their set
        can take now are not inserted: earlier keys in ``keys`` win.  Returns ``(inserted,
        evicted)``.  (On numpy, keys already cached or equal to ``EMPTY`` are skipped.)
        """
        if self._cpu is None:
            return self.place_xp(keys, values, tick)
        return self.insert(keys, values, tick)

    def place_xp(self, keys, values, tick: int) -> tuple[int, int]:
        """:meth:`place` in array passes (the cupy path; the sort by set is stable)."""
        xp = self.xp
        n = int(keys.size)
        if n == 0:
            return 0, 0
        now = np.uint32(tick & 0xFFFFFFFF)
        sets = set_of(keys, self.num_sets)
        order = xp.argsort(sets, kind="stable") if xp is np else xp.argsort(sets)
        s_sorted = sets[order]
        rank = xp.arange(n) - xp.searchsorted(s_sorted, s_sorted, side="left")
        keep = rank < self.ways
        order, s_sorted, rank = order[keep], s_sorted[keep], rank[keep]
        set_slots = s_sorted[:, None] * self.ways + xp.arange(self.ways)  # [m, ways]
        age = (now - self.ticks[set_slots]).astype(np.int64)  # uint32 arithmetic wraps
        age[xp.take(self.keys, s_sorted, axis=0) == _EMPTY] = _AGE_EMPTY
        m = xp.arange(int(order.size))
        if self.ways == 2:  # no per-row argsort: the older way first, then the other
            way = (age[:, 1] > age[:, 0]).astype(np.int64)
            way ^= rank
        else:
            way = xp.argsort(-age, axis=1, kind="stable")[m, rank]  # oldest (then lowest) first
        ok = age[m, way] > 0
        order, slots = order[ok], set_slots[m, way][ok]
        evicted = int(xp.count_nonzero(self._flat[slots] != _EMPTY))
        self._flat[slots] = keys[order]
        self.ticks[slots] = now
        self.values[slots] = values[order]
        inserted = int(order.size)
        self.size += inserted - evicted
        return inserted, evicted
