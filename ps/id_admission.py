"""Admission of new ids by online updates: a count-min sketch of the updates of unstored ids.

In online learning every new id an update carries would become a row.  A table's
``min_update_count`` (``ps.json``) holds back the updates of an id that no tier stores yet
until it has seen that many of them: :class:`UpdateAdmission` counts them in a
:class:`CountMinSketch` (bounded memory, whatever the number of ids) and admits an update of a
new id once its count, this update included, reaches the setting.  Updates of stored ids
always apply.  Until it is admitted a held-back id reads as the table's default vector, as an
unknown id does.

The sketch never under-counts.  It over-counts an id only when every one of its ``depth``
rows has a collision: with ``N`` updates counted (since the last halving) in rows of ``width``
counters, one row over-counts by one or more with probability at most ``N / width``
(Markov), all ``depth`` rows with at most ``(N / width) ** depth``.  The counters are halved
whenever ``N`` reaches ``width / 4`` (as TinyLFU ages its sketch), so that probability stays
under ``4 ** -depth`` (1/256 with the default depth 4) on an endless stream, and an id must
collect its updates within roughly the last ``width / 4`` updates of new ids to be admitted.
"""

from __future__ import annotations

import threading

import numpy as np

#: Counters per sketch row by default: 2**20 (4 rows of uint32: 16 MiB per table that has a
#: ``min_update_count`` above 1), so the counts age over windows of 262,144 updates of new ids.
DEFAULT_SKETCH_WIDTH = 2**20
SKETCH_DEPTH = 4
# Odd 64-bit multipliers of the rows' multiply-shift hashes (fixed: counts are reproducible).
_MULTIPLIERS = np.array(
    [0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0xD6E8FEB86659FD93,
     0xFF51AFD7ED558CCD, 0xC4CEB9FE1A85EC53, 0x94D049BB133111EB, 0xBF58476D1CE4E5B9],
    dtype=np.uint64,
)  # fmt: skip


class CountMinSketch:
    """Approximate counts of int64 ids in ``depth`` rows of ``width`` uint32 counters.

    ``width`` is rounded up to a power of two.  Counts only grow until :meth:`halve`.
    """

    def __init__(self, width: int = DEFAULT_SKETCH_WIDTH, depth: int = SKETCH_DEPTH) -> None:
        if width < 1 or not 1 <= depth <= len(_MULTIPLIERS):
            raise ValueError(f"sketch width must be >= 1 and depth 1..{len(_MULTIPLIERS)}")
        self.bits = max(int(width - 1).bit_length(), 1)
        self.width = 1 << self.bits
        self.depth = depth
        self.counters = np.zeros((depth, self.width), dtype=np.uint32)
        self.counted = 0  # ids added since the last halving

    def _columns(self, keys: np.ndarray) -> np.ndarray:
        """``[depth, n]`` counter columns of ``keys``: a multiply-shift hash per row over the
        keys mixed once (so that ids differing in their high bits spread too)."""
        k = np.asarray(keys, dtype=np.int64).reshape(-1).view(np.uint64)
        with np.errstate(over="ignore"):
            k = k ^ (k >> np.uint64(31))
            k = k * np.uint64(0x7FB5D329728EA185)
            k = k ^ (k >> np.uint64(27))
            h = k[None, :] * _MULTIPLIERS[: self.depth, None]
        return (h >> np.uint64(64 - self.bits)).astype(np.intp)

    def estimate(self, keys) -> np.ndarray:
        """The counts of ``keys`` (int64 ``[n]``): never below the true count."""
        cols = self._columns(keys)
        rows = np.arange(self.depth)[:, None]
        return self.counters[rows, cols].min(axis=0).astype(np.int64)

    def add(self, keys) -> None:
        """Count one occurrence of each entry of ``keys`` (repeated entries count each)."""
        cols = self._columns(keys)
        for r in range(self.depth):
            np.add.at(self.counters[r], cols[r], 1)
        self.counted += cols.shape[1]

    def halve(self) -> None:
        """Halve every counter (rounding down): old counts fade, over-counts stay bounded."""
        self.counters >>= 1
        self.counted //= 2


class UpdateAdmission:
    """The admission rule of one table: which updates of unstored ids may apply.

    :meth:`admit` decides on a batch; :meth:`record` counts the held-back updates of a batch
    once its admitted ones were written (a write that fails and is retried counts once).
    """

    def __init__(self, min_update_count: int, width: int = DEFAULT_SKETCH_WIDTH) -> None:
        self.min_update_count = int(min_update_count)
        self.sketch = CountMinSketch(width)
        self._lock = threading.Lock()

    def admit(self, keys: np.ndarray, stored: np.ndarray) -> np.ndarray:
        """A bool mask over ``keys``: stored ids, and new ids whose count with this batch's
        updates of them reaches ``min_update_count`` (all of an admitted id's entries: the
        tiers keep its last one)."""
        admit = stored.copy()
        new = np.flatnonzero(~stored)
        if new.size:
            uniq, inverse, in_batch = np.unique(keys[new], return_inverse=True,
                                                return_counts=True)  # fmt: skip
            with self._lock:
                seen = self.sketch.estimate(uniq)
            admit[new] = (seen + in_batch)[inverse] >= self.min_update_count
        return admit

    def record(self, keys: np.ndarray, held: np.ndarray) -> None:
        """Count the held-back updates ``keys[held]``; halve the sketch when it is due."""
        if not held.any():
            return
        with self._lock:
            self.sketch.add(keys[held])
            if self.sketch.counted >= self.sketch.width // 4:
                self.sketch.halve()
