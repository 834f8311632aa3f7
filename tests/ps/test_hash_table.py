"""The hash table against a dict, under random inserts, overwrites, removals, growth."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ps_helpers import agree

from tierserve.core.errors import InvalidInputError
from tierserve.ps.eviction import EvictOldest
from tierserve.ps.hash_table import EMPTY, TOMB, HashTable


@pytest.mark.parametrize("track", [None, "recency", "frequency"])
def test_random_operations_match_a_dict(track):
    rng = np.random.default_rng(42)
    dim = 3
    table, ref = HashTable(dim, track=track), {}
    pool = np.unique(rng.integers(-(2**40), 2**40, 6000))
    for step in range(60):
        op = rng.integers(0, 4)
        if op <= 1:  # insert / overwrite, with repeats inside the batch
            keys = rng.choice(pool, rng.integers(1, 400))
            emb = rng.standard_normal((keys.size, dim)).astype(np.float32)
            table.insert(keys, emb)
            for k, e in zip(keys.tolist(), emb):
                ref[k] = e
        elif op == 2:
            keys = rng.choice(pool, rng.integers(1, 200))
            removed = table.remove(keys)
            present = {k for k in set(keys.tolist()) if k in ref}
            assert removed == len(present)
            for k in present:
                del ref[k]
        else:
            keys = rng.choice(pool, 300)
            _, found = table.lookup(keys)
            np.testing.assert_array_equal(found, [k in ref for k in keys.tolist()])
        if step % 10 == 9:
            agree(table, ref, dim, rng)
    agree(table, ref, dim, rng)


def test_load_then_update_and_grow():
    rng = np.random.default_rng(1)
    keys = rng.permutation(50_000).astype(np.int64) * 7919
    emb = rng.standard_normal((keys.size, 4)).astype(np.float32)
    table = HashTable(4, track="recency")
    table.load(keys, emb)
    got, found = table.lookup(keys)
    assert found.all()
    np.testing.assert_array_equal(got, emb)
    more = keys.max() + 1 + np.arange(80_000)
    table.insert(more, np.ones((more.size, 4), np.float32))  # forces growth
    assert len(table) == keys.size + more.size
    np.testing.assert_array_equal(table.lookup(keys[:1000])[0], emb[:1000])
    assert table.lookup(more)[1].all()


def test_load_keeps_the_last_of_repeated_keys():
    table = HashTable(2)
    table.load(np.array([3, 4, 3]), np.array([[1, 1], [2, 2], [3, 3]], np.float32))
    assert len(table) == 2
    np.testing.assert_array_equal(table.lookup(np.array([3, 4]))[0], [[3, 3], [2, 2]])


def test_evict_to_compacts_memory():
    table = HashTable(8, track="recency")
    table.insert(np.arange(10_000), np.ones((10_000, 8), np.float32))
    before = table.nbytes
    table.evict_to(1000, EvictOldest(), np.random.default_rng(0))
    assert len(table) == 1000 and table.nbytes < before / 4


def test_reserved_keys():
    table = HashTable(2)
    with pytest.raises(InvalidInputError):
        table.insert(np.array([EMPTY]), np.zeros((1, 2), np.float32))
    table.insert(np.array([0, -1]), np.ones((2, 2), np.float32))
    assert not table.lookup(np.array([EMPTY, TOMB]))[1].any()


@pytest.mark.parametrize("dim", [2, 16])
def test_reserved_keys_are_never_found_in_the_slots_they_mark(dim):
    # The index marks empty and deleted slots with the two reserved keys: asking for them
    # must not find those slots (nor delete them).
    table = HashTable(dim)
    keys = np.arange(1, 3001, dtype=np.int64)
    table.insert(keys, np.ones((keys.size, dim), np.float32))
    table.remove(keys[:500])  # tombstones, not enough to rebuild
    assert table._state.used > table._state.live
    marks = np.array([EMPTY, TOMB] * 50)
    got, found = table.lookup(marks)
    assert not found.any() and not got.any()
    out = np.ones((marks.size, dim), np.float32)
    hits = table.lookup_into(marks, np.arange(marks.size, dtype=np.int64), out,
                             np.empty(marks.size, bool))  # fmt: skip
    assert hits == 0 and not out.any()
    assert not table.contains(marks).any()
    before = (table._state.live, table._state.used, table._state.index.copy())
    assert table.remove(marks) == 0
    assert (table._state.live, table._state.used) == before[:2]
    np.testing.assert_array_equal(table._state.index, before[2])
    assert table.lookup(keys[500:])[1].all()


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(-(2**63) + 2, 2**63 - 1), max_size=300))
def test_any_int64_keys(keys):
    keys = np.array(keys, dtype=np.int64)
    table = HashTable(1)
    table.insert(keys, keys.astype(np.float32)[:, None])
    uniq = np.unique(keys)
    got, found = table.lookup(uniq)
    assert found.all() and len(table) == uniq.size
    np.testing.assert_array_equal(got[:, 0], uniq.astype(np.float32))


def test_load_with_many_repeats_keeps_each_last_vector():
    rng = np.random.default_rng(3)
    keys = rng.integers(0, 3000, 20_000)
    emb = np.arange(keys.size, dtype=np.float32)[:, None]
    table = HashTable(1)
    table.load(keys, emb)
    uniq = np.unique(keys)
    last = {k: i for i, k in enumerate(keys.tolist())}
    got, found = table.lookup(uniq)
    assert found.all() and len(table) == uniq.size
    np.testing.assert_array_equal(got[:, 0], [last[k] for k in uniq.tolist()])
