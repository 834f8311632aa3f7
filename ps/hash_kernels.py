"""The compiled (numba) kernels of :class:`~tierserve.ps.hash_table.HashTable`.

Layout of one table generation (``nslots = cap + pad`` slots):

- ``tags`` (uint8, ``nslots``): 0 empty, 1 deleted, else 2 + an 8-bit hash of the key (the
  tag), so probing scans one byte per slot and reads a slot's key only on a tag match;
- ``rows`` (float32, ``[nslots, width]``): each slot's row holds the key (int64: the first
  two floats; ``rows.view(np.int64)[slot, 0]``) followed by its vector of ``dim`` floats
  (``width = 2 + dim`` rounded up to even, so keys stay 8-byte aligned): the key check and
  the vector copy touch the same cache lines;
- ``stats`` (int32, ``nslots``, or empty when no statistic is kept): last access tick or
  access count, for the eviction policies.

A key's home slot is ``((h >> 32) * cap) >> 32`` and its tag ``2 + (h & 0xFFFF) % 254``, with
``h`` the key's 64 bits, xor the generation's ``seed``, mixed by two multiplies (murmur3's
fmix64 constants).  Each generation (rebuild) takes a new seed: with one hash for all, home
order would be the same in the old and the new table, and the survivors of an eviction that
picks victims in slot order (ties) would crowd into one stretch of the new table.  Probing is
linear and never wraps: the ``pad`` slots past ``cap`` take the overflow, and writers never
fill the last slot, so every probe ends on an empty one.

Lookups are bound by memory latency (per key the tag's cache line, then the row's: two
adjacent lines at dim 16), so the lookup kernel is a software pipeline: while it copies key
``i``'s vector it probes key ``i + D``'s tags (and prefetches the row of the first tag
match) and prefetches key ``i + 2D``'s tag.  Rows are indexed as a 2-D array: LLVM then
vectorises the row copy (flat indexing made the copy three times slower than ``np.take``).
Only a row's first and last lines are prefetched (the hardware streams the lines between
them, and a loop over the lines cost a tenth of the rate at dim 16), as streaming data: a
row passes through the caches once, while the tags are worth keeping there.  The body is
inlined once per case (indexed or not, which statistic), as branches on those cases in the
loop cost another tenth.

Writers publish a slot by writing its tag last, after the key and vector, so a reader
without a lock never sees a tag whose row is not written yet: x86 keeps stores in order,
and the compiler cannot move the stores across each other as it cannot tell the arrays
apart (a weakly ordered CPU would need a release fence before the tag store).

All kernels release the GIL and are cached on disk (``cache=True``).
"""

from __future__ import annotations

import numba as nb
import numpy as np
from llvmlite import binding as _llvm
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from .partition import FMIX_C1, FMIX_C2, SPLITMIX_M1, SPLITMIX_M2
from .row_kernels import LAYOUT_FLOAT16, LAYOUT_FLOAT32, LAYOUT_INT8, emit_row, views

EMPTY_TAG = 0
DELETED_TAG = 1
#: How far ahead (in keys) the lookup and insert pipelines run.
_AHEAD = 32
_RING = 128  # > 2 * _AHEAD, a power of two
_RING_MASK = _RING - 1
_TRACK_NONE, TRACK_RECENCY, TRACK_FREQUENCY = 0, 1, 2
_INT32_MAX = 2**31 - 1
_FMIX_C1, _FMIX_C2 = np.uint64(FMIX_C1), np.uint64(FMIX_C2)
_SPLITMIX_M1, _SPLITMIX_M2 = np.uint64(SPLITMIX_M1), np.uint64(SPLITMIX_M2)

# LLVM >= 17 has opaque pointers (the intrinsic is named by address space only).
_PREFETCH_NAME = "llvm.prefetch.p0" if _llvm.llvm_version_info[0] >= 17 else "llvm.prefetch.p0i8"


def _make_prefetch(write: int, locality: int = 3):
    @intrinsic
    def _prefetch(typingctx, arr, idx):
        sig = types.void(arr, idx)

        def codegen(context, builder, signature, args):
            aryty = signature.args[0]
            ary = context.make_array(aryty)(context, builder, args[0])
            ptr = cgutils.get_item_pointer2(
                context, builder, data=ary.data, shape=cgutils.unpack_tuple(builder, ary.shape),
                strides=cgutils.unpack_tuple(builder, ary.strides), layout=aryty.layout,
                inds=[args[1]], wraparound=False, boundscheck=False,
            )  # fmt: skip
            i8p = ir.IntType(8).as_pointer()
            i32 = ir.IntType(32)
            fnty = ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32])
            fn = cgutils.get_or_insert_function(builder.module, fnty, _PREFETCH_NAME)
            # (address, rw, locality: 3 keep in all levels .. 0 streaming, cache type 1 = data)
            builder.call(fn, [builder.bitcast(ptr, i8p), ir.Constant(i32, write),
                              ir.Constant(i32, locality), ir.Constant(i32, 1)])  # fmt: skip
            return context.get_dummy_value()

        return sig, codegen

    return _prefetch


#: ``prefetch(arr, i)``: ask for the cache line holding ``arr[i]`` (1-D ``arr``), no wait.
prefetch = _make_prefetch(0)
prefetch_write = _make_prefetch(1)
#: ``prefetch_stream(arr, i)``: as ``prefetch``, for data read once (non-temporal: it does
#: not push longer-lived lines, such as the tags, out of the caches).
prefetch_stream = _make_prefetch(0, locality=0)


@nb.njit(inline="always")
def _mix(key, seed):
    h = np.uint64(key ^ seed) * _FMIX_C1
    h ^= h >> np.uint64(32)
    return h * _FMIX_C2


@nb.njit(inline="always")
def _home(h, cap):
    return np.int64(((h >> np.uint64(32)) * np.uint64(cap)) >> np.uint64(32))


@nb.njit(inline="always")
def _tag(h):
    return np.uint8(np.uint64(2) + (h & np.uint64(0xFFFF)) % np.uint64(254))


@nb.njit(inline="always")
def _scan(tg, s, tags):
    """The first slot from ``s`` on whose tag is ``tg``, or -1 at an empty slot (tags only)."""
    while True:
        t = tags[s]
        if t == tg:
            return s
        if t == EMPTY_TAG:
            return -1
        s += 1


@nb.njit(inline="always")
def _probe(key, tg, s, tags, rkeys):
    """The slot holding ``key``, probing from slot ``s``, or -1."""
    while True:
        s = _scan(tg, s, tags)
        if s < 0 or rkeys[s, 0] == key:
            return s
        s += 1


@nb.njit(inline="always")
def _lookup(keys, pos, indexed, tags, rows, cap, seed, stats, track, tick, out, found, layout):
    """The body of :func:`lookup`, inlined with constant ``indexed`` and ``track``."""
    rkeys = rows.view(np.int64)
    rows16, rows8, out32 = views(rows, out)
    flat = rows.reshape(-1)
    width = rows.shape[1]
    dim = out.shape[1]
    m = pos.size if indexed else keys.size
    # Rings of the keys in flight: small, so no fresh pages to fault in per call.
    slot = np.empty(_RING, np.int64)
    hs = np.empty(_RING, np.uint64)
    d = _AHEAD
    hits = 0
    for j in range(-2 * d, m):
        a = j + 2 * d  # stage 1: the tag's cache line
        if a < m:
            h = _mix(keys[pos[a]] if indexed else keys[a], seed)
            hs[a & _RING_MASK] = h
            s = _home(h, cap)
            slot[a & _RING_MASK] = s
            prefetch(tags, s)
        b = j + d  # stage 2: the first tag match (no key read yet), then its row's lines
        if b >= 0 and b < m:
            r = b & _RING_MASK
            s = _scan(_tag(hs[r]), slot[r], tags)
            slot[r] = s
            if s >= 0:
                base = s * width
                prefetch_stream(flat, base)
                prefetch_stream(flat, base + width - 1)
        if j >= 0:  # stage 3: check the key (a tag matches a wrong key 1 in 254), copy
            i = pos[j] if indexed else j
            s = slot[j & _RING_MASK]
            if s >= 0:
                k = keys[i]
                if rkeys[s, 0] != k:
                    s = _probe(k, _tag(hs[j & _RING_MASK]), s + 1, tags, rkeys)
            if s >= 0:
                emit_row(rows, rows16, rows8, s, 2, out, out32, i, layout)
                found[j] = True
                hits += 1
                if track == TRACK_RECENCY:
                    stats[s] = tick
                elif track == TRACK_FREQUENCY and stats[s] < _INT32_MAX:
                    stats[s] += 1
            else:
                for c in range(dim):
                    out[i, c] = 0.0
                found[j] = False
    return hits


@nb.njit(nogil=True, cache=True)
def lookup(keys, pos, indexed, tags, rows, cap, seed, stats, track, tick, out, found, layout):
    """Copy the vectors of ``keys`` into ``out``; set ``found``; return how many were found.

    ``layout`` (:mod:`tierserve.ps.row_kernels`) decodes compact stored rows into float32
    ``out`` as they are copied (0: the stored words are the float32 values).  Float32 tables
    get a body per statistic as before; compact ones a body per layout, the statistic
    branched on (a body per pair would double the compile time again).

    With ``indexed`` only the keys ``keys[pos[j]]`` are looked up, their rows written to
    ``out[pos[j]]`` and their flags to ``found[j]`` (one partition's share of a request:
    threads working other partitions write other bytes of ``out``, and flags of their own
    array, so no cache line of flags is written by two threads).  Rows of keys not found are
    zeroed.  ``track`` 1 stamps found slots with ``tick`` in ``stats``,
    2 counts the access.  Three stages run ``_AHEAD`` keys apart: prefetch the home tag,
    probe the tags (and prefetch the row found), check the key and copy the row.
    """
    if layout == LAYOUT_FLOAT16:  # compact rows: the layout fixed, the statistic not
        if indexed:
            return _lookup(keys, pos, True, tags, rows, cap, seed, stats, track, tick, out,
                           found, LAYOUT_FLOAT16)  # fmt: skip
        return _lookup(keys, pos, False, tags, rows, cap, seed, stats, track, tick, out, found,
                       LAYOUT_FLOAT16)  # fmt: skip
    if layout == LAYOUT_INT8:
        if indexed:
            return _lookup(keys, pos, True, tags, rows, cap, seed, stats, track, tick, out,
                           found, LAYOUT_INT8)  # fmt: skip
        return _lookup(keys, pos, False, tags, rows, cap, seed, stats, track, tick, out, found,
                       LAYOUT_INT8)  # fmt: skip
    if indexed:
        if track == TRACK_RECENCY:
            return _lookup(keys, pos, True, tags, rows, cap, seed, stats, TRACK_RECENCY, tick,
                           out, found, LAYOUT_FLOAT32)  # fmt: skip
        if track == TRACK_FREQUENCY:
            return _lookup(keys, pos, True, tags, rows, cap, seed, stats, TRACK_FREQUENCY, tick,
                           out, found, LAYOUT_FLOAT32)  # fmt: skip
        return _lookup(keys, pos, True, tags, rows, cap, seed, stats, _TRACK_NONE, tick, out,
                       found, LAYOUT_FLOAT32)  # fmt: skip
    if track == TRACK_RECENCY:
        return _lookup(keys, pos, False, tags, rows, cap, seed, stats, TRACK_RECENCY, tick, out,
                       found, LAYOUT_FLOAT32)  # fmt: skip
    if track == TRACK_FREQUENCY:
        return _lookup(keys, pos, False, tags, rows, cap, seed, stats, TRACK_FREQUENCY, tick,
                       out, found, LAYOUT_FLOAT32)  # fmt: skip
    return _lookup(keys, pos, False, tags, rows, cap, seed, stats, _TRACK_NONE, tick, out,
                   found, LAYOUT_FLOAT32)  # fmt: skip


@nb.njit(nogil=True, cache=True)
def find(keys, tags, rows, cap, seed, slots):
    """Write each key's slot (or -1 when absent) to ``slots``."""
    rkeys = rows.view(np.int64)
    n = keys.size
    for i in range(n):
        if i + _AHEAD < n:
            prefetch(tags, _home(_mix(keys[i + _AHEAD], seed), cap))
        k = keys[i]
        h = _mix(k, seed)
        slots[i] = _probe(k, _tag(h), _home(h, cap), tags, rkeys)


@nb.njit(nogil=True, cache=True)
def insert(keys, emb, tags, rows, cap, seed, stats, stat, track, limit, used):
    """Insert or overwrite ``keys[i]`` with ``emb[i]``, in order (a repeated key: the last wins).

    A new key takes the first deleted slot of its probe, else the empty slot ending it.  New
    slots get the statistic ``stat``; overwritten ones get it only when ``track`` is 1
    (recency).  Stops before a key that needs an empty slot when ``used`` (slots ever
    filled) reached ``limit`` or the probe reached the last slot.  Returns ``(keys done,
    new keys, used)``: the caller grows the table and goes on from there.
    """
    rkeys = rows.view(np.int64)
    flat = rows.reshape(-1)
    width = rows.shape[1]
    dim = emb.shape[1]
    n = keys.size
    nslots = tags.size
    new = 0
    keep_stats = stats.size > 0
    for i in range(n):
        a = i + _AHEAD
        if a < n:
            s = _home(_mix(keys[a], seed), cap)
            prefetch_write(tags, s)
            prefetch_write(flat, s * width)  # the row's first and last lines (as in lookup)
            prefetch_write(flat, s * width + width - 1)
        k = keys[i]
        h = _mix(k, seed)
        tg = _tag(h)
        s = _home(h, cap)
        free = -1
        hit = False
        while True:
            t = tags[s]
            if t == tg:
                if rkeys[s, 0] == k:
                    hit = True
                    break
            elif t == EMPTY_TAG:
                break
            elif t == DELETED_TAG and free < 0:
                free = s
            s += 1
        if hit:
            for c in range(dim):
                rows[s, 2 + c] = emb[i, c]
            if track == TRACK_RECENCY:
                stats[s] = stat
            continue
        if free >= 0:
            s = free
        else:
            if used >= limit or s >= nslots - 1:
                return i, new, used
            used += 1
        rkeys[s, 0] = k
        for c in range(dim):
            rows[s, 2 + c] = emb[i, c]
        if keep_stats:
            stats[s] = stat
        tags[s] = tg  # publish last
        new += 1
    return n, new, used


@nb.njit(nogil=True, cache=True)
def load_region(keys, emb, lo, hi, stop, tags, rows, cap, seed, stats, stat, deferred):
    """Insert those of ``keys`` whose home slot is in ``[lo, hi)`` (a repeated key: the last
    wins) into a table that is being loaded and has neither deletions nor readers, using no
    slot from ``stop`` on.

    One thread per region of home slots loads a table at once: each reads all the keys and
    takes its own (hashing a key costs far less than the memory its insert touches), a
    region's keys probe only its own slots, and a key whose probe reaches ``stop`` (the next
    region) is left for a pass with :func:`insert` after all regions are done (its positions,
    in order, go to ``deferred``).  Returns ``(keys deferred, new keys)``.
    """
    rkeys = rows.view(np.int64)
    flat = rows.reshape(-1)
    width = rows.shape[1]
    dim = emb.shape[1]
    n = keys.size
    keep_stats = stats.size > 0
    new = 0
    left = 0
    ahead = _AHEAD * max(1, cap // max(1, hi - lo))  # about _AHEAD keys of this region
    for i in range(n):
        a = i + ahead
        if a < n:
            s = _home(_mix(keys[a], seed), cap)
            if s >= lo and s < hi:
                prefetch_write(tags, s)
                prefetch_write(flat, s * width)
                prefetch_write(flat, s * width + width - 1)
        k = keys[i]
        h = _mix(k, seed)
        s = _home(h, cap)
        if s < lo or s >= hi:
            continue
        tg = _tag(h)
        hit = False
        while s < stop:
            t = tags[s]
            if t == tg and rkeys[s, 0] == k:
                hit = True
                break
            if t == EMPTY_TAG:
                break
            s += 1
        if s >= stop:
            deferred[left] = i
            left += 1
            continue
        rkeys[s, 0] = k
        for c in range(dim):
            rows[s, 2 + c] = emb[i, c]
        if not hit:
            if keep_stats:
                stats[s] = stat
            tags[s] = tg
            new += 1
    return left, new


@nb.njit(nogil=True, cache=True)
def rehash(old_tags, old_rows, old_stats, tags, rows, cap, seed, stats):
    """Copy every live slot of the old arrays into the empty new ones; False if they overflow."""
    old_keys = old_rows.view(np.int64)
    nslots = tags.size
    width = rows.shape[1]
    keep_stats = stats.size > 0 and old_stats.size > 0
    n = old_tags.size
    for o in range(n):
        a = o + _AHEAD
        if a < n and old_tags[a] > DELETED_TAG:
            prefetch_write(tags, _home(_mix(old_keys[a, 0], seed), cap))
        if old_tags[o] <= DELETED_TAG:
            continue
        h = _mix(old_keys[o, 0], seed)
        s = _home(h, cap)
        while tags[s] != EMPTY_TAG:
            s += 1
        if s >= nslots - 1:
            return False
        for c in range(width):
            rows[s, c] = old_rows[o, c]
        if keep_stats:
            stats[s] = old_stats[o]
        tags[s] = _tag(h)  # the tag too depends on the seed
    return True


@nb.njit(inline="always")
def _partition(key, m, mask):
    """splitmix64(key) % m, as :func:`tierserve.ps.partition.partition_of` (``mask`` is
    ``m - 1`` when ``m`` is a power of two, else 0: a 64-bit division costs ~40 cycles)."""
    z = np.uint64(key)
    z = (z ^ (z >> np.uint64(30))) * _SPLITMIX_M1
    z = (z ^ (z >> np.uint64(27))) * _SPLITMIX_M2
    z ^= z >> np.uint64(31)
    if mask:
        return np.int64(z & mask)
    return np.int64(z % m)


@nb.njit(nogil=True, cache=True)
def group_by_partition(keys, num_partitions):
    """``(order, bounds)`` as :func:`tierserve.ps.partition.group_by_partition`: stable.

    One pass computes and counts each key's partition, a second scatters the positions.
    """
    n = keys.size
    m = np.uint64(num_partitions)
    mask = m - np.uint64(1) if (num_partitions & (num_partitions - 1)) == 0 else np.uint64(0)
    part = np.empty(n, np.int32)
    bounds = np.zeros(num_partitions + 1, np.int64)
    for i in range(n):
        p = _partition(keys[i], m, mask)
        part[i] = p
        bounds[p + 1] += 1
    for p in range(num_partitions):
        bounds[p + 1] += bounds[p]
    fill = bounds[:-1].copy()
    order = np.empty(n, np.int64)
    for i in range(n):
        p = part[i]
        order[fill[p]] = i
        fill[p] += 1
    return order, bounds
