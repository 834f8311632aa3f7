"""The compiled hash table (ps/hash_kernels.py behind ps/hash_table.py) against plain references.

A dict of key -> vector (and key -> statistic) is the reference; the table goes through random
inserts with repeats, overwrites, removals (tombstones, and their reuse), evictions, growth
and bulk loads, and must agree after every step.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
from ps_helpers import agree, home_slots

from tierserve.ps import hash_kernels, hash_table
from tierserve.ps.eviction import EvictLeastUsed, EvictOldest, EvictRandom
from tierserve.ps.hash_map import HashMapTier, ParallelHashMapConfig
from tierserve.ps.hash_table import HashTable
from tierserve.ps.partition import group_by_partition


@pytest.mark.parametrize("dim", [1, 5, 16])
def test_long_random_run_matches_a_dict(dim):
    rng = np.random.default_rng(dim)
    table, ref = HashTable(dim, track="recency"), {}
    # A small pool: many repeats, overwrites, removals and re-inserts into tombstones.
    pool = rng.integers(-(2**63) + 2, 2**63 - 1, 3000, dtype=np.int64)
    for step in range(120):
        op = rng.integers(0, 5)
        if op <= 1:
            keys = rng.choice(pool, rng.integers(1, 700))
            emb = rng.standard_normal((keys.size, dim)).astype(np.float32)
            new = table.insert(keys, emb)
            assert new == len(set(keys.tolist()) - set(ref))
            for k, e in zip(keys.tolist(), emb):
                ref[k] = e
        elif op == 2:
            keys = rng.choice(pool, rng.integers(1, 500))
            present = {k for k in set(keys.tolist()) if k in ref}
            assert table.remove(keys) == len(present)
            for k in present:
                del ref[k]
        elif op == 3 and ref:
            target = int(len(ref) * rng.uniform(0.3, 0.9))
            before = set(table.keys().tolist())
            gone = table.evict_to(target, EvictRandom(), rng)
            assert gone == len(ref) - target and len(table) == target
            left = set(table.keys().tolist())
            assert left <= before
            for k in before - left:
                del ref[k]
        else:
            keys = rng.choice(pool, 400)
            _, found = table.lookup(keys)
            np.testing.assert_array_equal(found, [k in ref for k in keys.tolist()])
        if step % 15 == 14:
            agree(table, ref, dim, rng, probes=pool)
    agree(table, ref, dim, rng, probes=pool)


def test_tombstones_are_reused_and_dropped_on_rebuild():
    rng = np.random.default_rng(5)
    table, ref = HashTable(4), {}
    keys = np.arange(1, 20_001, dtype=np.int64) * 104_729
    for _ in range(6):  # churn: remove half, insert as many new ones
        emb = rng.standard_normal((keys.size, 4)).astype(np.float32)
        table.insert(keys, emb)
        ref.update(zip(keys.tolist(), emb))
        drop = rng.choice(keys, keys.size // 2, replace=False)
        assert table.remove(drop) == np.unique(drop).size
        for k in np.unique(drop).tolist():
            del ref[k]
        keys = keys + 1
        agree(table, ref, 4, rng)
    st = table._state
    assert st.used - st.live <= max(st.live // 4, 1024)  # tombstones do not pile up


def test_growth_from_empty_by_small_batches():
    rng = np.random.default_rng(7)
    table, ref = HashTable(3), {}
    for _ in range(300):
        keys = rng.integers(0, 2**40, 97)
        emb = rng.standard_normal((keys.size, 3)).astype(np.float32)
        table.insert(keys, emb)
        ref.update(zip(keys.tolist(), emb))
    agree(table, ref, 3, rng)
    st = table._state
    assert st.used <= st.limit < st.cap and st.live / st.cap >= 0.4


def test_bulk_load_matches_inserts_and_keeps_the_last_repeat():
    rng = np.random.default_rng(11)
    keys = rng.integers(-(2**40), 2**40, 60_000)
    keys[::7] = keys[3]  # many repeats of one key, spread out
    emb = rng.standard_normal((keys.size, 6)).astype(np.float32)
    ref = dict(zip(keys.tolist(), emb))  # the last occurrence wins
    loaded = HashTable(6)
    loaded.load(keys, emb)
    agree(loaded, ref, 6, rng)
    inserted = HashTable(6)
    inserted.insert(keys, emb)
    agree(inserted, ref, 6, rng)
    loaded.load(keys[:10], emb[:10])  # a load replaces everything
    agree(loaded, dict(zip(keys[:10].tolist(), emb[:10])), 6, rng)


def _check_layout(table: HashTable, ref: dict) -> None:
    """The arrays hold what the module docstring of hash_kernels says, checked with numpy:
    each key in the index at its home slot or after it, every slot between occupied (a key
    or a tombstone), its vector in the same slot's row; the arrays start on cache lines."""
    st = table._state
    index, rows = st.index, st.rows
    assert index.ctypes.data % 64 == 0 and rows.ctypes.data % 64 == 0
    assert st.cap % 8 == 0 and index.size % 8 == 0 and index[-1] == hash_table.EMPTY
    live = np.flatnonzero(index > hash_table.TOMB)
    keys = index[live]
    assert sorted(keys.tolist()) == sorted(ref)
    homes = home_slots(keys, st.seed, st.cap)
    assert (homes <= live).all()
    empty = np.flatnonzero(index == hash_table.EMPTY)
    # the first empty slot at or after each home lies past the key's slot
    first_empty = empty[np.searchsorted(empty, homes)]
    assert (first_empty > live).all()
    np.testing.assert_array_equal(rows[live], np.stack([ref[k] for k in keys.tolist()]))


@pytest.mark.parametrize("dim", [1, 15, 16, 17, 48])
def test_layout_after_loads_inserts_and_removals(dim):
    rng = np.random.default_rng(dim)
    keys = rng.integers(-(2**62), 2**62, 20_000)
    emb = rng.standard_normal((keys.size, dim)).astype(np.float32)
    table = HashTable(dim)
    table.load(keys, emb)
    ref = dict(zip(keys.tolist(), emb))
    _check_layout(table, ref)
    gone = keys[::8]  # not enough tombstones to rebuild
    table.remove(gone)
    for k in gone.tolist():
        ref.pop(k, None)
    more = rng.integers(-(2**62), 2**62, 3000)  # into tombstones and empty slots
    more_emb = rng.standard_normal((more.size, dim)).astype(np.float32)
    table.insert(more, more_emb)
    ref.update(zip(more.tolist(), more_emb))
    _check_layout(table, ref)
    assert table._state.used > table._state.live  # tombstones are left


def _crowd(table: HashTable, n: int, rng) -> tuple[np.ndarray, np.ndarray]:
    """``n`` keys that share one home bucket of ``table``'s current generation, and as many
    other keys with that home bucket."""
    st = table._state
    candidates = rng.integers(-(2**62), 2**62, 2_000_000)
    homes = home_slots(candidates, st.seed, st.cap)
    bucket = np.bincount(homes // 8).argmax() * 8
    same = candidates[homes == bucket]
    assert same.size >= 2 * n
    return same[:n], same[n : 2 * n]


@pytest.mark.parametrize("indexed", [False, True])
@pytest.mark.parametrize("dim", [16, 5])
def test_keys_past_a_full_bucket(indexed, dim):
    # 20 keys with one home bucket fill it and the next two: lookups must follow them,
    # find none of 20 absent keys with the same home, and go on past tombstones
    rng = np.random.default_rng(dim)
    table = HashTable(dim)
    table.insert(rng.integers(0, 2**40, 1000), np.ones((1000, dim), np.float32))
    crowd, absent = _crowd(table, 20, rng)
    emb = rng.standard_normal((crowd.size, dim)).astype(np.float32)
    table.insert(crowd, emb)
    query = np.concatenate([crowd, absent])
    out = np.full((query.size, dim), 7.0, np.float32)
    found = np.empty(query.size, bool)
    pos = np.arange(query.size, dtype=np.int64) if indexed else None
    assert table.lookup_into(query, pos, out, found) == crowd.size
    np.testing.assert_array_equal(found, np.arange(query.size) < crowd.size)
    np.testing.assert_array_equal(out[: crowd.size], emb)
    assert not out[crowd.size :].any()
    table.remove(crowd[:12])  # tombstones before the others
    assert table.lookup_into(query, pos, out, found) == 8
    np.testing.assert_array_equal(
        found, (np.arange(query.size) >= 12) & (np.arange(query.size) < 20)
    )
    np.testing.assert_array_equal(out[12:20], emb[12:])
    table.insert(absent[:5], emb[:5])  # into the tombstones
    assert table._state.used == table._state.live + 7
    got, hit = table.lookup(np.concatenate([crowd[12:], absent[:5]]))
    assert hit.all()
    np.testing.assert_array_equal(got, np.concatenate([emb[12:], emb[:5]]))


@pytest.mark.parametrize("threads", [2, 3, 7])
@pytest.mark.parametrize("track", [None, "recency", "frequency"])
def test_parallel_load_matches_a_dict(monkeypatch, threads, track):
    # One thread per region of home slots; keys whose probe crosses into the next region
    # are inserted after the threads are done: the run must take that path too.
    monkeypatch.setattr(hash_table, "_load_threads", lambda n: threads)
    kernel, left = hash_kernels.load_region, []

    def counting(*args):
        result = kernel(*args)
        left.append(result[0])
        return result

    monkeypatch.setattr(hash_kernels, "load_region", counting)
    rng = np.random.default_rng(threads)
    table = HashTable(3, track=track)
    # Homes of candidate keys in the generation the load will build; 300 keys with homes in
    # the 100 slots before the first region's end cannot all stay in that region.
    n = 40_000
    cap = HashTable._cap_for(n)
    seed = hash_table._State(cap, 3, False, table._generation + 1).seed
    candidates = rng.integers(-(2**40), 2**40, 400_000)
    homes = home_slots(candidates, seed, cap)
    stop = cap // threads
    crowd = candidates[(homes >= stop - 100) & (homes < stop)][:300]
    assert crowd.size == 300
    keys = np.concatenate([rng.integers(-(2**40), 2**40, n - crowd.size), crowd])
    rng.shuffle(keys)
    keys[::5] = keys[7]  # repeats of one key, spread out: the last one wins
    emb = rng.standard_normal((keys.size, 3)).astype(np.float32)
    table.load(keys, emb)
    assert len(left) == threads and sum(left) > 0
    st = table._state
    assert st.live == st.used == np.unique(keys).size
    if track is not None:  # before any lookup counts or stamps
        assert (st.stats[st.live_slots()] == (table._tick if track == "recency" else 1)).all()
    agree(table, dict(zip(keys.tolist(), emb)), 3, rng)
    table.insert(rng.integers(2**41, 2**42, 1000), np.ones((1000, 3), np.float32))
    assert len(table) == np.unique(keys).size + 1000  # the loaded table takes inserts


def test_load_from_a_read_only_memory_map(tmp_path):
    rng = np.random.default_rng(2)
    keys = rng.permutation(5000).astype(np.int64) * 31
    emb = rng.standard_normal((keys.size, 8)).astype(np.float32)
    keys.tofile(tmp_path / "k")
    emb.tofile(tmp_path / "e")
    mk = np.memmap(tmp_path / "k", dtype=np.int64, mode="r")
    me = np.memmap(tmp_path / "e", dtype=np.float32, mode="r").reshape(-1, 8)
    table = HashTable(8)
    table.load(mk, me)
    agree(table, dict(zip(keys.tolist(), emb)), 8, rng)


def _look(table, keys, indexed):
    """A lookup through the kernel's plain or its indexed (one partition's share) path."""
    keys = np.ascontiguousarray(keys, dtype=np.int64)
    out = np.empty((keys.size, table.dim), np.float32)
    found = np.empty(keys.size, bool)
    pos = np.arange(keys.size, dtype=np.int64) if indexed else None
    table.lookup_into(keys, pos, out, found)


@pytest.mark.parametrize("indexed", [False, True])
@pytest.mark.parametrize("policy", [EvictOldest(), EvictLeastUsed()])
def test_statistics_follow_the_accesses(policy, indexed):
    rng = np.random.default_rng(3)
    table = HashTable(2, track=policy.track)
    keys = np.arange(1000, dtype=np.int64) * 7 + 1
    table.insert(keys, np.zeros((1000, 2), np.float32))
    hot = keys[rng.choice(1000, 100, replace=False)]
    for _ in range(3):
        _look(table, hot, indexed)
    _look(table, rng.integers(2**50, 2**51, 300), indexed)  # absent keys change nothing
    table.evict_to(100, policy, rng)
    assert np.array_equal(np.sort(table.keys()), np.sort(hot))
    live = table._state.live_slots()
    stats = table._state.stats[live]
    if policy.track == "frequency":
        assert (stats == 1 + 3).all()  # inserted with 1, three lookups
    else:
        assert (stats == stats.max()).all()  # stamped by the last lookup


def test_evicting_tied_entries_keeps_the_table_compact():
    # Equal statistics: the policy's victims follow slot order, so the survivors hold one
    # stretch of hash values; the next generation's seed must spread them again.
    for seed in range(3):
        table = HashTable(8, track="recency")
        table.insert(np.arange(40_000) * (seed + 3), np.ones((40_000, 8), np.float32))
        table.evict_to(2000, EvictOldest(), np.random.default_rng(seed))
        assert len(table) == 2000
        assert table._state.cap == HashTable._cap_for(2000)


def test_lookup_into_writes_only_its_positions():
    rng = np.random.default_rng(4)
    table = HashTable(3)
    keys = rng.integers(0, 2**40, 500)
    emb = rng.standard_normal((500, 3)).astype(np.float32)
    table.insert(keys, emb)
    query = np.concatenate([keys[:50], rng.integers(2**41, 2**42, 50)])
    pos = np.arange(0, 100, 3, dtype=np.int64)
    out = np.full((100, 3), 7.0, np.float32)
    found = np.zeros(100, bool)
    hits = table.lookup_into(query, pos, out, found)
    assert hits == np.count_nonzero(pos < 50)
    rest = np.setdiff1d(np.arange(100), pos)
    assert (out[rest] == 7.0).all() and not found[pos.size :].any()  # flags in pos order
    np.testing.assert_array_equal(found[: pos.size], pos < 50)
    np.testing.assert_array_equal(out[pos[pos < 50]], emb[pos[pos < 50]])
    assert not out[pos[pos >= 50]].any()  # rows of keys not found are zero


@pytest.mark.parametrize("parts", [1, 3, 16, 300])
def test_partition_kernel_matches_numpy_grouping(parts):
    keys = np.random.default_rng(parts).integers(-(2**63), 2**63 - 1, 5000, dtype=np.int64)
    order, bounds = hash_kernels.group_by_partition(keys, parts)
    want_order, want_bounds = group_by_partition(keys, parts)
    np.testing.assert_array_equal(bounds, want_bounds)
    np.testing.assert_array_equal(order, want_order)


def test_parallel_hash_map_agrees_with_one_table():
    rng = np.random.default_rng(9)
    tier = HashMapTier(ParallelHashMapConfig(num_partitions=4))
    tier.create_table("t", 5)
    keys = rng.integers(-(2**62), 2**62, 30_000)
    emb = rng.standard_normal((keys.size, 5)).astype(np.float32)
    tier.load_table("t", keys, emb)
    ref = dict(zip(keys.tolist(), emb))
    more = rng.integers(-(2**62), 2**62, 5000)
    more_emb = rng.standard_normal((more.size, 5)).astype(np.float32)
    tier.insert("t", more, more_emb)
    ref.update(zip(more.tolist(), more_emb))
    assert tier.evict("t", keys[:1000]) == len(set(keys[:1000].tolist()))
    for k in keys[:1000].tolist():
        ref.pop(k, None)
    query = rng.permutation(np.concatenate([keys, more, rng.integers(2**62, 2**63 - 1, 999)]))
    got, found = tier.lookup("t", query)
    np.testing.assert_array_equal(found, [k in ref for k in query.tolist()])
    np.testing.assert_array_equal(got[found], np.stack([ref[k] for k in query[found].tolist()]))
    assert tier.size("t") == len(ref) and sum(tier.partition_sizes("t")) == len(ref)
    tier.close()


def test_readers_never_see_a_key_without_its_vector():
    """Lock-free lookups while a writer inserts (and grows the table): a key found has its
    own vector (each vector holds its key), and keys inserted before the reader started are
    always found."""
    table = HashTable(4)
    base = np.arange(1, 2001, dtype=np.int64)
    table.insert(base, np.repeat(base.astype(np.float32)[:, None], 4, axis=1))
    stop = threading.Event()
    errors: list[str] = []

    def reader():
        rng = np.random.default_rng(0)
        while not stop.is_set():
            q = rng.integers(1, 200_000, 4000)
            got, found = table.lookup(q)
            if not (got[found] == q[found].astype(np.float32)[:, None]).all():
                errors.append("a found key had another vector")
            if not found[q <= 2000].all():
                errors.append("a key inserted earlier was not found")

    t = threading.Thread(target=reader)
    t.start()
    try:
        for start in range(2001, 200_000, 5000):
            k = np.arange(start, min(start + 5000, 200_000), dtype=np.int64)
            table.insert(k, np.repeat(k.astype(np.float32)[:, None], 4, axis=1))
    finally:
        stop.set()
        t.join()
    assert not errors, errors[:3]
    assert len(table) == 199_999


@pytest.mark.parametrize("indexed", [False, True])
@pytest.mark.parametrize("dim", [1, 15, 16, 17, 32, 100, 128])
def test_lookup_of_every_dim_matches_numpy(dim, indexed):
    # dims of whole cache lines (16, 32, 128) have kernels of their own, the others share one
    rng = np.random.default_rng(dim)
    keys = np.unique(rng.integers(-(2**62), 2**62, 5000))
    emb = rng.standard_normal((keys.size, dim)).astype(np.float32)
    table = HashTable(dim, track="frequency")
    table.load(keys, emb)
    n = 3000
    query = np.where(rng.random(n) < 0.8, keys[rng.integers(0, keys.size, n)],
                     rng.integers(2**62, 2**63 - 1, n))  # fmt: skip
    present = np.isin(query, keys)
    want = np.zeros((n, dim), np.float32)
    want[present] = emb[np.searchsorted(keys, query[present])]
    out = np.full((n, dim), np.nan, np.float32)
    found = np.empty(n, bool)
    pos = rng.permutation(n)[: n // 2].astype(np.int64) if indexed else None
    hits = table.lookup_into(query, pos, out, found)
    sel = pos if indexed else np.arange(n)
    assert hits == present[sel].sum()
    np.testing.assert_array_equal(found[: sel.size], present[sel])
    np.testing.assert_array_equal(out[sel], want[sel])
    assert np.isnan(out[np.setdiff1d(np.arange(n), sel)]).all()  # nothing else written
    st = table._state
    counts = dict(zip(st.keys().tolist(), st.stats[st.live_slots()].tolist()))
    looked = np.unique(query[sel][present[sel]], return_counts=True)
    assert all(counts[k] == 1 + c for k, c in zip(*[a.tolist() for a in looked]))


def test_readers_never_see_another_keys_vector_while_slots_are_reused():
    """Lock-free lookups while a writer deletes keys and inserts others into their slots: a
    key found has its own vector (each vector holds its key)."""
    table = HashTable(16)
    keys = np.arange(1, 20_001, dtype=np.int64)

    def vectors(k):
        return np.repeat(k.astype(np.float32)[:, None], 16, axis=1)

    table.insert(keys, vectors(keys))
    stop = threading.Event()
    errors: list[str] = []

    def reader():
        rng = np.random.default_rng(0)
        while not stop.is_set():
            q = rng.integers(1, 40_001, 4000)
            got, found = table.lookup(q)
            if not (got[found] == q[found].astype(np.float32)[:, None]).all():
                errors.append("a found key had another key's vector")

    t = threading.Thread(target=reader)
    t.start()
    try:
        rng = np.random.default_rng(1)
        for _ in range(150):
            gone = rng.choice(keys, 1000, replace=False)
            table.remove(gone)
            other = rng.integers(20_001, 40_001, 1000)  # takes the tombstones
            table.insert(other, vectors(other))
            table.remove(other)
            table.insert(gone, vectors(gone))
    finally:
        stop.set()
        t.join()
    assert not errors, errors[:3]
    assert len(table) == keys.size and table.lookup(keys)[1].all()
