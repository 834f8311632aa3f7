"""A vectorised hash map from int64 keys to dense row numbers (the embedding table's index).

Open addressing with linear probing over power-of-two slot arrays (``slot_keys`` int64 and
``slot_rows`` int64, row -1 marking an empty slot), kept at most half full.  The home slot is
Fibonacci hashing, the top bits of ``key * 0x9E3779B97F4A7C15`` (mod 2^64), which spreads
sequential keys and keys far beyond any dense range (2**62) alike.  Nothing is ever deleted,
so a probe that meets an empty slot proves the key absent.

Every operation works on a whole batch of keys at once.  A first round probes each key's home
slot with plain 1-D gathers; it settles nearly all keys.  The few left (clusters) are then
probed a window of ``_WINDOW`` consecutive slots at a time, so the number of rounds, each with
a fixed Python and numpy cost, stays at one or two instead of the longest probe sequence.
Inserting claims the first free slot of a key's probe sequence by scattering the new row
there and reading it back: where several new keys want one slot, the one whose row reads back
wins and the others try again.  Rows are handed out in insertion order, 0, 1, 2, ...
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tierserve.model.cpu_kernels import index_lookup
from tierserve.ps.partition import GOLDEN

_GOLDEN = np.uint64(GOLDEN)
_MIN_BITS = 10
_WINDOW = 8
_SLOTS_PER_KEY = 2  # load factor <= 1/2


class KeyIndex:
    """int64 key -> row in ``[0, len(self))``, rows given out in insertion order."""

    def __init__(self, xp: Any = np) -> None:
        self.xp = xp
        self._n = 0
        self._row_keys = xp.empty(1 << (_MIN_BITS - 1), dtype=xp.int64)
        self._window = xp.arange(_WINDOW, dtype=xp.int64)
        self._alloc(_MIN_BITS)

    def __len__(self) -> int:
        return self._n

    @property
    def keys(self) -> Any:
        """The keys by row: ``keys[r]`` owns row ``r`` (a view; do not modify)."""
        return self._row_keys[: self._n]

    def reserve(self, n: int) -> None:
        """Size the arrays for ``n`` keys now, so inserting up to ``n`` keys never grows them
        (growing keeps the old and the new arrays alive together for a moment)."""
        xp = self.xp
        bits = self._bits
        while _SLOTS_PER_KEY * n > (1 << bits):
            bits += 1
        if n > self._row_keys.shape[0]:
            grown = xp.empty(n, dtype=xp.int64)
            grown[: self._n] = self._row_keys[: self._n]
            self._row_keys = grown
        if bits > self._bits:
            self._alloc(bits)
            self._rebuild(self._row_keys[: self._n])

    def _alloc(self, bits: int) -> None:
        xp = self.xp
        self._bits = bits
        self._mask = (1 << bits) - 1
        # column 0 the key, column 1 its row: one cache line serves both
        self._slots = xp.zeros((1 << bits, 2), dtype=xp.int64)
        self._slots[:, 1] = -1

    def _home(self, keys: Any) -> Any:
        h = keys.view(self.xp.uint64) * _GOLDEN
        return (h >> np.uint64(64 - self._bits)).astype(self.xp.int64)

    def lookup(self, keys: Any) -> Any:
        """The row of each key (int64, one per key), -1 where a key is absent."""
        xp = self.xp
        keys = xp.ascontiguousarray(keys, dtype=xp.int64).reshape(-1)
        if self._n == 0 or keys.shape[0] == 0:
            return xp.full(keys.shape[0], -1, dtype=xp.int64)
        if xp is np:  # the compiled probe loop: one pass, home slots prefetched
            out = np.empty(keys.shape[0], dtype=np.int64)
            index_lookup(keys, self._home(keys), self._slots, out)
            return out
        pos = self._home(keys)
        pair = xp.take(self._slots, pos, axis=0)
        rows = pair[:, 1]
        same = pair[:, 0] == keys
        out = xp.where(same, rows, -1)  # an empty slot has row -1 whatever its key
        idx = xp.flatnonzero((rows >= 0) & ~same)
        pos = xp.take(pos, idx) + 1
        while idx.shape[0]:
            pending = xp.take(keys, idx)
            win = (pos[:, None] + self._window) & self._mask
            pairs = xp.take(self._slots, win, axis=0)
            wrows = pairs[:, :, 1]
            stop = (pairs[:, :, 0] == pending[:, None]) | (wrows < 0)
            first = stop.argmax(axis=1)
            hit_rows = xp.take_along_axis(wrows, first[:, None], axis=1)[:, 0]
            done = xp.take_along_axis(stop, first[:, None], axis=1)[:, 0]
            out[idx[done]] = hit_rows[done]  # -1 where the stop was an empty slot
            idx = idx[~done]
            pos = pos[~done] + _WINDOW
        return out

    def insert(self, new_keys: Any) -> Any:
        """Add keys that are absent and distinct; returns their rows (``len(self)`` onwards)."""
        xp = self.xp
        new_keys = xp.ascontiguousarray(new_keys, dtype=xp.int64).reshape(-1)
        m = new_keys.shape[0]
        first = self._n
        if m == 0:
            return xp.empty(0, dtype=xp.int64)
        total = first + m
        if total > self._row_keys.shape[0]:
            grown = xp.empty(max(total, 2 * self._row_keys.shape[0]), dtype=xp.int64)
            grown[:first] = self._row_keys[:first]
            self._row_keys = grown
        self._row_keys[first:total] = new_keys
        rows = xp.arange(first, total, dtype=xp.int64)
        if _SLOTS_PER_KEY * total > (1 << self._bits):
            bits = self._bits
            while _SLOTS_PER_KEY * total > (1 << bits):
                bits += 1
            self._alloc(bits)
            self._rebuild(self._row_keys[:total])
        else:
            self._place(new_keys, rows)
        self._n = total
        return rows

    def _rebuild(self, keys: Any) -> None:
        """Fill the empty slot array with ``keys`` (row = position) without claim rounds.

        Sorted by home slot, key ``i`` of a linear-probing table built in that order lands
        at ``pos_i = max(home_i, pos_(i-1) + 1)`` = ``i + max_(j<=i)(home_j - j)``, one
        cumulative maximum.  The few keys pushed past the last slot wrap around through
        :meth:`_place`.
        """
        xp = self.xp
        n = keys.shape[0]
        home = self._home(keys)
        if xp is not np:  # the cumulative maximum runs on the host (rare: growth only)
            home = home.get()
        # sort (home, index) pairs packed in one int64: a plain sort is several times faster
        # than argsort; home has at most 32 bits and n < 2^31
        packed = np.sort((home << 31) | np.arange(n, dtype=np.int64))
        order = packed & ((1 << 31) - 1)
        steps = np.arange(n, dtype=np.int64)
        pos = steps + np.maximum.accumulate((packed >> 31) - steps)
        if xp is not np:
            order, pos = xp.asarray(order), xp.asarray(pos)
        fits = pos <= self._mask
        placed = order[fits]
        self._slots[pos[fits], 0] = keys[placed]
        self._slots[pos[fits], 1] = placed
        spill = order[~fits]
        if spill.shape[0]:
            self._place(keys[spill], spill)

    def _place(self, keys: Any, rows: Any) -> None:
        xp = self.xp
        pos = self._home(keys)
        while keys.shape[0]:
            win = (pos[:, None] + self._window) & self._mask
            # flat index of the row column: a take from the strided view would copy it whole
            free = xp.take(self._slots.reshape(-1), 2 * win + 1) < 0
            first = free.argmax(axis=1)
            has = xp.take_along_axis(free, first[:, None], axis=1)[:, 0]
            slot = xp.take_along_axis(win, first[:, None], axis=1)[:, 0]
            cand = xp.flatnonzero(has)
            slot, want = slot[cand], rows[cand]
            self._slots[slot, 1] = want
            won = self._slots[slot, 1] == want
            self._slots[slot[won], 0] = keys[cand[won]]
            left = xp.ones(keys.shape[0], dtype=bool)
            left[cand[won]] = False
            # losers of a claim retry from the slot they lost; windows with no free slot move on
            pos = xp.where(has, pos + first, pos + _WINDOW)
            keys, rows, pos = keys[left], rows[left], pos[left]

    def lookup_or_insert(self, keys: Any) -> tuple[Any, Any, Any]:
        """Rows of ``keys``, inserting the absent ones in first-seen order.

        Returns ``(rows, new_keys, first_positions)``: the keys inserted, in insertion order,
        and the position in ``keys`` where each first occurred.  Callers that must bound the
        table's size use :meth:`lookup`, :meth:`absent` and :meth:`insert` instead.
        """
        xp = self.xp
        keys = xp.ascontiguousarray(keys, dtype=xp.int64).reshape(-1)
        rows = self.lookup(keys)
        new_keys, first_pos, where, inverse = self.absent(keys, rows)
        if new_keys.shape[0]:
            new_rows = self.insert(new_keys)
            rows[where] = new_rows[inverse]
        return rows, new_keys, first_pos

    def absent(self, keys: Any, rows: Any) -> tuple[Any, Any, Any, Any]:
        """The distinct keys that :meth:`lookup` did not find (``rows < 0``), first-seen order.

        Returns ``(new_keys, first_positions, missing_positions, inverse)`` with
        ``keys[missing_positions] == new_keys[inverse]`` and
        ``keys[first_positions] == new_keys``.
        """
        xp = self.xp
        where = xp.flatnonzero(rows < 0)
        if where.shape[0] == 0:
            empty = xp.empty(0, dtype=xp.int64)
            return empty, empty, where, empty
        missing = keys[where]
        uniq, first, inv = xp.unique(missing, return_index=True, return_inverse=True)
        order = xp.argsort(first)  # first-seen order
        rank = xp.empty_like(order)
        rank[order] = xp.arange(order.shape[0], dtype=order.dtype)
        return uniq[order], where[first[order]], where, rank[inv.reshape(-1)]
