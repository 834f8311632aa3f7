"""Many threads querying while updates arrive: no wrong vector, nothing older than the last
update applied before the query started, no deadlock."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from cache_helpers import DIM, MODEL, TABLE, vectors_for
from polling import until

from tierserve.cache import EmbeddingCache
from tierserve.cache.device import to_host

ROWS = 1000


def _hammer(ps, cache, seconds=2.0, readers=4):
    # Compile the numba kernels (parameter server and cache) before the clock starts: a
    # first compile takes seconds, and every thread waits on numba's compiler lock.
    warm = np.arange(4, dtype=np.int64)
    ps.insert(MODEL, TABLE, warm, vectors_for(warm, 0))
    cache.query(warm)
    applied = np.zeros(ROWS, dtype=np.int64)  # last version applied per key, written after insert returns
    stop = threading.Event()
    errors: list[str] = []
    counts = [0] * readers

    def updater():
        rng = np.random.default_rng(99)
        version = 0
        while not stop.is_set():
            version += 1
            keys = np.unique(rng.zipf(1.2, 32) % ROWS).astype(np.int64)
            ps.insert(MODEL, TABLE, keys, vectors_for(keys, version))
            applied[keys] = version
            time.sleep(0.0005)  # the updates' pace

    def reader(i):
        rng = np.random.default_rng(i)
        while not stop.is_set():
            keys = (rng.zipf(1.2, 256) % ROWS).astype(np.int64)
            floor = applied[keys].copy()  # what must be visible from now on
            got = to_host(cache.query(keys))
            if not np.array_equal(got[:, 0], keys.astype(np.float32)):
                errors.append(f"reader {i}: a vector of another key")
            older = got[:, 1] < floor
            if older.any():
                errors.append(f"reader {i}: key {keys[older][0]} older than an applied update")
            counts[i] += 1

    threads = [threading.Thread(target=updater)] + [
        threading.Thread(target=reader, args=(i,)) for i in range(readers)
    ]
    for t in threads:
        t.start()
    time.sleep(seconds)  # the length of the hammering
    until(lambda: min(counts) > 0, timeout=60)  # every reader got its turns on a busy machine
    stop.set()
    for t in threads:
        t.join(20)
        assert not t.is_alive(), "a thread is stuck: deadlock?"
    assert not errors, errors[:5]
    assert min(counts) > 0
    return counts


@pytest.mark.timeout(60)
@pytest.mark.parametrize("threshold", [0.0, 1.0], ids=["async-insert", "sync-insert"])
@pytest.mark.parametrize("mode", ["overwrite", "invalidate"])
def test_concurrent_queries_and_updates(hps, use_gpu, threshold, mode):
    with EmbeddingCache(
        hps, MODEL, TABLE, DIM, 128, use_gpu=use_gpu, hit_rate_threshold=threshold,
        on_update_mode=mode, refresh_interval=0.01,
    ) as cache:
        _hammer(hps, cache, seconds=1.5)
        assert cache.flush(10)
        m = cache.metrics()
        assert m.size <= m.capacity and m.updates > 0 and m.hits > 0
        keys = np.arange(ROWS, dtype=np.int64)
        np.testing.assert_array_equal(to_host(cache.query(keys)), hps.lookup(MODEL, TABLE, keys))


def test_hits_on_slots_that_overlapping_writes_changed_become_misses():
    """The CPU write log: a read overlapped by writes keeps its hits on slots they did not
    change; hits on changed slots become misses (fetched again), and a write that may change
    any slot (a clear) makes the read retry."""
    from dict_ps import DictParameterServer

    ps = DictParameterServer({(MODEL, TABLE): DIM})
    ps.fill(MODEL, TABLE, np.arange(4000))
    with EmbeddingCache(ps, MODEL, TABLE, DIM, 1024, hit_rate_threshold=1.0) as cache:
        held = np.arange(900, dtype=np.int64)
        cache.query(held)
        seq = cache._seq
        _, hit, hits, slots, _ = cache._lookup(held, 1)
        assert hits > 600 and slots is not None  # some keys did not fit their set
        others = np.arange(1000, 1100, dtype=np.int64)
        cache._tick += 5  # later queries: the held keys are no longer the newest, so evictable
        cache._insert_fetched(others, ps.lookup(MODEL, TABLE, others), cache._log.epoch)
        still = np.isin(held, to_host(cache._table.cached_keys()))
        assert cache._seq > seq
        changed = cache._touched(slots, hit, seq, cache._seq)
        np.testing.assert_array_equal(changed, np.flatnonzero(hit & ~still))  # the evicted
        assert changed.size > 0  # 100 new keys in a nearly full cache evict some of ours
        seq = cache._seq
        _, hit, hits, slots, _ = cache._lookup(held, 2)
        one = np.flatnonzero(hit)[5]
        cache.update(held[one : one + 1], vectors_for(held[one : one + 1], version=9))
        np.testing.assert_array_equal(cache._touched(slots, hit, seq, cache._seq), [one])
        seq = cache._seq
        _, hit, hits, slots, _ = cache._lookup(held, 3)
        cache.clear()  # any slot
        assert cache._touched(slots, hit, seq, cache._seq) is None
        assert cache._touched(slots, hit, cache._seq, cache._seq).size == 0  # no write


def test_a_read_overlapped_by_a_write_returns_the_written_rows_fresh():
    """A write lands between the kernel's read and the reader's sequence check (a lookup
    wrapper makes it): the rows it changed come back as the new vectors, fetched again,
    not as the ones the read saw, and the read is not retried."""
    from dict_ps import DictParameterServer

    ps = DictParameterServer({(MODEL, TABLE): DIM})
    ps.fill(MODEL, TABLE, np.arange(4000))
    with EmbeddingCache(ps, MODEL, TABLE, DIM, 1024, hit_rate_threshold=1.0) as cache:
        held = np.arange(200, dtype=np.int64)
        cache.query(held)
        lookup, calls = cache._lookup, []
        fresh = vectors_for(held[:10], version=7)

        def overlapped(keys, tick):
            result = lookup(keys, tick)
            if not calls:  # the first read: a writer changes ten of its rows meanwhile
                ps.insert(MODEL, TABLE, held[:10], fresh)
                cache.update(held[:10], fresh)
            calls.append(1)
            return result

        cache._lookup = overlapped
        got = to_host(cache.query(held))
        assert len(calls) == 1  # no retry: the ten changed rows were fetched again
        np.testing.assert_array_equal(got[:10], fresh)
        np.testing.assert_array_equal(got[10:], ps.lookup(MODEL, TABLE, held[10:]))
