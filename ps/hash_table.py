"""A vectorised open-addressing hash table of embeddings, in numpy.

One :class:`HashTable` maps int64 keys to rows of a dense float32 ``[rows, dim]`` slab.  The
index is a linear-probing table of 16-byte slot records ``(key int64, row int32, stat
int32)``: one gather fetches a slot's key, its row and its access statistic together, and
the vectors stay contiguous so a lookup ends in a single ``np.take`` over the slab.

Probing runs in vectorised rounds.  Home slots are even, so the first round reads each
key's aligned pair of slots with one 32-byte gather; the few keys displaced further read
windows of the next eight slots.  The slot count is sized from a memory budget (index plus
vectors within about 1.45x the raw bytes of keys and vectors where the dim allows; load
0.25 to 0.6) and grows when the load passes 0.75.  A bulk load builds the index with one
sort: in home-slot order, linear probing is a running maximum.

Deleted slots become tombstones; bulk deletions (overflow eviction) and growth rebuild the
index and compact the slab.  Writers are serialised by a lock; readers take no lock: they
read one immutable reference to the current arrays, writers fill a row before publishing
its key, and any resize builds new arrays and swaps the reference.

The keys ``-2**63`` and ``-2**63 + 1`` mark empty and deleted slots and cannot be stored.
"""

from __future__ import annotations

import threading

import numpy as np

from .errors import InvalidInputError

#: The two keys that cannot be stored: slots keep ``key ^ -2**63``, so these two keys'
#: encodings are 0 (an empty slot: a fresh, calloc'ed table is all empty) and 1 (deleted).
EMPTY = np.int64(-(2**63))
TOMB = np.int64(-(2**63) + 1)
_SIGN = np.int64(-(2**63))
_FREE = 0
_GONE = 1


def _encode(keys: np.ndarray) -> np.ndarray:
    return np.bitwise_xor(keys, _SIGN)


def _live(stored: np.ndarray) -> np.ndarray:
    return stored.view(np.uint64) > np.uint64(_GONE)

# Slot hash: multiply, fold the high half down, multiply (constants of murmur3's fmix64).
# Distinct from the partition mixer, so keys of one partition still spread over its slots.
_C1 = np.uint64(0xFF51AFD7ED558CCD)
_C2 = np.uint64(0xC4CEB9FE1A85EC53)
_U32 = np.uint64(32)
_MAX_LOAD = 0.75
#: Index bytes per key allowed when sizing, as a share of the key's raw bytes (8 + 4 dim):
#: index + vectors stay within 1.45x the raw bytes where the dim allows it.
_INDEX_BUDGET = 1.45
_LOAD_RANGE = (0.25, 0.6)
_TICK_REBASE = 2**30
#: Slots past ``cap`` that probes may run into; a probe that would leave them grows the table.
_PAD = 2048


def home_slots(keys: np.ndarray, capacity: int) -> np.ndarray:
    """Each key's home slot in a table of ``capacity`` slots (int64 array).

    Home slots are even: a key's first two candidate slots are one aligned 32-byte pair,
    which one gather reads (most keys are settled by it).
    """
    h = np.multiply(keys.view(np.uint64), _C1)
    t = h >> _U32
    h ^= t
    h *= _C2
    h >>= _U32
    h *= np.uint64(capacity // 2)
    h >>= _U32
    h <<= np.uint64(1)
    return h.view(np.int64)


def _check_unique(keys: np.ndarray, homes: np.ndarray) -> None:
    """Raise :class:`_Repeated` if ``keys`` (sorted by ``homes``) repeat a key.

    Equal keys have equal homes, so only pairs within a run of one home need comparing:
    pairs ``d`` apart, for growing ``d``, among the (quickly fewer) runs that long.
    """
    cand = np.flatnonzero(homes[1:] == homes[:-1])
    d = 1
    while cand.size:
        if (keys.take(cand) == keys.take(cand + d)).any():
            raise _Repeated
        d += 1
        cand = cand[cand + d < keys.size]
        cand = cand[homes.take(cand) == homes.take(cand + d)]


class _Repeated(Exception):
    """A bulk build met a repeated key."""


class _Overfull(Exception):
    """A probe sequence reached the end of the padding: rebuild with more capacity."""


class _State:
    """The arrays of one table generation; replaced as a whole on resize."""

    __slots__ = ("cap", "tab", "pairs", "flat", "tab32", "values", "n_rows", "live", "used")

    def __init__(self, cap: int, dim: int, row_cap: int, values: np.ndarray | None = None):
        self.cap = cap
        self.tab = np.zeros((cap + _PAD, 2), dtype=np.int64)  # all slots free
        self.pairs = self.tab.reshape(-1, 4)  # aligned slot pairs
        self.flat = self.tab.reshape(-1)
        self.tab32 = self.flat.view(np.int32)  # per slot: key lo, key hi, row, stat
        self.values = np.empty((row_cap, dim), dtype=np.float32) if values is None else values
        self.n_rows = 0  # rows of the slab in use (live or dead)
        self.live = 0  # slots holding a key
        self.used = 0  # slots holding a key or a tombstone

    def find(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(slots, found, records)`` of ``keys``.

        ``records`` are the slots' ``[n, 4]`` int32 rows (key lo, key hi, row, stat).  One
        gather reads every key's home pair of slots; the keys displaced further by
        collisions (a few percent at the table's load) then read windows of eight slots.
        """
        slots = home_slots(keys, self.cap)
        pair = self.pairs.take(slots >> 1, axis=0)  # [n, 4]: key, row|stat of both slots
        kx = _encode(keys)
        second = pair[:, 2] == kx
        found = pair[:, 0] == kx
        found |= second
        both = pair.view(np.complex128)  # [n, 2]: one 16-byte record per slot
        rec = np.where(second, both[:, 1], both[:, 0]).view(np.int64).reshape(-1, 2)
        slots += second
        if not found.all():
            pending = ~found
            pending &= pair[:, 2] != _FREE  # both slots taken, by other keys: probe on
            pending &= pair[:, 0] != _FREE
            idx = np.flatnonzero(pending)
            if idx.size:
                self._probe(kx, slots, found, rec, idx)
        if keys.size and keys.min() <= TOMB:
            found &= keys > TOMB
        return slots, found, rec.view(np.int32)

    def _probe(self, kx, slots, found, rec, idx) -> None:
        """Resolve the displaced (encoded) keys ``idx`` pair by pair; fill their slots/records."""
        # The table's tail padding keeps every pair inside the array: no wrap-around.
        pair_at = (slots[idx] >> 1) + 1
        rec16 = rec.view(np.complex128).reshape(-1)
        last = self.pairs.shape[0]
        for _ in range(last):
            pair = self.pairs.take(pair_at, axis=0)
            mine = kx[idx]
            second = pair[:, 2] == mine
            hit = pair[:, 0] == mine
            hit |= second
            if hit.any():
                hi = idx[hit]
                slots[hi] = pair_at[hit] * 2 + second[hit]
                found[hi] = True
                both = pair[hit].view(np.complex128)
                rec16[hi] = np.where(second[hit], both[:, 1], both[:, 0])
            more = ~hit
            more &= pair[:, 2] != _FREE
            if not more.any():
                return
            idx = idx[more]
            pair_at = pair_at[more] + 1
            if pair_at.max() >= last:
                raise RuntimeError("hash table probe ran past the padding")
        raise RuntimeError("hash table probe did not terminate")

    def bulk_place(self, keys: np.ndarray, stat: np.ndarray | int) -> None:
        """Index ``keys`` (unique) as rows ``0..n-1`` of an empty table, in one pass.

        Sorting by home slot turns linear probing into a running maximum: the i-th key in
        home order goes to ``max(home_i, slot_(i-1) + 1)``.  Sorting packs (home, index)
        into one uint64, which numpy sorts with SIMD, far faster than an argsort.
        """
        n = keys.size
        if n == 0:
            return
        if n >= 1 << 32:
            raise ValueError("a partition holds at most 2**32 - 1 keys")
        packed = home_slots(keys, self.cap).view(np.uint64)
        packed <<= _U32
        packed |= np.arange(n, dtype=np.uint64)
        packed.sort()
        order = (packed & np.uint64(0xFFFFFFFF)).view(np.int64)
        packed >>= _U32
        sorted_keys = keys.take(order)
        _check_unique(sorted_keys, packed)
        ar = np.arange(n)
        slot = packed.view(np.int64)
        slot -= ar
        np.maximum.accumulate(slot, out=slot)
        slot += ar
        if slot[-1] >= self.tab.shape[0]:
            raise _Overfull
        # Assemble the records in slot order, then write them with one 16-byte scatter.
        rec = np.empty((n, 2), dtype=np.int64)
        np.bitwise_xor(sorted_keys, _SIGN, out=rec[:, 0])
        rec32 = rec.view(np.int32)
        rec32[:, 2] = order
        rec32[:, 3] = stat if np.ndim(stat) == 0 else np.asarray(stat).take(order)
        self.tab.view(np.complex128).reshape(-1).put(slot, rec.view(np.complex128).reshape(-1))
        self.live += n
        self.used += n

    def place(
        self,
        keys: np.ndarray,
        stat: np.ndarray | int,
        values: np.ndarray | None = None,
        rows: np.ndarray | None = None,
    ) -> np.ndarray:
        """Add ``keys`` that are not in the table; return the row of each.

        Either ``values`` (written to fresh rows) or ``rows`` (already filled) is given.
        Repeated keys share one row; with ``values`` the last occurrence's vector wins.
        """
        n = keys.size
        row_of = np.empty(n, dtype=np.int64)
        pos = np.arange(n)
        cand = home_slots(keys, self.cap)
        kx = _encode(keys)
        stat_arr = np.broadcast_to(np.asarray(stat, dtype=np.int32), (n,))
        repeated = False
        while pos.size:
            g = self.tab.take(cand, axis=0)
            gk = g[:, 0]
            same = gk == kx[pos]
            if same.any():
                repeated = True
                row_of[pos[same]] = g[same].view(np.int32)[:, 2]
            empty = gk == _FREE
            ce = np.flatnonzero(empty)
            keep_c = np.zeros(0, dtype=np.int64)
            keep_p = keep_c
            if ce.size:
                c_slots = cand[ce]
                c_pos = pos[ce]
                row_idx = c_slots * 4 + 2
                # Claim: write our position into the empty slots' row field, read it back;
                # one writer per slot wins, the others try the same slot again next round.
                self.tab32[row_idx] = c_pos
                won = self.tab32.take(row_idx) == c_pos
                w_slots, w_pos = c_slots[won], c_pos[won]
                if rows is None:
                    w_rows = np.arange(self.n_rows, self.n_rows + w_pos.size)
                    self.values[w_rows] = values[w_pos]
                    self.n_rows += w_pos.size
                else:
                    w_rows = rows[w_pos]
                self.tab32[w_slots * 4 + 2] = w_rows
                self.tab32[w_slots * 4 + 3] = stat_arr[w_pos]
                self.flat[w_slots * 2] = kx[w_pos]  # publish the key last
                row_of[w_pos] = w_rows
                self.live += w_pos.size
                self.used += w_pos.size
                keep_c, keep_p = c_slots[~won], c_pos[~won]
            step = ~(same | empty)
            adv_c = cand[step] + 1
            if adv_c.size and adv_c.max() >= self.cap + _PAD - 16:
                raise _Overfull
            cand = np.concatenate([keep_c, adv_c])
            pos = np.concatenate([keep_p, pos[step]])
        if repeated and values is not None:
            self.values[row_of] = values  # in order, so the last repeat wins
        return row_of


class HashTable:
    """One partition's embeddings: int64 key -> float32 vector of length ``dim``.

    ``track`` selects the per-slot statistic kept for eviction: ``"recency"`` (last access
    tick), ``"frequency"`` (access count) or ``None``.
    """

    def __init__(self, dim: int, track: str | None = None, capacity: int = 0) -> None:
        if dim <= 0:
            raise InvalidInputError(f"embedding dim must be positive, got {dim}")
        if track not in (None, "recency", "frequency"):
            raise ValueError(f"unknown statistic {track!r}")
        self.dim = int(dim)
        self.track = track
        self._tick = 1
        self._lock = threading.Lock()
        self._state = _State(self._cap_for(capacity), self.dim, capacity)

    # --- reads (no lock) -------------------------------------------------------------------

    def __len__(self) -> int:
        return self._state.live

    @property
    def nbytes(self) -> int:
        """Bytes held by the index and the slab."""
        st = self._state
        return st.tab.nbytes + st.values.nbytes

    def lookup(self, keys: np.ndarray, out: np.ndarray | None = None):
        """``(embeddings [n, dim], found [n])`` for int64 ``keys``.

        Rows of keys not found hold arbitrary values.  ``out`` may receive the embeddings.
        """
        st = self._state
        slots, found, rec = st.find(keys)
        rows = rec[:, 2]
        all_found = found.all()
        if not all_found:
            rows = rows.copy()
            rows[~found] = 0
        if st.n_rows == 0:
            emb = out if out is not None else np.zeros((keys.size, self.dim), np.float32)
            return emb, found
        emb = st.values.take(rows, axis=0, out=out)
        if self.track is not None:
            hit = slots if all_found else slots[found]
            idx = hit * 4 + 3
            if self.track == "recency":
                self._tick += 1
                st.tab32.put(idx, self._tick)
                if self._tick >= _TICK_REBASE:
                    self._rebase()
            else:
                counts = rec[:, 3]
                st.tab32.put(idx, (counts if all_found else counts[found]) + 1)
        return emb, found

    def contains(self, keys: np.ndarray) -> np.ndarray:
        """A bool mask of the keys present."""
        return self._state.find(keys)[1]

    def keys(self) -> np.ndarray:
        """All keys, in slot order (a copy)."""
        k = self._state.tab[:, 0]
        return _encode(k[_live(k)])

    # --- writes ----------------------------------------------------------------------------

    def insert(self, keys: np.ndarray, embeddings: np.ndarray) -> int:
        """Insert or overwrite; returns how many keys were new."""
        if keys.size == 0:
            return 0
        if keys.min() <= TOMB:
            raise InvalidInputError(f"keys {int(EMPTY)} and {int(TOMB)} are reserved")
        with self._lock:
            try:
                return self._insert(keys, embeddings)
            except _Overfull:
                self._rebuild(2 * (self._state.live + keys.size), spare_rows=keys.size)
                return self._insert(keys, embeddings)

    def _insert(self, keys: np.ndarray, embeddings: np.ndarray) -> int:
        st = self._state
        slots, found, rec = st.find(keys)
        self._tick += 1
        stat = self._tick if self.track == "recency" else (1 if self.track else 0)
        if found.all():
            st.values[rec[:, 2]] = embeddings
            if self.track == "recency":
                st.tab32.put(slots * 4 + 3, stat)
            return 0
        fi = np.flatnonzero(found)
        if fi.size:
            st.values[rec[fi, 2]] = embeddings[fi]
            if self.track == "recency":
                st.tab32.put(slots[fi] * 4 + 3, stat)
        ni = np.flatnonzero(~found)
        self._reserve(ni.size)  # may move everything (with the updates above) to new arrays
        st = self._state
        before = st.live
        st.place(np.ascontiguousarray(keys[ni]), stat, values=embeddings[ni])
        return st.live - before

    def load(self, keys: np.ndarray, embeddings: np.ndarray, copy: bool = True) -> None:
        """Replace the whole content with ``keys`` and ``embeddings`` in one pass.

        The vectors are copied once into a slab of exactly their size (``copy=False`` adopts
        a contiguous float32 array instead).  Keys should be unique; of repeated keys one
        row is kept.
        """
        if keys.size and keys.min() <= TOMB:
            raise InvalidInputError(f"keys {int(EMPTY)} and {int(TOMB)} are reserved")
        keys = np.ascontiguousarray(keys, dtype=np.int64)
        n = keys.size
        if copy or embeddings.dtype != np.float32 or not embeddings.flags.c_contiguous:
            values = np.empty((n, self.dim), dtype=np.float32)
            values[...] = embeddings
        else:
            values = embeddings
        with self._lock:
            self._tick += 1
            stat = self._tick if self.track == "recency" else (1 if self.track else 0)
            try:
                self._state = self._build(keys, stat, values, self._cap_for(n))
            except _Repeated:  # keep each key's last vector
                _, last = np.unique(keys[::-1], return_index=True)
                keep = np.sort(n - 1 - last)
                values = np.ascontiguousarray(values[keep])
                self._state = self._build(keys[keep], stat, values, self._cap_for(keep.size))

    def remove(self, keys: np.ndarray) -> int:
        """Delete ``keys``; returns how many were present."""
        if keys.size == 0:
            return 0
        with self._lock:
            st = self._state
            slots, found, _ = st.find(keys)
            gone = np.unique(slots[found])
            st.flat[gone * 2] = _GONE
            st.live -= gone.size
            if st.n_rows - st.live > max(st.live // 4, 1024):
                self._rebuild(st.live)
            return int(gone.size)

    def evict_to(self, target: int, policy, rng: np.random.Generator) -> int:
        """Evict by ``policy`` until at most ``target`` keys remain; returns how many went."""
        with self._lock:
            st = self._state
            excess = st.live - int(target)
            if excess <= 0:
                return 0
            live = np.flatnonzero(_live(st.tab[:, 0]))
            stats = st.tab32.take(live * 4 + 3) if self.track else None
            victims = live[policy.select(stats, live.size, excess, rng)]
            st.flat[victims * 2] = _GONE
            st.live -= victims.size
            self._rebuild(st.live)
            return int(victims.size)

    def clear(self) -> None:
        """Drop every key and free the slab."""
        with self._lock:
            self._state = _State(self._cap_for(0), self.dim, 0)

    # --- internals -------------------------------------------------------------------------

    def _cap_for(self, n: int) -> int:
        """Slots for ``n`` keys: as sparse as the memory budget allows (fewer probes)."""
        budget = _INDEX_BUDGET * (8 + 4 * self.dim) - 4 * self.dim  # bytes of index per key
        load = min(max(16 / max(budget, 1e-9), _LOAD_RANGE[0]), _LOAD_RANGE[1])
        return max(16, int(n / load) // 2 * 2 + 2)

    def _reserve(self, incoming: int) -> None:
        st = self._state
        if st.used + incoming > _MAX_LOAD * st.cap or st.n_rows + incoming > st.values.shape[0]:
            self._rebuild(st.live + incoming, spare_rows=incoming)

    def _rebuild(self, expected: int, spare_rows: int = 0) -> None:
        """Rehash the live keys into fresh arrays sized for ``expected`` keys; compact rows."""
        old = self._state
        live = np.flatnonzero(_live(old.tab[:, 0]))
        keys = _encode(old.tab[live, 0])
        rows = old.tab32.take(live * 4 + 2)
        stats = old.tab32.take(live * 4 + 3)
        row_cap = live.size + spare_rows
        if spare_rows:
            row_cap = max(row_cap, live.size + live.size // 4)  # amortise slab growth
        values = np.empty((row_cap, self.dim), dtype=np.float32)
        values[: live.size] = old.values.take(rows, axis=0)
        self._state = self._build(keys, stats, values, self._cap_for(max(expected, row_cap)))

    def _build(self, keys, stats, values: np.ndarray, cap: int) -> _State:
        """A new state whose first ``keys.size`` slab rows (already in ``values``) are indexed."""
        while True:
            st = _State(cap, self.dim, 0, values=values)
            st.n_rows = keys.size
            try:
                st.bulk_place(keys, stats)
                return st
            except _Overfull:
                cap *= 2

    def _rebase(self) -> None:
        with self._lock:
            st = self._state
            s = st.tab32[3::4]
            np.subtract(s, _TICK_REBASE // 2, out=s)
            np.maximum(s, 0, out=s)
            self._tick -= _TICK_REBASE // 2
