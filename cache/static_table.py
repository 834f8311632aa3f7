"""The static cache's table: a whole embedding table, sorted by key, read-only in structure.

``embedding_cache_type: "static"`` holds every row of a table that fits; keys are found by
binary search (``xp.searchsorted``) instead of hashing, so nothing is ever evicted.  Updates
overwrite rows in place; a row can be marked invalid (it then misses and is served by the
parameter server) but no key is ever added.
"""

from __future__ import annotations

import numpy as np

from tierserve.core.errors import CapacityExceededError

from .set_associative import unlogged


class StaticTable:
    """All ``keys`` of a table with their ``embeddings``, on ``xp`` (numpy or cupy).

    Raises :class:`~tierserve.core.errors.CapacityExceededError` when the table has more
    rows than ``capacity``.  Repeated keys keep their last vector.
    """

    def __init__(self, keys: np.ndarray, embeddings: np.ndarray, capacity: int, xp=np,
                 what: str = "table") -> None:
        keys = np.asarray(keys, dtype=np.int64).reshape(-1)
        embeddings = np.asarray(embeddings, dtype=np.float32)
        if embeddings.ndim != 2 or embeddings.shape[0] != keys.size:
            raise ValueError(f"embeddings must be [{keys.size}, dim], got {embeddings.shape}")
        if keys.size > capacity:
            raise CapacityExceededError(
                f"a static embedding cache holds a whole table, but {what} has {keys.size} rows "
                f"and the cache has room for {capacity}; set gpucacheper (the cache size "
                f"percentage) to 1.0 or use embedding_cache_type 'dynamic'"
            )
        # Stable sort of the reversed arrays, then the first of each run: the last repeat wins.
        rev = keys[::-1]
        order = np.argsort(rev, kind="stable")
        sk = rev[order]
        first = np.ones(sk.size, dtype=bool)
        first[1:] = sk[1:] != sk[:-1]
        self.xp = xp
        self.dim = int(embeddings.shape[1])
        self.capacity = int(capacity)
        self.ways = 1
        self._keys = xp.asarray(sk[first])
        self.values = xp.asarray(np.ascontiguousarray(embeddings[::-1][order[first]]))
        self.valid = xp.ones(int(self._keys.size), dtype=bool)
        self.size = int(self._keys.size)

    @property
    def nbytes(self) -> int:
        return int(self._keys.nbytes + self.values.nbytes + self.valid.nbytes)

    def _find(self, keys):
        n = int(self._keys.size)
        if n == 0:
            zeros = self.xp.zeros(keys.size, dtype=np.int64)
            return zeros, self.xp.zeros(keys.size, dtype=bool)
        pos = self.xp.searchsorted(self._keys, keys)
        self.xp.minimum(pos, n - 1, out=pos)
        hit = self.xp.take(self._keys, pos) == keys
        hit &= self.xp.take(self.valid, pos)
        return pos, hit

    def lookup(self, keys, tick: int | None = None):
        """``(embeddings, hit, hits)`` as :meth:`SetAssociativeTable.lookup`."""
        pos, hit = self._find(keys)
        if self.size == 0:
            return self.xp.zeros((keys.size, self.dim), dtype=np.float32), hit, 0
        return self.xp.take(self.values, pos, axis=0), hit, int(self.xp.count_nonzero(hit))

    def probe(self, keys):
        """``(positions, hit)`` as :meth:`SetAssociativeTable.probe`."""
        return self._find(keys)

    def cached_keys(self):
        """Every key of the table (valid or not): what a refresh re-pulls."""
        return self._keys

    # Writes: ``changing`` as for SetAssociativeTable (readers of this table always retry).

    def overwrite(self, keys, values, changing=unlogged) -> int:
        """Replace the vectors of those ``keys`` the table has (valid or not); mark them valid."""
        if self._keys.size == 0:
            return 0
        pos = self.xp.searchsorted(self._keys, keys)
        self.xp.minimum(pos, int(self._keys.size) - 1, out=pos)
        idx = self.xp.flatnonzero(self.xp.take(self._keys, pos) == keys)
        if idx.size:
            with changing(None):
                self.values[pos[idx]] = values[idx]
                self.valid[pos[idx]] = True
        return int(idx.size)

    def clear(self, changing=unlogged) -> None:
        """Mark every row invalid (each misses until overwritten)."""
        with changing(None):
            self.valid[...] = False

    def invalidate(self, keys, changing=unlogged) -> int:
        """Mark those ``keys`` invalid: they miss until overwritten again."""
        pos, hit = self._find(keys)
        idx = self.xp.flatnonzero(hit)
        if idx.size:
            with changing(None):
                self.valid[pos[idx]] = False
        return int(idx.size)
