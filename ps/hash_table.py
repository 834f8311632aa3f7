"""An open-addressing hash table of embeddings, worked by compiled kernels.

One :class:`HashTable` maps int64 keys to float32 vectors of length ``dim``.  An index of
keys, eight slots to a cache line, is probed a bucket at a time, and a slot's vector is the
same slot's row of a separate array, so a lookup costs about one random cache line for the
index and one for the row (the layout and the kernels are in
:mod:`tierserve.ps.hash_kernels`).  A statistic per slot (last access tick or access count)
is kept only when ``track`` asks for one.

Sizing: a load (and a rebuild after deletions) fills the table to 3/4 of its ``cap`` slots,
so keys and vectors take ``(8 + 4 dim) / 0.75`` bytes per key, 1.33x their raw bytes; inserts
grow it (rebuilding for a fill of 0.7: at most 1.43x) once slots in use, deleted ones
included, reach 0.85 (1.18x).  Deleted slots become tombstones, which inserts reuse; bulk
deletions (overflow eviction) and many tombstones rebuild the table.  A load of
:data:`PARALLEL_LOAD_MIN` keys or more fills the new arrays with one thread per core (up to
8), each taking the keys whose home slot lies in its stretch of the table.

Writers are serialised by a lock; readers take no lock: they read one immutable reference to
the current arrays, writers fill a slot's vector before its key, and a rebuild fills new
arrays and swaps the reference.

The keys ``-2**63`` and ``-2**63 + 1`` cannot be stored: the index marks empty and deleted
slots with them.
"""

from __future__ import annotations

import os
import threading
import time

import numpy as np

from tierserve.core.errors import InvalidInputError

from . import hash_kernels as _k
from .aligned import cache_aligned
from .keys import as_keys
from .partition import GOLDEN

#: The two keys that cannot be stored.
EMPTY = _k.EMPTY_KEY
TOMB = _k.DELETED_KEY

_FILL = 0.75  # fill after a load or a rebuild
_GROW_FILL = 0.7  # fill after growing for inserts
_MAX_FILL = 0.85  # slots in use (tombstones included) that trigger growth
_TICK_REBASE = 2**30
#: Ticks per second of a table whose ticks are times (``clock``; tables with a TTL).
CLOCK_TICKS_PER_S = 10
_TRACK = {None: 0, "recency": _k.TRACK_RECENCY, "frequency": _k.TRACK_FREQUENCY}
_NO_POS = np.empty(0, dtype=np.int64)


class _State:
    """The arrays of one table generation; replaced as a whole on resize."""

    __slots__ = ("cap", "seed", "index", "rows", "stats", "live", "used", "limit")

    def __init__(self, cap: int, dim: int, track: bool, generation: int):
        self.cap = _whole_buckets(cap)
        # A fresh hash per generation (see hash_kernels): the golden-ratio multiple, as int64.
        self.seed = (generation * GOLDEN + 2**63) % 2**64 - 2**63
        nslots = _slots(self.cap)
        self.index = cache_aligned((nslots,), np.int64)
        self.index.fill(EMPTY)
        self.rows = cache_aligned((nslots, dim), np.float32)
        self.stats = np.zeros(nslots if track else 0, dtype=np.int32)
        self.live = 0  # slots holding a key
        self.used = 0  # slots holding a key or a tombstone
        self.limit = int(_MAX_FILL * self.cap)

    @property
    def nbytes(self) -> int:
        return self.index.nbytes + self.rows.nbytes + self.stats.nbytes

    def find(self, keys: np.ndarray) -> np.ndarray:
        """Each key's slot, -1 where absent."""
        slots = np.empty(keys.size, dtype=np.int64)
        _k.find(keys, self.index, self.cap, self.seed, slots)
        return slots

    def insert(self, keys: np.ndarray, emb: np.ndarray, stat: int, track: int) -> int:
        """Insert until full; returns how many of ``keys`` were done (counts updated)."""
        done, new, used = _k.insert(
            keys, emb, self.index, self.rows, self.cap, self.seed, self.stats, stat, track,
            self.limit, self.used,
        )  # fmt: skip
        self.live += new
        self.used = used
        return done

    def live_slots(self) -> np.ndarray:
        return np.flatnonzero(self.index > TOMB)

    def keys(self) -> np.ndarray:
        index = self.index
        return index[index > TOMB]


def _whole_buckets(cap: int) -> int:
    """``cap`` rounded up to whole buckets (home slots are the first of a bucket)."""
    return -(-int(cap) // _k.BUCKET) * _k.BUCKET


def _slots(cap: int) -> int:
    """Slots of a generation of ``cap`` home slots: probes never wrap, they run into the
    padding past ``cap``, whose last slot stays empty (whole buckets)."""
    return cap + _whole_buckets(min(4096, max(32, cap // 16)))


#: Loads of at least this many keys use several threads (below, starting them costs more
#: than it saves).
PARALLEL_LOAD_MIN = 1 << 20


def _load_threads(n: int) -> int:
    if n < PARALLEL_LOAD_MIN:
        return 1
    affinity = getattr(os, "sched_getaffinity", None)  # Linux: the cores this process may use
    cores = len(affinity(0)) if affinity is not None else os.cpu_count() or 1
    return max(1, min(cores, 8))


def _parallel_load(st: _State, keys, emb, stat: int, track: int, threads: int) -> bool:
    """Insert ``keys`` into the empty ``st`` with one thread per region of home slots (the
    kernels release the GIL; see :func:`~tierserve.ps.hash_kernels.load_region`), then the
    few keys whose probe crossed into the next region; False if the table ran out of slots.
    """
    buckets = st.cap // _k.BUCKET  # regions of whole buckets
    ends = [r * buckets // threads * _k.BUCKET for r in range(1, threads)]
    los, his = [0, *ends], [*ends, st.cap]
    stops = [*ends, st.index.size - 1]
    deferred = [np.empty(0, dtype=np.int64)] * threads
    results: list = [None] * threads

    def work(r: int) -> None:
        try:
            deferred[r] = np.empty(keys.size, dtype=np.int64)
            results[r] = _k.load_region(
                keys, emb, los[r], his[r], stops[r], st.index, st.rows, st.cap, st.seed,
                st.stats, stat, deferred[r],
            )  # fmt: skip
        except BaseException as exc:  # re-raised in the calling thread
            results[r] = exc

    workers = [threading.Thread(target=work, args=(r,)) for r in range(1, threads)]
    for w in workers:
        w.start()
    work(0)
    for w in workers:
        w.join()
    for r in results:
        if isinstance(r, BaseException):
            raise r
    st.live = st.used = sum(r[1] for r in results)
    rest = np.concatenate([deferred[r][: results[r][0]] for r in range(threads)])
    return st.insert(keys[rest], emb[rest], stat, track) == rest.size


def _as_keys(keys) -> np.ndarray:
    return as_keys(keys)


class HashTable:
    """One partition's embeddings: int64 key -> float32 vector of length ``dim``.

    ``track`` selects the per-slot statistic kept for eviction: ``"recency"`` (last access
    tick), ``"frequency"`` (access count) or ``None``.  With ``clock`` (recency only) the
    ticks are times, in :data:`CLOCK_TICKS_PER_S` per second since the table was made, so
    that :meth:`expire` can remove the rows not accessed for a number of seconds.
    """

    def __init__(self, dim: int, track: str | None = None, capacity: int = 0,
                 clock: bool = False) -> None:  # fmt: skip
        if dim <= 0:
            raise InvalidInputError(f"embedding dim must be positive, got {dim}")
        if track not in _TRACK:
            raise ValueError(f"unknown statistic {track!r}")
        self.dim = int(dim)
        self.track = track
        self._track = _TRACK[track]
        self._tick = 1
        if clock and track != "recency":
            raise ValueError("a clocked table tracks recency")
        self._clock_start = time.monotonic() if clock else None
        self._generation = 0
        self._lock = threading.Lock()
        self._state = self._new_state(self._cap_for(capacity))

    # --- reads (no lock) -------------------------------------------------------------------

    def __len__(self) -> int:
        return self._state.live

    @property
    def clocked(self) -> bool:
        """Whether the recency ticks are times (:meth:`expire` works)."""
        return self._clock_start is not None

    @property
    def nbytes(self) -> int:
        """Bytes held by the index of keys, the vectors and the statistics."""
        return self._state.nbytes

    def lookup(self, keys: np.ndarray, out: np.ndarray | None = None):
        """``(embeddings [n, dim], found [n])`` for int64 ``keys``.

        Rows of keys not found are zero.  ``out`` (float32, C-contiguous ``[n, dim]``) may
        receive the embeddings.
        """
        keys = _as_keys(keys)
        emb = np.empty((keys.size, self.dim), dtype=np.float32) if out is None else out
        found = np.empty(keys.size, dtype=bool)
        self.lookup_into(keys, None, emb, found)
        return emb, found

    def lookup_into(
        self, keys: np.ndarray, pos, out: np.ndarray, found: np.ndarray, refresh: bool = True,
        layout: int = 0,
    ) -> int:
        """Look up ``keys[pos]`` (all keys when ``pos`` is None): rows into ``out[pos]``, flags
        into ``found[: pos.size]`` (in the order of ``pos``).  ``refresh``: a recency table
        stamps the rows found with the access time (HugeCTR's ``refresh_time_after_fetch``).

        ``keys`` must be contiguous int64 and ``out`` contiguous float32.  ``layout`` decodes
        compact stored rows into ``out`` (:mod:`tierserve.ps.row_kernels`; ``out`` is then
        ``[n, dim of the decoded rows]``).  Returns the hits.
        """
        st = self._state
        tick = 0
        track = self._track
        if track == _k.TRACK_RECENCY:
            if refresh:
                tick = self._advance()
            else:
                track = _k._TRACK_NONE
        hits = _k.lookup(
            keys, _NO_POS if pos is None else pos, pos is not None, st.index, st.rows, st.cap,
            st.seed, st.stats, track, tick, out, found, layout,
        )  # fmt: skip
        if tick >= _TICK_REBASE:
            self._rebase()
        return hits

    def contains(self, keys: np.ndarray) -> np.ndarray:
        """A bool mask of the keys present."""
        return self._state.find(_as_keys(keys)) >= 0

    def keys(self) -> np.ndarray:
        """All keys, in slot order (a copy)."""
        return self._state.keys()

    # --- writes ----------------------------------------------------------------------------

    def insert(self, keys: np.ndarray, embeddings: np.ndarray) -> int:
        """Insert or overwrite; returns how many keys were new."""
        keys = _as_keys(keys)
        if keys.size == 0:
            return 0
        if keys.min() <= TOMB:
            raise InvalidInputError(f"keys {int(EMPTY)} and {int(TOMB)} are reserved")
        emb = np.ascontiguousarray(embeddings, dtype=np.float32).reshape(keys.size, self.dim)
        with self._lock:
            stat = self._advance() if self._track == _k.TRACK_RECENCY else 1
            before = self._state.live
            start = 0
            rebuilt = False
            while True:
                st = self._state
                done = st.insert(keys[start:], emb[start:], stat, self._track)
                start += done
                if start == keys.size:
                    return self._state.live - before
                # Full: rebuild for the keys so far and the rest (tombstones are dropped);
                # a fresh table that overflowed its padding at once doubles instead.
                cap = int((st.live + keys.size - start) / _GROW_FILL)
                if rebuilt and done == 0:
                    cap = 2 * st.cap
                self._rebuild(cap)
                rebuilt = True

    def load(self, keys: np.ndarray, embeddings: np.ndarray) -> None:
        """Replace the whole content with ``keys`` and ``embeddings`` in one pass.

        Of repeated keys the last vector is kept.  The vectors are copied into the table's
        slots.
        """
        keys = _as_keys(keys)
        if keys.size and keys.min() <= TOMB:
            raise InvalidInputError(f"keys {int(EMPTY)} and {int(TOMB)} are reserved")
        emb = np.ascontiguousarray(embeddings, dtype=np.float32).reshape(keys.size, self.dim)
        with self._lock:
            stat = self._advance() if self._track == _k.TRACK_RECENCY else 1
            cap = self._cap_for(keys.size)
            threads = _load_threads(keys.size)
            while True:
                st = self._new_state(cap)
                st.limit = st.cap  # a load never stops to grow (only on running off the end)
                if threads > 1:
                    done = _parallel_load(st, keys, emb, stat, self._track, threads)
                else:
                    done = st.insert(keys, emb, stat, self._track) == keys.size
                if done:
                    st.limit = int(_MAX_FILL * st.cap)
                    self._state = st
                    return
                cap *= 2

    def remove(self, keys: np.ndarray) -> int:
        """Delete ``keys``; returns how many were present."""
        keys = _as_keys(keys)
        if keys.size == 0:
            return 0
        with self._lock:
            st = self._state
            slots = st.find(keys)
            gone = np.unique(slots[slots >= 0])
            st.index[gone] = TOMB
            st.live -= gone.size
            if st.used - st.live > max(st.live // 4, 1024):
                self._rebuild(self._cap_for(st.live))
            return int(gone.size)

    def expire(self, seconds: float) -> np.ndarray:
        """Remove the rows of a clocked table not written or looked up for ``seconds``
        (to a tick: up to 1 / :data:`CLOCK_TICKS_PER_S` s early); returns their keys."""
        if self._clock_start is None:
            raise ValueError("only a clocked table expires rows")
        cutoff = self._now() - int(seconds * CLOCK_TICKS_PER_S)
        with self._lock:
            st = self._state
            live = st.live_slots()
            old = live[st.stats[live] < cutoff]
            keys = st.index[old].copy()
            if old.size:
                st.index[old] = TOMB
                st.live -= old.size
                if st.used - st.live > max(st.live // 4, 1024):
                    self._rebuild(self._cap_for(st.live))
            return keys

    def evict_to(self, target: int, policy, rng: np.random.Generator) -> int:
        """Evict by ``policy`` until at most ``target`` keys remain; returns how many went."""
        with self._lock:
            st = self._state
            excess = st.live - int(target)
            if excess <= 0:
                return 0
            live = st.live_slots()
            stats = st.stats[live] if self.track else None
            victims = live[policy.select(stats, live.size, excess, rng)]
            st.index[victims] = TOMB
            st.live -= victims.size
            self._rebuild(self._cap_for(st.live))
            return int(victims.size)

    def clear(self) -> None:
        """Drop every key and free the memory."""
        with self._lock:
            self._state = self._new_state(self._cap_for(0))

    # --- internals -------------------------------------------------------------------------

    def _new_state(self, cap: int) -> _State:
        self._generation += 1
        return _State(cap, self.dim, self.track is not None, self._generation)

    @staticmethod
    def _cap_for(n: int) -> int:
        """Home slots for ``n`` keys at the load fill (whole buckets)."""
        return _whole_buckets(max(16, int(n / _FILL) + 1))

    def _rebuild(self, cap: int) -> None:
        """Rehash the live keys into fresh arrays of at least ``cap`` slots (under the lock)."""
        old = self._state
        cap = max(cap, self._cap_for(old.live))
        while True:
            st = self._new_state(cap)
            if _k.rehash(
                old.index, old.rows, old.stats, st.index, st.rows, st.cap, st.seed, st.stats
            ):
                st.live = st.used = old.live
                self._state = st
                return
            cap *= 2

    def _now(self) -> int:
        return int((time.monotonic() - self._clock_start) * CLOCK_TICKS_PER_S) + 2

    def _advance(self) -> int:
        """The next recency tick: one more, or for a clocked table the time (never less)."""
        if self._clock_start is None:
            self._tick += 1
        else:
            self._tick = max(self._tick, self._now())
        return self._tick

    def _rebase(self) -> None:
        with self._lock:
            if self._tick < _TICK_REBASE:
                return
            s = self._state.stats
            np.subtract(s, _TICK_REBASE // 2, out=s)
            np.maximum(s, 0, out=s)
            self._tick -= _TICK_REBASE // 2
            if self._clock_start is not None:  # the times move with the ticks
                self._clock_start += _TICK_REBASE // 2 / CLOCK_TICKS_PER_S
