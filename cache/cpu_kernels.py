"""The CPU (numpy) path of the set-associative table, compiled with numba.

Same layout, set function and results as the array-pass (``xp``) code of
:class:`~tierserve.cache.set_associative.SetAssociativeTable`, which cupy runs and the tests
use as the reference.  Every kernel is ``nogil``: lock-free readers and the insert worker
really run side by side, and the caller's sequence number still orders them.

Why these loops are fast.  A lookup is two dependent random reads per key (the set's row of
``keys``, then the hit's row of ``values``), each a likely cache miss on a large table.  A
plain loop keeps only a few keys in flight (the core's reorder window), so it is
latency-bound.  The kernels are software-pipelined instead: the key ``PREFETCH`` positions
ahead is hashed and its row prefetched (``llvm.prefetch``) while the current key is
compared, so about ``PREFETCH`` misses overlap.  A lookup is two such passes: probe
(sets -> slots, hit flags), then gather (copy hit rows, stamp ticks).  Measured on a 2-core
EPYC against each other in one process: one fused three-stage pass was 8-13% slower than
the two passes, and a plain per-key loop (hash, probe, copy) several times slower.  The
table's arrays start on a cache line (see ``set_associative._zeros``), so a 64-byte row is
one miss, not two.

Inserts are two passes as well (:func:`plan_insert` chooses slots and changes only ticks,
:func:`apply_insert` writes keys and vectors), so the cache can log which slots an insert
changes before it changes them; :func:`touched` is the readers' check against that log.
:func:`distinct_by_count` dedups a batch's misses for the parameter-server fetch.
"""

from __future__ import annotations

import numpy as np
from numba import njit

# ``prefetch(array, i)`` / ``prefetch_write``: hint the CPU to load the line of element ``i``
# of a C-contiguous 1-D array (no bounds check, no fault), shared with the ps hash kernels.
from tierserve.ps.hash_kernels import prefetch as _prefetch
from tierserve.ps.hash_kernels import prefetch_write as _prefetch_write
from tierserve.ps.partition import FMIX_C1, FMIX_C2
from tierserve.ps.row_kernels import (
    LAYOUT_FLOAT16,
    LAYOUT_FLOAT32,
    LAYOUT_INT8,
    emit_row,
    views,
)

from .slots import EMPTY, STAMP_ALL, STAMP_STRIDE

#: How many keys ahead the pipelined loops prefetch (on a 2-core EPYC, power-law batches:
#: 32 is 5-8% faster than 16, 64 no better, 8 leaves misses exposed).
PREFETCH = 32
_C1 = np.uint64(FMIX_C1)
_C2 = np.uint64(FMIX_C2)
_U32 = np.uint64(32)
_AGE_EMPTY = np.int64(2**32)  # older than any real age: empty ways are taken first


@njit(nogil=True, cache=True, inline="always")
def set_of_key(key, num_sets):
    """The set of one int64 ``key``: :func:`tierserve.cache.hashing.set_of` for a scalar."""
    h = np.uint64(key) * _C1
    h ^= h >> _U32
    h *= _C2
    h >>= _U32
    return np.int64((h * np.uint64(num_sets)) >> _U32)


@njit(nogil=True, cache=True)
def probe(keys, table_keys, slots, hit):
    """Fill ``slots[i]`` (slot of ``keys[i]``, meaningless on a miss) and ``hit[i]``; return
    the number of hits.  ``table_keys`` is the int64 ``[num_sets, ways]`` key array."""
    num_sets, ways = table_keys.shape
    flat = table_keys.reshape(-1)
    n = keys.size
    hits = 0
    for i in range(n + PREFETCH):
        if i < n:  # stage 1: hash a key ahead, keep its set's first slot, prefetch the row
            first = set_of_key(keys[i], num_sets) * ways
            slots[i] = first
            _prefetch(flat, first)
        j = i - PREFETCH
        if j >= 0:  # stage 2: compare the ways of a key whose row is (nearly) loaded
            key = keys[j]
            first = slots[j]
            # branch-free: which way matches is unpredictable
            if ways == 2:  # the default, unrolled (12% faster than the loop)
                second = flat[first + 1] == key
                found = (flat[first] == key) | second
                way = np.int64(second)
            else:
                found = False
                way = 0
                for w in range(ways):
                    match = flat[first + w] == key
                    found |= match
                    way += w * match
            found &= key != EMPTY  # the empty marker matches empty slots: never a hit
            slots[j] = first + way
            hit[j] = found
            hits += found
    return hits


@njit(inline="always")
def _gather(values, ticks, slots, hit, out, tick, layout):
    """The body of :func:`gather`, inlined with a constant ``layout``."""
    flat = values.reshape(-1)
    dim = values.shape[1]
    values16, values8, out32 = views(values, out)
    n = slots.size
    mask = STAMP_STRIDE - 1 if n > STAMP_ALL else 0
    phase = tick & mask
    now = np.uint32(tick & 0xFFFFFFFF)
    stamp = tick >= 0
    for i in range(n + PREFETCH):
        if i < n and hit[i]:
            _prefetch(flat, slots[i] * dim)
            if layout != LAYOUT_FLOAT32:  # compact rows (e.g. 24 bytes) may straddle two lines
                _prefetch(flat, slots[i] * dim + dim - 1)
            if stamp and (i & mask) == phase:
                _prefetch_write(ticks, slots[i])
        j = i - PREFETCH
        if j >= 0 and hit[j]:
            slot = slots[j]
            emit_row(values, values16, values8, slot, 0, out, out32, j, layout, out.shape[1])
            if stamp and (j & mask) == phase:
                ticks[slot] = now


@njit(nogil=True, cache=True)
def gather(values, ticks, slots, hit, out, tick, layout=LAYOUT_FLOAT32):
    """Copy the cached row of every hit into ``out`` (misses are left untouched), decoded
    when ``layout`` says the table holds compact rows (:func:`tierserve.ps.row_kernels.
    emit_row`; ``out`` is then ``[n, the decoded dim]``), and stamp
    the hit slots' ``ticks`` with ``tick`` (none when ``tick < 0``); in batches of more than
    ``STAMP_ALL`` keys only the hits at positions ``tick % STAMP_STRIDE``, then every
    ``STAMP_STRIDE``-th, are stamped (as the ``xp`` path; ``STAMP_STRIDE`` is a power of 2).
    A body per layout: a branch per row costs float32 rows their vectorised copy."""
    if layout == LAYOUT_FLOAT16:
        _gather(values, ticks, slots, hit, out, tick, LAYOUT_FLOAT16)
    elif layout == LAYOUT_INT8:
        _gather(values, ticks, slots, hit, out, tick, LAYOUT_INT8)
    else:
        _gather(values, ticks, slots, hit, out, tick, LAYOUT_FLOAT32)


@njit(nogil=True, cache=True)
def lookup(keys, table_keys, ticks, values, out, hit, slots, misses, tick,
           layout=LAYOUT_FLOAT32):
    """Probe and gather (see both): cached rows into ``out``, flags into ``hit``, slots read
    into ``slots``, and, when ``misses`` has room for every key, the positions of the misses
    into ``misses[:n - hits]``; return the number of hits."""
    n = keys.size
    hits = probe(keys, table_keys, slots, hit)
    if hits:
        gather(values, ticks, slots, hit, out, tick, layout)
    if hits < n and misses.size >= n:
        m = 0
        for i in range(n):  # branch-free: write always, advance on a miss
            misses[m] = i
            m += not hit[i]
    return hits


@njit(nogil=True, cache=True)
def plan_insert(keys, table_keys, ticks, tick, slots):
    """Choose a slot for each of the unique ``keys`` that is not cached yet (``slots[i]``,
    -1: none) and stamp it ``tick``; return how many of them hold a key now (evictions).
    Changes only ``ticks``; :func:`apply_insert` then writes keys and vectors.

    Keys go in order, so earlier keys win where a set cannot take them all: each takes an
    empty way of its set, else the oldest way (age ``(tick - ticks) mod 2**32``), never one
    stamped ``tick`` (used by this batch, or just chosen).  That is the ``xp`` path's
    ``place`` (the oldest ways go to the earliest keys), done one key at a time.
    """
    num_sets, ways = table_keys.shape
    flat = table_keys.reshape(-1)
    n = keys.size
    now = np.int64(tick & 0xFFFFFFFF)
    # The slots chosen so far (a linear-probing set): still empty in the table, taken here.
    size = 2
    while size < 2 * n:
        size *= 2
    mask = size - 1
    chosen = np.full(size, -1, dtype=np.int64)
    evicted = 0
    for i in range(n):
        if i + PREFETCH < n:
            ahead = set_of_key(keys[i + PREFETCH], num_sets) * ways
            _prefetch(flat, ahead)
            _prefetch_write(ticks, ahead)
        slots[i] = -1
        key = keys[i]
        if key == EMPTY:
            continue
        first = set_of_key(key, num_sets) * ways
        best = -1
        best_age = np.int64(0)  # a way must be older than this batch
        for w in range(ways):
            held = flat[first + w]
            if held == key:
                best = -1
                break
            if held == EMPTY:
                age = _AGE_EMPTY
                at = set_of_key(first + w, size)
                while chosen[at] >= 0:
                    if chosen[at] == first + w:
                        age = 0
                        break
                    at = (at + 1) & mask
            else:
                age = (now - np.int64(ticks[first + w])) & 0xFFFFFFFF
            if age > best_age:
                best, best_age = w, age
        if best >= 0:
            slot = first + best
            slots[i] = slot
            if flat[slot] == EMPTY:
                at = set_of_key(slot, size)
                while chosen[at] >= 0:
                    at = (at + 1) & mask
                chosen[at] = slot
            else:
                evicted += 1
            ticks[slot] = np.uint32(now)
    return evicted


@njit(nogil=True, cache=True)
def apply_insert(keys, vectors, slots, table_keys, values):
    """Write ``keys[i]`` and ``vectors[i]`` into slot ``slots[i]`` (skipped where -1), the
    vector rows prefetched for writing ahead; return how many were written."""
    flat = table_keys.reshape(-1)
    flat_values = values.reshape(-1)
    dim = values.shape[1]
    n = keys.size
    inserted = 0
    for i in range(n + PREFETCH):
        if i < n and slots[i] >= 0:
            _prefetch_write(flat_values, slots[i] * dim)
        j = i - PREFETCH
        if j >= 0 and slots[j] >= 0:
            slot = slots[j]
            flat[slot] = keys[j]
            values[slot, :] = vectors[j, :]
            inserted += 1
    return inserted


@njit(nogil=True, cache=True)
def touched(slots, hit, written):
    """The positions ``i`` with ``hit[i]`` whose slot ``slots[i]`` is among ``written`` (a
    reader's check of which rows it returned the writes that overlapped its read changed)."""
    m = written.size
    found = np.empty(slots.size, dtype=np.int64)
    count = 0
    if m == 0:
        return found[:0]
    size = 2
    while size < 2 * m:
        size *= 2
    mask = size - 1
    held = np.full(size, -1, dtype=np.int64)
    for i in range(m):
        at = set_of_key(written[i], size)
        while held[at] >= 0 and held[at] != written[i]:
            at = (at + 1) & mask
        held[at] = written[i]
    for i in range(slots.size):
        if hit[i]:
            at = set_of_key(slots[i], size)
            while held[at] >= 0:
                if held[at] == slots[i]:
                    found[count] = i
                    count += 1
                    break
                at = (at + 1) & mask
    return found[:count]


@njit(nogil=True, cache=True)
def distinct_by_count(keys):
    """``(distinct, inverse)``: the distinct values of int64 ``keys``, most frequent first
    (ties: first seen first), and each key's index in ``distinct``
    (``distinct[inverse] == keys``).  One pass with a linear-probing hash set: what
    ``np.unique(return_inverse, return_counts)`` plus a sort by count does in several."""
    n = keys.size
    size = 2
    while size < 2 * n:
        size *= 2
    mask = size - 1
    held = np.empty(size, dtype=np.int64)
    index = np.full(size, -1, dtype=np.int64)
    firsts = np.empty(n, dtype=np.int64)
    counts = np.zeros(n, dtype=np.int64)
    inverse = np.empty(n, dtype=np.int64)
    u = 0
    for i in range(n):
        key = keys[i]
        at = set_of_key(key, size)
        while index[at] >= 0 and held[at] != key:
            at = (at + 1) & mask
        if index[at] < 0:
            held[at] = key
            index[at] = u
            firsts[u] = key
            u += 1
        inverse[i] = index[at]
        counts[index[at]] += 1
    # Counting sort by count, descending and stable (ties keep first-seen order).
    top = 0
    for d in range(u):
        top = max(top, counts[d])
    start = np.zeros(top + 2, dtype=np.int64)  # start[c]: first rank of count c
    for d in range(u):
        start[counts[d]] += 1
    at = 0
    for c in range(top, 0, -1):
        at, start[c] = at + start[c], at
    rank = np.empty(u, dtype=np.int64)
    distinct = np.empty(u, dtype=np.int64)
    for d in range(u):
        r = start[counts[d]]
        start[counts[d]] = r + 1
        rank[d] = r
        distinct[r] = firsts[d]
    for i in range(n):
        inverse[i] = rank[inverse[i]]
    return distinct, inverse


_warm = False


def warm_up() -> None:
    """Compile (or load from numba's on-disk cache) every kernel for the array types the
    table uses, once per process: tables call this when created, so no query pays the
    seconds a first compile takes (and no concurrent reader stalls behind it)."""
    global _warm
    if _warm:
        return
    keys = np.array([1, EMPTY], dtype=np.int64)
    table_keys = np.full((1, 2), EMPTY, dtype=np.int64)
    ticks = np.zeros(2, dtype=np.uint32)
    values = np.zeros((2, 1), dtype=np.float32)
    slots = np.empty(2, dtype=np.int64)
    hit = np.empty(2, dtype=bool)
    plan_insert(keys, table_keys, ticks, 1, slots)
    apply_insert(keys, np.ones((2, 1), dtype=np.float32), slots, table_keys, values)
    lookup(keys, table_keys, ticks, values, np.empty((2, 1), np.float32), hit, slots, slots, 2)
    probe(keys, table_keys, slots, hit)
    touched(slots, hit, slots)
    distinct_by_count(keys)
    _warm = True
