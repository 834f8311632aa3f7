"""The algorithm of the CUDA insert kernel (``ts_cache_insert``), written out in Python step by
step as the kernel does it (blocks owning sets, two passes, chunks, ranks), against the numpy
reference (``cpu_kernels.plan_insert`` + ``apply_insert``), key by key, on the CPU.

The kernel itself runs only on a device (``tests/cache/test_gpu.py``); this checks that its
chunked, rank-based placement is the reference's one-key-at-a-time rule, over crowded sets,
cached keys, the empty marker, slots stamped by the current batch and wrapped ticks.
"""

from __future__ import annotations

import numpy as np
import pytest

from tierserve.cache import cpu_kernels
from tierserve.cache.hashing import set_of
from tierserve.cache.slots import EMPTY

AGE_EMPTY = 2**32


def kernel_model(keys, vectors, table_keys, ticks, values, tick, owners, chunk):
    """``(slots, inserted, evicted)`` of ``ts_cache_insert`` with ``owners`` blocks of
    ``chunk`` threads, changing the tables in place as the kernel does."""
    num_sets, ways = table_keys.shape
    flat = table_keys.reshape(-1)
    now = tick & 0xFFFFFFFF
    n = keys.size
    sets = set_of(keys, num_sets)
    slots = np.full(n, -3, dtype=np.int64)  # -3: never written (a bug if it stays)
    inserted = evicted = 0

    def age(slot):
        return AGE_EMPTY if flat[slot] == EMPTY else (now - int(ticks[slot])) & 0xFFFFFFFF

    for owner in range(owners):  # blocks touch disjoint sets: in any order
        for i in range(n):  # 1. mark
            if sets[i] % owners != owner:
                continue
            row = flat[sets[i] * ways : (sets[i] + 1) * ways]
            slots[i] = -1 if keys[i] == EMPTY or (row == keys[i]).any() else -2
        for start in range(0, n, chunk):  # 2. place
            chunk_keys = [i for i in range(start, min(n, start + chunk))
                          if sets[i] % owners == owner and slots[i] == -2]
            chosen = {}
            for i in chunk_keys:  # every read before any write of the chunk
                rank = sum(1 for j in chunk_keys if sets[j] == sets[i] and j < i)
                first = int(sets[i]) * ways
                ages = [age(first + w) for w in range(ways)]
                chosen[i] = -1
                for w in range(ways):
                    if ages[w] <= 0:
                        continue
                    position = sum(1 for v in range(ways)
                                   if ages[v] > ages[w] or (ages[v] == ages[w] and v < w))
                    if position == rank:
                        chosen[i] = first + w
                        break
            for i, slot in chosen.items():
                slots[i] = slot
                if slot >= 0:
                    evicted += flat[slot] != EMPTY
                    inserted += 1
                    flat[slot] = keys[i]
                    ticks[slot] = now
                    values[slot] = vectors[i]
    return slots, inserted, evicted


def reference(keys, vectors, table_keys, ticks, values, tick):
    slots = np.empty(keys.size, dtype=np.int64)
    evicted = cpu_kernels.plan_insert(keys, table_keys, ticks, tick, slots)
    inserted = cpu_kernels.apply_insert(keys, vectors, slots, table_keys, values)
    return slots, int(inserted), int(evicted)


def crowded_table(rng, num_sets, ways, dim, tick):
    """A table partly full, some slots stamped ``tick`` (used by this batch), ticks that
    wrap around 2**32 relative to ``tick``."""
    table_keys = np.full((num_sets, ways), EMPTY, dtype=np.int64)
    ticks = np.zeros(num_sets * ways, dtype=np.uint32)
    values = np.zeros((num_sets * ways, dim), dtype=np.float32)
    held = rng.choice(np.arange(1, 10 * num_sets * ways), num_sets * ways, replace=False)
    full = rng.random(num_sets * ways) < 0.6
    table_keys.reshape(-1)[full] = held[full]
    ticks[:] = (tick - rng.integers(0, 6, ticks.size)) & 0xFFFFFFFF  # 0: stamped by this batch
    return table_keys, ticks, values


@pytest.mark.parametrize("ways", [1, 2, 4, 5])
@pytest.mark.parametrize("owners,chunk", [(1, 32), (3, 32), (7, 64), (1, 512)])
@pytest.mark.parametrize("tick", [9, 2**32 + 2])
def test_the_kernel_algorithm_places_keys_as_the_numpy_kernels(ways, owners, chunk, tick):
    rng = np.random.default_rng(ways * 1000 + owners * 10 + chunk + tick % 7)
    num_sets, dim = 13, 3
    table = crowded_table(rng, num_sets, ways, dim, tick)
    held = table[0].reshape(-1)
    held = held[held != EMPTY]
    new = rng.choice(np.arange(10**6, 10**6 + 1000), 150, replace=False)
    keys = np.concatenate([new, rng.choice(held, min(10, held.size), replace=False), [EMPTY]])
    keys = rng.permutation(keys).astype(np.int64)  # unique; cached ones and EMPTY mixed in
    vectors = rng.standard_normal((keys.size, dim)).astype(np.float32)
    model = [a.copy() for a in table]
    ref = [a.copy() for a in table]
    got = kernel_model(keys, vectors, *model, tick, owners, chunk)
    want = reference(keys, vectors, *ref, tick)
    np.testing.assert_array_equal(got[0], want[0])  # the slot of every key
    assert got[1:] == want[1:]  # inserted, evicted
    assert want[1] > 0 and want[2] > 0 and (want[0] == -1).sum() > 11  # crowded: some lose
    for a, b in zip(model, ref):
        np.testing.assert_array_equal(a, b)
