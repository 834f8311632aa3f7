"""The compiled (numba) kernels of :class:`~tierserve.ps.hash_table.HashTable`.

Layout of one table generation (``nslots = cap + pad`` slots, both multiples of 8):

- ``index`` (int64, ``nslots``, starting on a cache line): each slot's key, or
  :data:`EMPTY_KEY` (``-2**63``) or :data:`DELETED_KEY` (``-2**63 + 1``); eight slots (a
  *bucket*) fill one 64-byte line;
- ``rows`` (float32, ``[nslots, dim]``, starting on a cache line): slot ``s``'s vector is
  ``rows[s]`` (a dim-16 row is exactly one line);
- ``stats`` (int32, ``nslots``, or empty when no statistic is kept): last access tick or
  access count, for the eviction policies.

A key's home slot is the first of bucket ``((h >> 32) * (cap / 8)) >> 32``, with ``h`` the
key's 64 bits, xor the generation's ``seed``, mixed by two multiplies (murmur3's fmix64
constants).  Each generation (rebuild) takes a new seed: with one hash for all, home order
would be the same in the old and the new table, and the survivors of an eviction that picks
victims in slot order (ties) would crowd into one stretch of the new table.  Probing is
linear from the home slot and never wraps: the ``pad`` slots past ``cap`` take the
overflow, and writers never fill the last slot, so every probe ends on an empty one.  At the
fill a load leaves (3/4) nine keys in ten are in their home bucket.

Lookups are bound by memory latency: per key the index line of its bucket, then its row.
The lookup kernel is a software pipeline over three stages ``_LOOKUP_AHEAD`` keys apart:
hash key ``i + 2D`` and prefetch its bucket's line; compare key ``i + D`` with its bucket's
eight keys at once (one vector compare, no branch per slot) and prefetch the row of the
match (or, for a full bucket without the key, the next bucket's line); check key ``i``'s
slot again and copy its row.  So a key costs two random cache lines at dim 16 where a dense
array's row read at a random offset costs one.  Rows are indexed as a 2-D array: LLVM then
vectorises the row copy.  Only a row's first and last lines are prefetched (the hardware
streams the lines between them).  Both prefetches bring their line to the L2 cache, not the
L1: with two misses per key in flight the loop is bound by the L1's few miss buffers (a
sampled profile finds half its time on the prefetch instructions when they target the L1),
and a prefetch to the L2 frees its buffer sooner; the loads that follow find the line in the
L2.  The body is inlined once per case (indexed or not, which statistic), as branches on
those cases in the loop cost a tenth of the rate.

Writers publish a slot by writing its key last, after its vector, so a reader without a lock
never finds a key whose row is not written yet: x86 keeps stores in order, and the compiler
cannot move the stores across each other as it cannot tell the arrays apart (a weakly ordered
CPU would need a release fence before the key store).  A deleted key's slot gets
:data:`DELETED_KEY` and may be reused by a later insert; the lookup checks a slot's key right
before copying its row, so a row is only returned under the key that held the slot then.

All kernels release the GIL and are cached on disk (``cache=True``).
"""

from __future__ import annotations

import functools

import numba as nb
import numpy as np
from llvmlite import binding as _llvm
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.cpython.unsafe.numbers import trailing_zeros
from numba.extending import intrinsic

from .partition import FMIX_C1, FMIX_C2, SPLITMIX_M1, SPLITMIX_M2
from .row_kernels import LAYOUT_FLOAT32, emit_row, stored_words, views

#: The index's marks of an empty and of a deleted slot (keys no table may hold).
EMPTY_KEY = np.int64(-(2**63))
DELETED_KEY = np.int64(-(2**63) + 1)
#: Slots per bucket: eight int64 keys fill one 64-byte cache line.
BUCKET = 8
#: How far ahead (in keys) the lookup and insert pipelines run.
_AHEAD = 32
#: How far apart (in keys) the lookup pipeline's stages run: with its prefetches to the L2,
#: 24 did better than 16 and 32 at 10M rows, dim 16, both key distributions.
_LOOKUP_AHEAD = 24
_RING = 128  # > 2 * _AHEAD, a power of two
_RING_MASK = _RING - 1
_LOAD_RING = 2048  # load_region's ring of homes: > 2 * _AHEAD * 8 threads
_TRACK_NONE, TRACK_RECENCY, TRACK_FREQUENCY = 0, 1, 2
_INT32_MAX = 2**31 - 1
_FMIX_C1, _FMIX_C2 = np.uint64(FMIX_C1), np.uint64(FMIX_C2)
_SPLITMIX_M1, _SPLITMIX_M2 = np.uint64(SPLITMIX_M1), np.uint64(SPLITMIX_M2)

# LLVM >= 17 has opaque pointers (the intrinsic is named by address space only).
_PREFETCH_NAME = "llvm.prefetch.p0" if _llvm.llvm_version_info[0] >= 17 else "llvm.prefetch.p0i8"


def _item_pointer(context, builder, aryty, ary, idx):
    """The address of ``ary[idx]`` (1-D; for a 2-D array, of row ``idx``)."""
    array = context.make_array(aryty)(context, builder, ary)
    return cgutils.get_item_pointer2(
        context, builder, data=array.data, shape=cgutils.unpack_tuple(builder, array.shape),
        strides=cgutils.unpack_tuple(builder, array.strides), layout=aryty.layout, inds=[idx],
        wraparound=False, boundscheck=False,
    )  # fmt: skip


def _make_prefetch(write: int, locality: int = 3):
    @intrinsic
    def _prefetch(typingctx, arr, idx):
        sig = types.void(arr, idx)

        def codegen(context, builder, signature, args):
            ptr = _item_pointer(context, builder, signature.args[0], args[0], args[1])
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
#: ``prefetch_l2(arr, i)``: as ``prefetch``, to the L2 cache only (see the module docstring).
prefetch_l2 = _make_prefetch(0, locality=2)


@intrinsic
def address_of(typingctx, arr):
    """The address of ``arr``'s first element, as an integer.  The probing helpers take the
    index by address: an inlined numba function taking an array gets reference-count calls
    (atomic, on one counter for all threads) around each use that numba cannot prune when
    the function loops or returns early."""
    sig = types.intp(arr)

    def codegen(context, builder, signature, args):
        array = context.make_array(signature.args[0])(context, builder, args[0])
        return builder.ptrtoint(array.data, context.get_value_type(types.intp))

    return sig, codegen


@intrinsic
def bucket_matches(typingctx, at, start, key):
    """A bit mask of the slots ``start .. start + 7`` of the index at address ``at`` (int64
    keys) that hold ``key``: bit ``i`` for slot ``start + i``.  One vector compare of the
    bucket's line (AVX-512: one instruction); ``start`` is a multiple of :data:`BUCKET`."""
    sig = types.int64(at, start, key)

    def codegen(context, builder, signature, args):
        i64, i32 = ir.IntType(64), ir.IntType(32)
        vec = ir.VectorType(i64, BUCKET)
        byte = builder.add(args[0], builder.mul(args[1], ir.Constant(args[1].type, 8)))
        # align 8 (what an int64 array guarantees): the same instruction when the line is
        # aligned, and no undefined behaviour if a caller's index were not
        slots = builder.load(builder.inttoptr(byte, vec.as_pointer()), align=8)
        undef = ir.Constant(vec, ir.Undefined)
        one = builder.insert_element(undef, args[2], ir.Constant(i32, 0))
        splat = builder.shuffle_vector(one, undef, ir.Constant(ir.VectorType(i32, BUCKET),
                                                               [0] * BUCKET))  # fmt: skip
        bits = builder.bitcast(builder.icmp_signed("==", slots, splat), ir.IntType(BUCKET))
        return builder.zext(bits, i64)

    return sig, codegen


@nb.njit(inline="always")
def _mix(key, seed):
    h = np.uint64(key ^ seed) * _FMIX_C1
    h ^= h >> np.uint64(32)
    return h * _FMIX_C2


@nb.njit(inline="always")
def _home(h, cap):
    """The first slot of the key's bucket (``cap``: slots, a multiple of BUCKET)."""
    buckets = np.uint64(cap // BUCKET)
    return np.int64(((h >> np.uint64(32)) * buckets) >> np.uint64(32)) * BUCKET


@nb.njit(inline="always")
def _probe(key, s, at):
    """The slot holding ``key``, probing bucket by bucket from the bucket at ``s`` of the
    index at address ``at``, or -1: a bucket fills from its first slot on (deletions leave
    tombstones, not empty slots), so a key is never after an empty slot of its probe, and a
    bucket with an empty slot but not the key ends the probe."""
    while True:
        hit = bucket_matches(at, s, key)
        if hit:
            return s + trailing_zeros(hit)
        if bucket_matches(at, s, EMPTY_KEY):
            return -1
        s += BUCKET


@nb.njit(inline="always")
def _place(key, s, stop, at, deletions):
    """Where ``key`` goes, probing bucket by bucket from the bucket at ``s`` of the index at
    address ``at``: its own slot if present, else the first deleted slot of the probe
    (``deletions``: the table may have some), else the first empty slot (which ends the
    probe); ``stop`` (a bucket's first slot, or the last slot) if the probe reaches it
    first."""
    free = -1
    while s < stop:
        hit = bucket_matches(at, s, key)
        if hit:
            return s + trailing_zeros(hit)
        if deletions and free < 0:
            gone = bucket_matches(at, s, DELETED_KEY)
            if gone:
                free = s + trailing_zeros(gone)
        empty = bucket_matches(at, s, EMPTY_KEY)
        if empty:
            return free if free >= 0 else s + trailing_zeros(empty)
        s += BUCKET
    return stop


@nb.njit(inline="always")
def _prefetch_row(flat, s, width, write):
    """The first and, when it is another, the last line of row ``s`` of ``flat`` (the rows,
    flattened once per call: a reshape in the loop costs a call per key); the hardware
    streams the lines between them."""
    at = s * width
    if write:
        prefetch_write(flat, at)
        if at % 16 + width > 16:
            prefetch_write(flat, at + width - 1)
    else:
        prefetch_l2(flat, at)
        if at % 16 + width > 16:
            prefetch_l2(flat, at + width - 1)


@intrinsic
def copy16(typingctx, dst, d, src, s):
    """``dst[d : d + 16] = src[s : s + 16]`` (1-D float32 arrays) as one 16-float vector load
    and store (AVX-512: one instruction each).  The loop ``dst[d + c] = src[s + c]`` would be
    sixteen scalar loads and stores: LLVM cannot tell that the arrays do not overlap, so it
    must keep each load before the previous store."""
    sig = types.void(dst, d, src, s)

    def codegen(context, builder, signature, args):
        vec = ir.VectorType(ir.FloatType(), 16)
        to = _item_pointer(context, builder, signature.args[0], args[0], args[1])
        at = _item_pointer(context, builder, signature.args[2], args[2], args[3])
        line = builder.load(builder.bitcast(at, vec.as_pointer()), align=4)
        builder.store(line, builder.bitcast(to, vec.as_pointer()), align=4)
        return context.get_dummy_value()

    return sig, codegen


@nb.njit(inline="always")
def _copy_row(dst, d, src, s, dim):
    """``dst[d : d + dim] = src[s : s + dim]`` (flat arrays), 16 floats at a time: a copy
    loop of runtime length (the dim) cost checks and a remainder loop per row, a third of
    the lookup rate at dim 16."""
    c = 0
    while c + 16 <= dim:
        copy16(dst, d + c, src, s + c)
        c += 16
    while c < dim:
        dst[d + c] = src[s + c]
        c += 1


_NO_SLOT = -1  # stage 2 found the key absent; below -1: -2 - the next bucket to probe


@nb.njit(inline="always")
def _lookup(keys, pos, indexed, index, rows, cap, seed, stats, track, tick, out, found,
            line_dim, d, layout):  # fmt: skip
    """The body of the lookup kernels, inlined with constant ``indexed``, ``track``,
    ``layout`` and ``line_dim`` (the dim when the kernel is compiled for one, else 0), stages
    ``d`` keys apart (at most ``_RING / 2 - 1``).  A compact ``layout`` decodes each row's
    stored words (``rows.shape[1]`` of them) into ``out``'s float32 values as it copies.

    The loop keeps to a few instructions per stage, as the lookup of rows the caches hold is
    bound by them: no calls (an inlined function taking an array costs reference counting
    calls, and the registers they clobber), one compare per stage's bounds, unsigned indices
    where they cannot be negative (no wraparound code)."""
    dim = line_dim if line_dim else out.shape[1]
    # stored words a row: a constant too in a kernel compiled for the dim
    width = stored_words(layout, dim) if line_dim else rows.shape[1]
    rows16, rows8, out32 = views(rows, out)
    at = address_of(index)
    flat = rows.reshape(-1)
    flat_out = out.reshape(-1)
    m = pos.size if indexed else keys.size
    # A ring of the slots in flight: small, so no fresh pages to fault in per call.
    slot = np.empty(_RING, np.int64)
    zeros = np.zeros(dim, np.float32)  # the row of a key not found
    hits = 0
    for j in range(-2 * d, m):
        a = j + 2 * d  # stage 1: the home bucket's line
        if a < m:
            ua = np.uint64(a)
            s = _home(_mix(keys[np.uint64(pos[ua])] if indexed else keys[ua], seed), cap)
            slot[a & _RING_MASK] = s
            prefetch_l2(index, s)
        b = j + d  # stage 2: the slot in the bucket (its row prefetched), else absent (the
        ub = np.uint64(b)  # bucket has an empty slot), else the next bucket
        if ub < np.uint64(m):
            r = b & _RING_MASK
            s = slot[r]
            k = keys[np.uint64(pos[ub])] if indexed else keys[ub]
            hit = bucket_matches(at, s, k) if k > DELETED_KEY else 0  # marks are no keys
            if hit:
                s += trailing_zeros(hit)
                _prefetch_row(flat, s, width, False)
            elif k <= DELETED_KEY or bucket_matches(at, s, EMPTY_KEY):
                s = _NO_SLOT
            else:
                prefetch_l2(index, s + BUCKET)
                s = -2 - (s + BUCKET)
            slot[r] = s
        if j >= 0:  # stage 3: the slot's key again (a writer may have moved it), the copy
            uj = np.uint64(j)
            i = np.uint64(pos[uj]) if indexed else uj
            k = keys[i]
            s = slot[j & _RING_MASK]
            if s < _NO_SLOT:  # a full bucket: probe on from the next one
                s = _probe(k, -2 - s, at)
            elif s >= 0 and index[s] != k:  # moved since stage 2: probe again
                s = _probe(k, s - s % BUCKET, at)
            if s >= 0:
                if layout == LAYOUT_FLOAT32:
                    _copy_row(flat_out, i * dim, flat, s * dim, dim)
                else:
                    emit_row(rows, rows16, rows8, s, 0, out, out32, i, layout, dim)
                found[uj] = True
                hits += 1
                if track == TRACK_RECENCY:
                    stats[s] = tick
                elif track == TRACK_FREQUENCY and stats[s] < _INT32_MAX:
                    stats[s] += 1
            else:
                _copy_row(flat_out, i * dim, zeros, 0, dim)
                found[uj] = False
    return hits


#: Dims whose rows fill whole cache lines get a lookup kernel of their own (see
#: :func:`_lookup_kernel`).
LINE_DIMS = frozenset(range(16, 513, 16))


@functools.cache
def _lookup_kernel(indexed: bool, track: int, line_dim: int, ahead: int = _LOOKUP_AHEAD,
                   layout: int = LAYOUT_FLOAT32):
    """The compiled lookup of one case, made on first use.

    A function of its own per case (indexed or not, which statistic), as the six cases
    inlined into one function made LLVM keep the loop's values on the stack (a fifth of the
    rate); and per dim for the dims of :data:`LINE_DIMS` (``line_dim``, else 0 for any dim):
    with the dim a constant the row copy is one vector move per line, the prefetch of the
    row one instruction and the offsets shifts, 0.6x -> 0.8x ``np.take`` at 10M rows, dim 16.
    """

    @nb.njit(nogil=True, cache=True)
    def kernel(keys, pos, index, rows, cap, seed, stats, tick, out, found):
        return _lookup(keys, pos, indexed, index, rows, cap, seed, stats, track, tick, out,
                       found, line_dim, ahead, layout)  # fmt: skip

    return kernel


def lookup(keys, pos, indexed, index, rows, cap, seed, stats, track, tick, out, found,
           layout=LAYOUT_FLOAT32):  # fmt: skip
    """Copy the vectors of ``keys`` into ``out``; set ``found``; return how many were found.

    ``layout`` (:mod:`tierserve.ps.row_kernels`) decodes compact stored rows into float32
    ``out`` as they are copied (0: the stored words are the float32 values); each layout is a
    kernel of its own, like each case below.

    With ``indexed`` only the keys ``keys[pos[j]]`` are looked up, their rows written to
    ``out[pos[j]]`` and their flags to ``found[j]`` (one partition's share of a request:
    threads working other partitions write other bytes of ``out``, and flags of their own
    array, so no cache line of flags is written by two threads).  Rows of keys not found are
    zeroed.  ``track`` 1 stamps found slots with ``tick`` in ``stats``,
    2 counts the access.  Three stages run ``_LOOKUP_AHEAD`` keys apart: prefetch the home bucket,
    find the key in it (and prefetch its row), check the key and copy the row.  ``out`` is
    C-contiguous.  Releases the GIL.
    """
    dim = out.shape[1]
    line_dim = dim if dim in LINE_DIMS else 0
    kernel = _lookup_kernel(bool(indexed), int(track), line_dim, layout=int(layout))
    return kernel(keys, pos, index, rows, cap, seed, stats, tick, out, found)


@nb.njit(nogil=True, cache=True)
def find(keys, index, cap, seed, slots):
    """Write each key's slot (or -1 when absent) to ``slots``."""
    at = address_of(index)
    n = keys.size
    for i in range(n):
        if i + _AHEAD < n:
            prefetch(index, _home(_mix(keys[i + _AHEAD], seed), cap))
        k = keys[i]
        if k <= DELETED_KEY:
            slots[i] = -1
        else:
            slots[i] = _probe(k, _home(_mix(k, seed), cap), at)


@nb.njit(nogil=True, cache=True)
def insert(keys, emb, index, rows, cap, seed, stats, stat, track, limit, used):
    """Insert or overwrite ``keys[i]`` with ``emb[i]``, in order (a repeated key: the last wins).

    A new key takes the first deleted slot of its probe, else the empty slot ending it.  New
    slots get the statistic ``stat``; overwritten ones get it only when ``track`` is 1
    (recency).  Stops before a key that needs an empty slot when ``used`` (slots ever
    filled) reached ``limit`` or the probe reached the last slot.  Returns ``(keys done,
    new keys, used)``: the caller grows the table and goes on from there.  Pipelined as the
    lookup: the home bucket's line ``2 * _AHEAD`` keys ahead, the row of the slot the key
    would take ``_AHEAD`` keys ahead.
    """
    dim = emb.shape[1]
    flat = rows.reshape(-1)
    flat_emb = emb.reshape(-1)
    at = address_of(index)
    n = keys.size
    nslots = index.size
    new = 0
    keep_stats = stats.size > 0
    for j in range(-2 * _AHEAD, n):
        a = j + 2 * _AHEAD
        if a < n:
            prefetch_write(index, _home(_mix(keys[a], seed), cap))
        b = j + _AHEAD
        if b >= 0 and b < n:
            k = keys[b]
            _prefetch_row(flat, _place(k, _home(_mix(k, seed), cap), nslots, at, True), dim, True)
        if j < 0:
            continue
        k = keys[j]
        s = _place(k, _home(_mix(k, seed), cap), nslots, at, True)
        t = index[s]
        if t == EMPTY_KEY:
            if used >= limit or s >= nslots - 1:
                return j, new, used
            used += 1
        _copy_row(flat, s * dim, flat_emb, j * dim, dim)
        if t == k:  # overwritten
            if track == TRACK_RECENCY:
                stats[s] = stat
            continue
        if keep_stats:
            stats[s] = stat
        index[s] = k  # publish last
        new += 1
    return n, new, used


@nb.njit(nogil=True, cache=True)
def load_region(keys, emb, lo, hi, stop, index, rows, cap, seed, stats, stat, deferred):
    """Insert those of ``keys`` whose home slot is in ``[lo, hi)`` (a repeated key: the last
    wins) into a table that is being loaded and has neither deletions nor readers, using no
    slot from ``stop`` on.

    One thread per region of home slots loads a table at once: each reads all the keys and
    takes its own (hashing a key costs far less than the memory its insert touches), a
    region's keys probe only its own slots, and a key whose probe reaches ``stop`` (the next
    region) is left for a pass with :func:`insert` after all regions are done (its positions,
    in order, go to ``deferred``).  Returns ``(keys deferred, new keys)``.
    """
    dim = emb.shape[1]
    flat = rows.reshape(-1)
    flat_emb = emb.reshape(-1)
    at = address_of(index)
    n = keys.size
    keep_stats = stats.size > 0
    new = 0
    left = 0
    # about _AHEAD keys of this region ahead; the homes, computed once, wait in a ring
    ahead = min(_AHEAD * max(1, cap // max(1, hi - lo)), _LOAD_RING // 2 - 1)
    home = np.empty(_LOAD_RING, np.int64)
    mask = _LOAD_RING - 1
    for j in range(-2 * ahead, n):
        a = j + 2 * ahead
        if a < n:
            s = _home(_mix(keys[a], seed), cap)
            home[a & mask] = s
            if s >= lo and s < hi:
                prefetch_write(index, s)
        b = j + ahead
        if b >= 0 and b < n:
            s = home[b & mask]
            if s >= lo and s < hi:
                s = _place(keys[b], s, stop, at, False)
                if s < stop:
                    _prefetch_row(flat, s, dim, True)
        if j < 0:
            continue
        s = home[j & mask]
        if s < lo or s >= hi:
            continue
        k = keys[j]
        s = _place(k, s, stop, at, False)
        if s >= stop:
            deferred[left] = j
            left += 1
            continue
        _copy_row(flat, s * dim, flat_emb, j * dim, dim)
        if index[s] != k:
            if keep_stats:
                stats[s] = stat
            index[s] = k
            new += 1
    return left, new


@nb.njit(nogil=True, cache=True)
def rehash(old_index, old_rows, old_stats, index, rows, cap, seed, stats):
    """Copy every live slot of the old arrays into the empty new ones; False if they overflow."""
    nslots = index.size
    keep_stats = stats.size > 0 and old_stats.size > 0
    dim = rows.shape[1]
    flat, old_flat = rows.reshape(-1), old_rows.reshape(-1)
    at = address_of(index)
    n = old_index.size
    for o in range(-_AHEAD, n):
        a = o + _AHEAD
        if a < n and old_index[a] > DELETED_KEY:
            prefetch_write(index, _home(_mix(old_index[a], seed), cap))
        if o < 0:
            continue
        k = old_index[o]
        if k <= DELETED_KEY:
            continue
        s = _home(_mix(k, seed), cap)
        while True:  # no deletions in the new table: the first empty slot from the home
            empty = bucket_matches(at, s, EMPTY_KEY)
            if empty:
                s += trailing_zeros(empty)
                break
            s += BUCKET
        if s >= nslots - 1:
            return False
        _copy_row(flat, s * dim, old_flat, o * dim, dim)
        if keep_stats:
            stats[s] = old_stats[o]
        index[s] = k
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
