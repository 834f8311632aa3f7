"""Expiry (``ttl_seconds``): rows not written or looked up for a table's TTL leave every
tier and read as the default vector; used rows stay; the settings are checked."""

from __future__ import annotations

import uuid

import numpy as np
import pytest
from polling import until
from ps_helpers import expected, write_model

from tierserve.core.errors import ConfigError
from tierserve.ps import HierarchicalParameterServer
from tierserve.ps.config import parse_ps_config
from tierserve.ps.expiry import MAX_INTERVAL_S, MIN_INTERVAL_S, sweep_interval
from tierserve.ps.hash_table import HashTable
from tierserve.ps.table_tag import table_tag
from tierserve.server.runtime.metrics import ServerMetrics

DIM = 4
TTL = 2.0  # short, but well above a lookup on a busy machine
TABLE = "sparse_embedding1"


def _server(tmp_path, name, volatile, persistent=None, **model_extra):
    model = write_model(tmp_path / name, name, [(np.arange(1, 101), DIM)])
    model.update(model_extra)
    return HierarchicalParameterServer(parse_ps_config({
        "volatile_db": volatile,
        "persistent_db": persistent or {"type": "disabled"},
        "models": [model],
    }))  # fmt: skip


def _db(factory) -> dict:
    cfg = factory.config()
    return {"type": cfg.type.value, **cfg.model_dump(mode="json", exclude_unset=True)}


def test_a_clocked_table_expires_only_rows_unused_for_the_ttl():
    table = HashTable(2, track="recency", clock=True)
    table.lookup(np.array([3]))  # compiles the kernel first: a lookup stamps before it runs
    table.insert(np.arange(10, dtype=np.int64), np.ones((10, 2), np.float32))
    assert table.expire(60.0).size == 0
    # keep 3 in use (a lookup stamps it) until the others are older than 0.3 s
    assert until(lambda: table.lookup(np.array([3]))[1].all() and table.expire(0.3).size == 9,
                 timeout=10)  # fmt: skip
    assert table.contains(np.arange(10)).tolist() == [k == 3 for k in range(10)]


def test_sweep_interval_follows_the_shortest_ttl():
    assert sweep_interval([None, 8.0, 20.0]) == 2.0
    assert sweep_interval([0.01]) == MIN_INTERVAL_S
    assert sweep_interval([10**6]) == MAX_INTERVAL_S


def test_rows_unused_for_the_ttl_expire_in_every_tier(tmp_path, tiers):
    name = f"ttl{uuid.uuid4().hex[:8]}"  # unique on the shared Redis servers
    db = _db(tiers)
    volatile, persistent = (db, None) if tiers.volatile else ({"type": "disabled"}, db)
    with _server(tmp_path, name, volatile, persistent, ttl_seconds=TTL) as ps:
        try:
            _expires(ps, name)
        finally:
            ps.unload_model(name)


def _expires(ps, name):
    (tier,) = ps.tiers.values()
    storage = table_tag(name, TABLE)
    dropped = []
    ps.add_update_listener(lambda m, t, keys, emb: dropped.append(keys) if emb is None else None)
    ps.apply_update(storage, [500], np.full((1, DIM), 5.0, np.float32))  # a new row
    told = {*range(2, 101), 500}

    def caches_told() -> bool:  # the sweeper tells the listeners after the tier removed them
        return bool(dropped) and set(np.concatenate(dropped).tolist()) >= told

    # Look up key 1 (and nothing else) until every other row expired.
    assert until(lambda: ps.lookup(name, TABLE, [1]) is not None
                 and tier.contains(storage, np.arange(2, 101)).sum() == 0
                 and not tier.contains(storage, np.array([500])).any()
                 and caches_told(), timeout=60)  # fmt: skip
    np.testing.assert_array_equal(ps.lookup(name, TABLE, [1]), expected([1], DIM))
    np.testing.assert_array_equal(ps.lookup(name, TABLE, [2, 500]), np.full((2, DIM), -1.0))
    assert tier.stats.expired >= 100
    assert 1 not in np.concatenate(dropped).tolist()


def test_a_row_the_volatile_tier_serves_stays_in_the_persistent_tier(tmp_path):
    rdb = {"type": "rocks_db", "path": str(tmp_path / "rdb")}
    name = "both"
    with _server(tmp_path, name, {"type": "hash_map"}, rdb, ttl_seconds=TTL) as ps:
        storage = table_tag(name, TABLE)
        vol, per = ps.tiers["volatile"], ps.tiers["persistent"]
        # Lookups of 1 are answered by the hash map and never reach RocksDB.
        assert until(lambda: ps.lookup(name, TABLE, [1]) is not None
                     and not per.contains(storage, np.array([2])).any(), timeout=60)  # fmt: skip
        assert per.contains(storage, np.array([1])).all()
        assert vol.contains(storage, np.array([1])).all()
        # Once nothing uses 1 it leaves both tiers.
        assert until(lambda: not per.contains(storage, np.array([1])).any(), timeout=60)
        assert not vol.contains(storage, np.array([1])).any()
        np.testing.assert_array_equal(ps.lookup(name, TABLE, [1]), np.full((1, DIM), -1.0))
        metrics = ServerMetrics()
        metrics.add_tier_source(
            lambda: {level: st.snapshot() for level, st in ps.tier_stats().items()}
        )
        text = metrics.render().decode()
        assert 'tierserve_tier_expired_total{tier="persistent:rocks_db"} 100.0' in text


def test_without_a_ttl_nothing_expires(tmp_path):
    with _server(tmp_path, "keep", {"type": "hash_map"}) as ps:
        assert ps.expiry.sweep() == 0
        assert ps.tiers["volatile"].size(table_tag("keep", TABLE)) == 100


@pytest.mark.parametrize("value", [0, -1.5, "soon", True, float("inf"), [1.0, 0], [1.0, 2.0]])
def test_a_bad_ttl_is_refused_naming_it(tmp_path, value):
    model = write_model(tmp_path, "bad", [(np.arange(4), DIM)])
    model["ttl_seconds"] = value
    with pytest.raises(ConfigError, match="ttl_seconds") as err:
        parse_ps_config({"models": [model]})
    assert "unknown field" not in str(err.value)


def test_ttl_per_table(tmp_path):
    model = write_model(tmp_path, "two", [(np.arange(4), DIM), (np.arange(4), DIM)])
    model["ttl_seconds"] = [None, 30]
    assert parse_ps_config({"models": [model]}).models[0].ttl_seconds == [None, 30]
    model["ttl_seconds"] = 5
    assert parse_ps_config({"models": [model]}).models[0].ttl_seconds == [5, 5]


def test_a_ttl_on_evict_least_used_is_refused(tmp_path):
    vol = {"type": "hash_map", "overflow_policy": "evict_least_used", "overflow_margin": 1000}
    with pytest.raises(ConfigError, match="ttl_seconds.*evict_least_used"):
        _server(tmp_path, "lfu", vol, ttl_seconds=TTL)
