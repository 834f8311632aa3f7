"""The hash table's kernels at their edges, against a dict or numpy reference.

Extreme keys through every lookup path, the insert kernel's stop at its fill limit, probes
that run into the end of the table's padding (inserts, loads and lookups of absent keys),
and eviction at capacity by exact statistics.
"""

from __future__ import annotations

import numpy as np
import pytest
from ps_helpers import agree, home_slots

from tierserve.ps import hash_kernels, hash_table
from tierserve.ps.eviction import EvictLeastUsed, EvictOldest
from tierserve.ps.hash_table import HashTable

EDGE_KEYS = np.array(
    [0, -1, 1, 2**63 - 1, 2**63 - 2, -(2**63) + 2, -(2**63) + 3, 2**62, -(2**62), 2**32, -(2**32)],
    dtype=np.int64,
)


def _look(table: HashTable, keys: np.ndarray, indexed: bool):
    """``(rows, found)`` through the plain or the indexed (one partition's share) kernel."""
    keys = np.ascontiguousarray(keys, dtype=np.int64)
    out = np.full((keys.size, table.dim), np.nan, np.float32)
    found = np.empty(keys.size, bool)
    pos = np.arange(keys.size, dtype=np.int64) if indexed else None
    hits = table.lookup_into(keys, pos, out, found)
    assert hits == found.sum()
    return out, found


def _check(table: HashTable, ref: dict, query: np.ndarray, indexed: bool) -> None:
    out, found = _look(table, query, indexed)
    want = np.array([k in ref for k in query.tolist()])
    np.testing.assert_array_equal(found, want)
    expect = np.zeros((query.size, table.dim), np.float32)
    for i, k in enumerate(query.tolist()):
        if k in ref:
            expect[i] = ref[k]
    np.testing.assert_array_equal(out, expect)  # rows of absent keys are zero


@pytest.mark.parametrize("indexed", [False, True])
@pytest.mark.parametrize("dim", [1, 16, 17, 32])
def test_extreme_keys_through_insert_overwrite_remove_and_load(dim, indexed):
    rng = np.random.default_rng(dim)
    table, ref = HashTable(dim), {}
    others = rng.integers(-(2**63) + 2, 2**63 - 1, 3000, dtype=np.int64)
    keys = np.concatenate([EDGE_KEYS, others])
    emb = rng.standard_normal((keys.size, dim)).astype(np.float32)
    assert table.insert(keys, emb) == np.unique(keys).size
    ref.update(zip(keys.tolist(), emb))
    absent = np.array([5, -5, 2**63 - 3, -(2**63) + 4], dtype=np.int64)
    query = rng.permutation(np.concatenate([EDGE_KEYS, others[:500], absent]))
    _check(table, ref, query, indexed)
    again = rng.standard_normal((EDGE_KEYS.size, dim)).astype(np.float32)
    assert table.insert(EDGE_KEYS, again) == 0  # overwrites only
    ref.update(zip(EDGE_KEYS.tolist(), again))
    _check(table, ref, query, indexed)
    gone = EDGE_KEYS[::2]
    assert table.remove(gone) == gone.size
    for k in gone.tolist():
        del ref[k]
    _check(table, ref, query, indexed)
    assert table.insert(gone, again[::2]) == gone.size  # into the tombstones
    ref.update(zip(gone.tolist(), again[::2]))
    _check(table, ref, query, indexed)
    table.load(keys[::-1], emb[::-1])  # a load keeps the last of each repeat
    ref = dict(zip(keys[::-1].tolist(), emb[::-1]))
    _check(table, ref, query, indexed)
    agree(table, ref, dim, rng, probes=absent)


def test_insert_kernel_stops_at_its_fill_limit_as_a_dict_would():
    """The kernel inserts in order and stops before the first key that needs a fresh slot
    once ``limit`` slots are used; overwrites of present keys never stop."""
    rng = np.random.default_rng(1)
    dim = 5
    st = hash_table._State(4096, dim, False, 1)
    pool = rng.integers(-(2**62), 2**62, 900)
    keys = rng.choice(pool, 1500)  # repeats: overwrites within the batch
    emb = rng.standard_normal((keys.size, dim)).astype(np.float32)
    limit = 400
    ref: dict = {}
    stop = keys.size
    for i, k in enumerate(keys.tolist()):  # the reference: a dict that holds `limit` keys
        if k not in ref and len(ref) == limit:
            stop = i
            break
        ref[k] = emb[i]
    done, new, used = hash_kernels.insert(keys, emb, st.index, st.rows, st.cap, st.seed,
                                          st.stats, 1, 0, limit, 0)  # fmt: skip
    assert (done, new, used) == (stop, limit, limit)
    live = st.index > hash_table.TOMB
    assert sorted(st.index[live].tolist()) == sorted(ref)
    for s in np.flatnonzero(live).tolist():
        np.testing.assert_array_equal(st.rows[s], ref[int(st.index[s])])
    present = np.fromiter(ref, np.int64)
    vec = np.ones((present.size, dim), np.float32)
    assert hash_kernels.insert(present, vec, st.index, st.rows, st.cap, st.seed, st.stats, 1,
                               0, limit, used) == (present.size, 0, limit)  # fmt: skip
    assert (st.rows[live] == 1).all()


def _last_bucket_keys(cap: int, seed: int, n: int, rng) -> np.ndarray:
    """``n`` distinct keys whose home is the table's last home bucket (slots cap-8 .. cap-1)."""
    got: list[np.ndarray] = []
    while sum(g.size for g in got) < n:
        c = rng.integers(-(2**62), 2**62, 4_000_000)
        got.append(c[home_slots(c, seed, cap) == cap - 8])
    return np.unique(np.concatenate(got))[:n]


@pytest.mark.parametrize("indexed", [False, True])
def test_probes_that_reach_the_end_of_the_padding(indexed):
    # Keys homed in the last bucket probe into the padding past `cap`; the last slot stays
    # empty, so a lookup of an absent key with that home ends there; an insert that would
    # take it rebuilds the table instead (with a new hash), losing nothing.
    rng = np.random.default_rng(7)
    dim = 16
    table = HashTable(dim)
    base = rng.integers(-(2**62), 2**62, 900)
    table.insert(base, np.zeros((base.size, dim), np.float32))
    st = table._state
    tail = st.index[st.cap - 8 : -1]  # from the last home bucket on, the last slot excluded
    room = int((tail == hash_table.EMPTY).sum())
    crowd = _last_bucket_keys(st.cap, st.seed, room + 40, rng)
    fits, absent = crowd[: room - 2], crowd[room - 2 :]
    emb = rng.standard_normal((crowd.size, dim)).astype(np.float32)
    table.insert(fits, emb[: fits.size])
    assert table._state is st  # no rebuild yet: the padding took them
    assert (tail == hash_table.EMPTY).sum() == 2 and st.index[-1] == hash_table.EMPTY
    ref = dict(zip(base.tolist(), np.zeros((base.size, dim), np.float32)))
    ref.update(zip(fits.tolist(), emb[: fits.size]))
    _check(table, ref, rng.permutation(np.concatenate([fits, absent, base[:50]])), indexed)
    table.insert(crowd, emb)  # more than the padding holds: a rebuild
    assert table._state is not st and table._state.index[-1] == hash_table.EMPTY
    ref.update(zip(crowd.tolist(), emb))
    _check(table, ref, rng.permutation(np.concatenate([crowd, base])), indexed)
    agree(table, ref, dim, rng)


def test_a_load_that_overflows_the_padding_retries_larger():
    rng = np.random.default_rng(8)
    dim = 4
    table = HashTable(dim)
    n = 2000
    cap = HashTable._cap_for(n)
    seed = hash_table._State(cap, dim, False, table._generation + 1).seed  # the load's hash
    room = hash_table._slots(cap) - 1 - (cap - 8)
    crowd = _last_bucket_keys(cap, seed, room + 10, rng)
    keys = np.concatenate([rng.integers(-(2**62), 2**62, n - crowd.size), crowd])
    rng.shuffle(keys)
    emb = rng.standard_normal((keys.size, dim)).astype(np.float32)
    table.load(keys, emb)
    assert table._state.cap > cap  # the first try ran off the end
    agree(table, dict(zip(keys.tolist(), emb)), dim, rng)


@pytest.mark.parametrize("indexed", [False, True])
def test_eviction_at_capacity_keeps_the_most_used(indexed):
    rng = np.random.default_rng(3)
    table = HashTable(3, track="frequency")
    keys = rng.permutation(600).astype(np.int64) * 1_000_003 - 2**40
    emb = rng.standard_normal((keys.size, 3)).astype(np.float32)
    table.insert(keys, emb)
    counts = rng.permutation(keys.size)  # distinct access counts: one right answer
    _look(table, rng.permutation(np.repeat(keys, counts)), indexed)
    target = 150
    assert table.evict_to(target, EvictLeastUsed(), rng) == keys.size - target
    kept = keys[np.argsort(counts)[-target:]]
    assert sorted(table.keys().tolist()) == sorted(kept.tolist())
    st = table._state  # the survivors keep their counts through the rebuild
    got = dict(zip(st.keys().tolist(), st.stats[st.live_slots()].tolist()))
    want = dict(zip(keys.tolist(), (counts + 1).tolist()))  # 1 on insert, then each access
    assert all(got[k] == want[k] for k in kept.tolist())
    agree(table, {k: emb[i] for i, k in enumerate(keys.tolist()) if k in set(kept.tolist())},
          3, rng)  # fmt: skip


@pytest.mark.parametrize("indexed", [False, True])
def test_eviction_at_capacity_keeps_the_most_recent(indexed):
    rng = np.random.default_rng(4)
    table = HashTable(2, track="recency")
    keys = rng.integers(-(2**62), 2**62, 300)
    table.insert(keys, np.ones((keys.size, 2), np.float32))
    order = rng.permutation(keys)
    for k in order:  # one access each, at distinct times
        _look(table, np.array([k, 2**61 + 1]), indexed)  # with an absent key beside it
    assert table.evict_to(40, EvictOldest(), rng) == keys.size - 40
    assert sorted(table.keys().tolist()) == sorted(order[-40:].tolist())
