"""EmbeddingCache against the real parameter server: hits, misses, inserts, updates, freshness."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from cache_helpers import DEFAULT, DIM, MODEL, TABLE, vectors_for
from dict_ps import DictParameterServer
from polling import until

from tierserve.cache import EmbeddingCache
from tierserve.cache.device import to_host
from tierserve.cache.hashing import set_of
from tierserve.core.errors import CapacityExceededError, ConfigError, InvalidInputError


def _cache(ps, use_gpu=False, capacity=200, **kw):
    return EmbeddingCache(ps, MODEL, TABLE, DIM, capacity, use_gpu=use_gpu, **kw)


def _check(cache, ps, keys):
    got = to_host(cache.query(np.asarray(keys)))
    np.testing.assert_array_equal(got, ps.lookup(MODEL, TABLE, np.asarray(keys)))
    return got


def test_query_returns_parameter_server_vectors_and_defaults(hps, use_gpu):
    with _cache(hps, use_gpu) as cache:
        keys = np.array([5, 6, 5, 5000, 7, 6], dtype=np.int64)  # 5000 is unknown
        for _ in range(3):
            got = _check(cache, hps, keys)
        assert (got[3] == DEFAULT).all()
        m = cache.metrics()
        assert m.hits + m.misses == 18 and m.hits >= 12
        assert 0 < m.hit_rate <= 1 and m.size <= m.capacity


def test_misses_are_fetched_in_one_batched_call_of_unique_keys(use_gpu):
    ps = DictParameterServer({(MODEL, TABLE): DIM})
    ps.fill(MODEL, TABLE, np.arange(100))
    with _cache(ps, use_gpu, capacity=64) as cache:
        cache.query(np.array([1, 2, 3, 1, 2, 3, 99], dtype=np.int64))
        assert (ps.lookups, ps.looked_up_keys) == (1, 4)
        cache.query(np.array([1, 2, 3], dtype=np.int64))
        assert ps.lookups == 1  # all hits now


def test_inserts_are_synchronous_below_the_threshold_and_queued_above(hps):
    with _cache(hps, hit_rate_threshold=1.0) as cache:  # running rate < 1: always sync
        cache.query(np.arange(50))
        assert cache.metrics().size == cache.metrics().inserted > 0
    with _cache(hps, hit_rate_threshold=0.0) as cache:  # always async
        cache.query(np.arange(50))
        assert cache.flush(10)
        m = cache.metrics()
        assert m.inserted > 0 and m.insert_queue_depth == 0


def test_a_full_insert_queue_drops_batches_without_blocking(hps):
    gate = threading.Event()
    with _cache(hps, hit_rate_threshold=0.0, max_queued_inserts=1) as cache:
        real = cache._insert_fetched

        def slow(*args):
            gate.wait(10)
            real(*args)

        cache._worker._insert = slow
        for i in range(6):
            cache.query(np.arange(i * 10, i * 10 + 10))
        assert cache.metrics().dropped_inserts >= 3
        gate.set()
        assert cache.flush(10)


def test_update_overwrites_the_cached_row_before_it_returns(hps, use_gpu):
    with _cache(hps, use_gpu) as cache:
        keys = np.arange(20, dtype=np.int64)
        _check(cache, hps, keys)
        hps.insert(MODEL, TABLE, keys[:5], vectors_for(keys[:5], 1))  # through the listener
        got = _check(cache, hps, keys)
        assert (got[:5, 1] == 1).all() and (got[5:, 1] == 0).all()
        cache.update(keys[5:8], vectors_for(keys[5:8], 2))  # write-through
        got = _check(cache, hps, keys)
        assert (got[5:8, 1] == 2).all()
        assert cache.metrics().updates == 2


def test_invalidate_mode_and_evictions_drop_rows(hps):
    with _cache(hps, on_update_mode="invalidate") as cache:
        keys = np.arange(10, dtype=np.int64)
        _check(cache, hps, keys)
        size = cache.metrics().size
        hps.insert(MODEL, TABLE, keys[:3], vectors_for(keys[:3], 4))
        assert cache.metrics().size == size - 3
        _check(cache, hps, keys)
        hps.evict(MODEL, TABLE, keys[3:5])  # the server drops them: defaults now
        got = _check(cache, hps, keys)
        assert (got[3:5] == DEFAULT).all()


def test_updates_of_other_tables_are_ignored(hps):
    with _cache(hps) as cache:
        cache.query(np.arange(5))
        cache.on_update(MODEL, "other_table", np.arange(5), vectors_for(np.arange(5), 9))
        assert (to_host(cache.query(np.arange(5)))[:, 1] == 0).all()


class _GatedPS:
    """Wraps a parameter server; the n-th lookup waits for a gate after reading."""

    def __init__(self, ps, gate_call: int) -> None:
        self._ps = ps
        self.calls = 0
        self.gate_call = gate_call
        self.fetched = threading.Event()
        self.release = threading.Event()

    def lookup(self, model, table, keys):
        self.calls += 1
        out = self._ps.lookup(model, table, keys)
        if self.calls == self.gate_call:
            self.fetched.set()
            assert self.release.wait(10)
        return out

    def insert(self, model, table, keys, embeddings):
        self._ps.insert(model, table, keys, embeddings)

    def add_update_listener(self, fn):
        self._ps.add_update_listener(fn)

    def remove_update_listener(self, fn):
        self._ps.remove_update_listener(fn)


@pytest.mark.parametrize("threshold", [1.0, 0.0], ids=["sync-insert", "async-insert"])
def test_a_vector_fetched_before_an_update_is_never_inserted_after_it(hps, threshold):
    gated = _GatedPS(hps, gate_call=1)
    keys = np.arange(30, 40, dtype=np.int64)
    with _cache(gated, hit_rate_threshold=threshold) as cache:
        result = {}
        query = threading.Thread(target=lambda: result.setdefault("v", cache.query(keys)))
        query.start()
        assert gated.fetched.wait(10)  # the miss path has read version 0 from the server
        hps.insert(MODEL, TABLE, keys, vectors_for(keys, 1))  # update applied meanwhile
        gated.release.set()
        query.join(10)
        assert (result["v"][:, 1] == 0).all()  # that query started before the update
        assert cache.flush(10)
        assert cache.metrics().stale_dropped == keys.size
        got = _check(cache, hps, keys)  # any query after the update sees version 1
        assert (got[:, 1] == 1).all()


def test_refresh_repulls_cached_rows(hps):
    with _cache(hps, listen=False) as cache:  # the cache does not hear about updates
        keys = np.arange(10, dtype=np.int64)
        cache.query(keys)
        hps.insert(MODEL, TABLE, keys, vectors_for(keys, 3))
        assert (to_host(cache.query(keys))[:, 1] == 0).all()  # stale until refreshed
        assert cache.refresh() == cache.metrics().size
        _check(cache, hps, keys)


def test_refresh_interval_runs_in_the_background(hps):
    with _cache(hps, listen=False, refresh_interval=0.05, refresh_delay=0.0) as cache:
        keys = np.arange(10, dtype=np.int64)
        cache.query(keys)
        hps.insert(MODEL, TABLE, keys, vectors_for(keys, 5))
        assert until(lambda: cache.metrics().refreshed >= 2 * keys.size, timeout=30)
        _check(cache, hps, keys)


def test_clear_drops_everything_and_in_flight_fetches(hps):
    with _cache(hps) as cache:
        cache.query(np.arange(50))
        cache.clear()
        assert cache.metrics().size == 0
        _check(cache, hps, np.arange(50))


def test_static_cache_holds_the_whole_table(hps, use_gpu):
    with _cache(hps, use_gpu, capacity=1000, cache_type="static", static_keys=np.arange(1000)) as cache:
        keys = np.array([0, 999, 500, 1234], dtype=np.int64)
        _check(cache, hps, keys)
        m = cache.metrics()
        assert (m.hits, m.misses, m.inserted, m.size) == (3, 1, 0, 1000)
        hps.insert(MODEL, TABLE, keys[:2], vectors_for(keys[:2], 7))
        got = _check(cache, hps, keys)
        assert (got[:2, 1] == 7).all()
        hps.insert(MODEL, TABLE, keys[3:], vectors_for(keys[3:], 7))  # a new key: still a miss
        _check(cache, hps, keys)
        assert cache.metrics().size == 1000


def test_static_cache_that_does_not_fit_is_a_clear_error(hps):
    with pytest.raises(CapacityExceededError, match="static.*1000 rows.*room for 999"):
        _cache(hps, capacity=999, cache_type="static", static_keys=np.arange(1000))
    with pytest.raises(ConfigError, match="static_keys"):
        _cache(hps, cache_type="static")


def test_bad_arguments_are_rejected(hps):
    with pytest.raises(ConfigError):
        _cache(hps, capacity=0)
    with pytest.raises(ConfigError):
        _cache(hps, cache_type="lru")
    with _cache(hps, i64_input_key=False) as cache:
        with pytest.raises(InvalidInputError, match="integers"):
            cache.query(np.array([1.5]))
        with pytest.raises(InvalidInputError, match="not a 32-bit key"):
            cache.query(np.array([2**40]))
        with pytest.raises(InvalidInputError, match="-1 is not a 32-bit key"):
            cache.query(np.array([-1], dtype=np.int64))
        _check(cache, hps, np.array([1, 2], dtype=np.int32))


def test_close_unregisters_the_listener(hps):
    cache = _cache(hps)
    cache.close()
    hps.insert(MODEL, TABLE, np.arange(3), vectors_for(np.arange(3), 1))
    assert cache.metrics().updates == 0


def test_empty_queries_and_repeated_keys_in_updates(hps, use_gpu):
    with _cache(hps, use_gpu, on_update_mode="invalidate") as cache:
        assert to_host(cache.query(np.array([], dtype=np.int64))).shape == (0, DIM)
        keys = np.arange(10, dtype=np.int64)
        cache.query(keys)
        size = cache.metrics().size
        hps.insert(MODEL, TABLE, np.array([1, 1, 2]), vectors_for(np.array([1, 1, 2]), 3))
        assert cache.metrics().size == size - 2
        _check(cache, hps, keys)


def test_update_with_wrong_shape_drops_the_rows(hps):
    with _cache(hps) as cache:
        keys = np.arange(4, dtype=np.int64)
        cache.query(keys)
        size = cache.metrics().size
        cache.on_update(MODEL, TABLE, keys[:2], np.zeros((2, DIM + 1), np.float32))
        assert cache.metrics().size == size - 2


def test_hot_keys_stay_while_cold_keys_stream_through(use_gpu):
    ps = DictParameterServer({(MODEL, TABLE): DIM})
    ps.fill(MODEL, TABLE, np.arange(20_000))
    rng = np.random.default_rng(5)
    candidates = rng.choice(20_000, 2000, replace=False).astype(np.int64)
    _, first = np.unique(set_of(candidates, 128), return_index=True)
    hot = candidates[first[:60]]  # one per set: a set-associative cache can keep them all
    with _cache(ps, use_gpu, capacity=256, hit_rate_threshold=1.0) as cache:
        for i in range(40):
            cold = rng.integers(0, 20_000, 200)  # four times what fits besides the hot keys
            cache.query(np.concatenate([hot, cold, hot]))  # hot keys: asked for more often
            if i >= 1:
                before = cache.metrics()
                cache.query(hot)
                after = cache.metrics()
                assert after.misses == before.misses, f"a hot key was evicted in batch {i}"
            m = cache.metrics()
            assert m.size <= m.capacity == 256


def test_a_whole_table_notification_clears_the_cache(hps):
    with _cache(hps) as cache:
        cache.query(np.arange(20))
        cache.on_update(MODEL, TABLE, None, None)
        assert cache.metrics().size == 0
        _check(cache, hps, np.arange(20))


def test_32_bit_keys_read_as_unsigned_on_every_path(use_gpu):
    """Issue 13: a 32-bit model's keys above 2**31 arrive as uint32, as int32 (their bits) or
    as int64 values; all three are the same key, from the host or the device."""
    ps = DictParameterServer({(MODEL, TABLE): DIM})
    big = np.array([2**31 + 5, 2**32 - 1, 7], dtype=np.int64)
    ps.fill(MODEL, TABLE, big)
    want = ps.lookup(MODEL, TABLE, big)
    with _cache(ps, use_gpu, i64_input_key=False) as cache:
        for keys in (big.astype(np.uint32), big.astype(np.uint32).view(np.int32), big):
            for _ in range(2):  # a miss, then a hit
                np.testing.assert_array_equal(to_host(cache.query(keys)), want)
            if use_gpu:
                np.testing.assert_array_equal(to_host(cache.query(cache.xp.asarray(keys))), want)
