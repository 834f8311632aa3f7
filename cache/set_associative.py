"""A fixed-capacity, set-associative store of embeddings: the dynamic cache's table.

Layout (after HugeCTR's gpu_cache).  The table has ``num_sets`` sets of ``ways`` slots;
capacity is ``num_sets * ways`` and never grows.  Two ``xp`` arrays hold it:

- ``meta[num_sets, 2 * ways]`` int64: per set, the ``ways`` keys followed by their
  ``ways`` last-access ticks, so one row (64 bytes at 4 ways) tells whether and where a key
  is cached and how recently each slot was used;
- ``values[capacity, dim]`` float32: slot ``set * ways + way`` holds that key's embedding.

Empty slots hold the key ``EMPTY`` (``-2**63``, never cacheable) and tick ``-1``.

A key's set is :func:`tierserve.cache.hashing.set_of`.  A lookup gathers the key's metadata
row and compares all ways (one vectorised pass per way).  Inserting fills, per set, the
empty ways first and then evicts the least recently used ones (ticks advance once per query
batch); a slot already used by the current batch is never evicted: LRU at batch granularity.

This class does no locking; :class:`~tierserve.cache.embedding_cache.EmbeddingCache`
serialises writers and validates readers with a sequence number.
"""

from __future__ import annotations

import numpy as np

from .hashing import set_of

EMPTY = -(2**63)
_EMPTY = np.int64(EMPTY)
NO_TICK = -1


class SetAssociativeTable:
    """``capacity // ways * ways`` embeddings of length ``dim`` (see the module doc).

    ``xp`` is numpy or cupy; every array this class returns belongs to it.  Keys passed in
    must be contiguous 1-D int64 ``xp`` arrays, values float32 ``[n, dim]`` ``xp`` arrays.
    """

    def __init__(self, capacity: int, dim: int, ways: int = 4, xp=np) -> None:
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
        self.meta = xp.empty((self.num_sets, 2 * self.ways), dtype=np.int64)
        self.meta[:, : self.ways] = _EMPTY
        self.meta[:, self.ways :] = NO_TICK
        self.values = xp.zeros((self.capacity, self.dim), dtype=np.float32)
        self._flat = self.meta.reshape(-1)
        self.size = 0

    @property
    def keys(self):
        """``[num_sets, ways]`` view of the cached keys."""
        return self.meta[:, : self.ways]

    @property
    def ticks(self):
        """``[num_sets, ways]`` view of the slots' last-access ticks."""
        return self.meta[:, self.ways :]

    @property
    def nbytes(self) -> int:
        return int(self.meta.nbytes + self.values.nbytes)

    # --- reads ------------------------------------------------------------------------------

    def probe(self, keys):
        """``(slots, sets, way, hit)``: each key's slot, set and way (``None`` when the table
        has one way) and whether it is cached; ``slots`` and ``way`` are meaningless where
        ``hit`` is False."""
        xp = self.xp
        sets = set_of(keys, self.num_sets)
        rows = xp.take(self.meta, sets, axis=0)
        hit = rows[:, 0] == keys
        way = None
        for w in range(1, self.ways):
            match = rows[:, w] == keys
            hit |= match
            term = match.view(np.uint8)
            if w > 1:
                term = term * np.uint8(w)
            if way is None:
                way = term
            else:
                way += term
        slots = sets * self.ways if self.ways > 1 else sets
        if way is not None:
            slots += way
        if keys.size and bool(keys.min() == _EMPTY):
            hit &= keys != _EMPTY  # the empty marker matches empty slots: never a hit
        return slots, sets, way, hit

    def lookup(self, keys, tick: int | None = None):
        """``(embeddings, hit, hits)``: each key's cached vector (garbage where ``hit`` is
        False) and the number of hits.  With ``tick``, the hit slots are stamped with it."""
        xp = self.xp
        slots, sets, way, hit = self.probe(keys)
        embeddings = xp.take(self.values, slots, axis=0)
        hits = int(xp.count_nonzero(hit))
        if tick is not None and hits:
            at = sets * (2 * self.ways) + self.ways
            if way is not None:
                at += way
            if hits != keys.size:
                at = at[hit]
            self._flat[at] = tick
        return embeddings, hit, hits

    def cached_keys(self):
        """All keys held now (an ``xp`` int64 array, in slot order)."""
        flat = self.keys.reshape(-1)
        return flat[flat != _EMPTY]

    # --- writes (the caller holds the writer lock) ------------------------------------------

    def clear(self) -> None:
        """Drop every embedding."""
        self.meta[:, : self.ways] = _EMPTY
        self.meta[:, self.ways :] = NO_TICK
        self.size = 0

    def overwrite(self, keys, values) -> int:
        """Replace the vectors of those ``keys`` that are cached; return how many were."""
        slots, _, _, hit = self.probe(keys)
        idx = self.xp.flatnonzero(hit)
        if idx.size:
            self.values[slots[idx]] = values[idx]
        return int(idx.size)

    def invalidate(self, keys) -> int:
        """Drop those ``keys`` that are cached; return how many were."""
        slots, sets, way, hit = self.probe(keys)
        idx = self.xp.flatnonzero(hit)
        if idx.size:
            at = sets[idx] * (2 * self.ways)
            if way is not None:
                at += way[idx]
            self._flat[at] = _EMPTY
            self._flat[at + self.ways] = NO_TICK
            self.size -= int(idx.size)
        return int(idx.size)

    def place(self, keys, values, tick: int) -> tuple[int, int]:
        """Insert unique, uncached ``keys`` with ``values``, stamped ``tick``.

        Per set the empty ways fill first, then the least recently used ways are evicted; a
        way stamped ``tick`` or later (used by the current batch) is never evicted, so keys
        beyond what their set can take now are not inserted.  Returns ``(inserted, evicted)``.
        """
        xp = self.xp
        n = int(keys.size)
        if n == 0:
            return 0, 0
        sets = set_of(keys, self.num_sets)
        order = xp.argsort(sets, kind="stable") if xp is np else xp.argsort(sets)
        s_sorted = sets[order]
        rank = xp.arange(n) - xp.searchsorted(s_sorted, s_sorted, side="left")
        keep = rank < self.ways
        order, s_sorted, rank = order[keep], s_sorted[keep], rank[keep]
        set_ticks = xp.take(self.meta, s_sorted, axis=0)[:, self.ways :]
        victim_order = xp.argsort(set_ticks, axis=1)
        m = xp.arange(int(order.size))
        way = victim_order[m, rank]
        ok = set_ticks[m, way] < tick
        order, s_sorted, way = order[ok], s_sorted[ok], way[ok]
        at = s_sorted * (2 * self.ways) + way
        evicted = int(xp.count_nonzero(self._flat[at] != _EMPTY))
        self._flat[at] = keys[order]
        self._flat[at + self.ways] = tick
        self.values[s_sorted * self.ways + way] = values[order]
        inserted = int(order.size)
        self.size += inserted - evicted
        return inserted, evicted
