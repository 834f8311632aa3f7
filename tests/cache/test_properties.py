"""Property: whatever the interleaving of queries and updates, every vector the cache
returns equals a direct parameter-server lookup made after the last applied update."""

from __future__ import annotations

import numpy as np
from cache_helpers import DIM, MODEL, TABLE, make_ps_config, vectors_for
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tierserve.cache import EmbeddingCache
from tierserve.cache.device import array_module, to_host
from tierserve.ps.hierarchy import HierarchicalParameterServer

KEY_SPACE = 300  # keys 0..299; the table on disk has 0..199, the rest are unknown

keys_st = st.lists(st.integers(0, KEY_SPACE - 1), min_size=1, max_size=40).map(
    lambda ks: np.array(ks, dtype=np.int64)
)
op_st = st.one_of(
    st.tuples(st.just("query"), keys_st),
    st.tuples(st.just("update"), keys_st),  # through the server: the listener hook
    st.tuples(st.just("write_through"), keys_st),  # through the cache
    st.tuples(st.just("evict"), keys_st),
    st.tuples(st.just("flush"), st.just(None)),
    st.tuples(st.just("refresh"), st.just(None)),
)
config_st = st.fixed_dictionaries(
    {
        "capacity": st.integers(1, 64),
        "ways": st.sampled_from([1, 2, 4, 8]),
        "hit_rate_threshold": st.sampled_from([0.0, 0.5, 1.0]),
        "on_update_mode": st.sampled_from(["overwrite", "invalidate"]),
    }
)


def run_ops(tmp_path, use_gpu, config, ops):
    with HierarchicalParameterServer(make_ps_config(tmp_path, rows=200)) as ps, EmbeddingCache(
        ps, MODEL, TABLE, DIM, use_gpu=use_gpu, **config
    ) as cache:
        version = 0
        for op, keys in ops:
            if op == "query":
                got = to_host(cache.query(keys))
                np.testing.assert_array_equal(got, ps.lookup(MODEL, TABLE, keys))
            elif op == "update":
                version += 1
                ps.insert(MODEL, TABLE, keys, vectors_for(keys, version))
            elif op == "write_through":
                version += 1
                cache.update(keys, vectors_for(keys, version))
            elif op == "evict":
                ps.evict(MODEL, TABLE, keys)
            elif op == "flush":
                assert cache.flush(10)
            else:
                cache.refresh()
            m = cache.metrics()
            assert m.size <= m.capacity <= config["capacity"]
        assert cache.flush(10)
        every = np.arange(KEY_SPACE, dtype=np.int64)
        np.testing.assert_array_equal(to_host(cache.query(every)), ps.lookup(MODEL, TABLE, every))
        held = to_host(cache._table.cached_keys())
        assert np.unique(held).size == held.size <= config["capacity"]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(config=config_st, ops=st.lists(op_st, min_size=1, max_size=25))
def test_random_streams_agree_with_the_parameter_server(tmp_path_factory, config, ops):
    run_ops(tmp_path_factory.mktemp("ps"), False, config, ops)


def test_random_streams_on_every_backend(tmp_path, use_gpu):
    """A fixed long stream, run on numpy and (where present) cupy."""
    rng = np.random.default_rng(7)
    ops = []
    for _ in range(300):
        keys = rng.zipf(1.3, rng.integers(1, 60)) % KEY_SPACE
        kind = ["query"] * 6 + ["update", "write_through", "evict", "flush"]
        ops.append((kind[rng.integers(len(kind))], keys.astype(np.int64)))
    array_module(use_gpu)
    for ways, threshold in ((4, 0.5), (2, 0.0), (8, 1.0)):
        config = dict(capacity=48, ways=ways, hit_rate_threshold=threshold, on_update_mode="overwrite")
        run_ops(tmp_path / f"{ways}-{threshold}", use_gpu, config, ops)
