"""HugeCTR's ``max_get_batch_size`` and ``max_set_batch_size`` are two settings: reads and
writes are chunked by their own size (they were folded into their minimum).
Counted on a real Redis server with ``INFO commandstats``."""

from __future__ import annotations

import numpy as np
import pytest

from tierserve.ps.config import parse_ps_config
from tierserve.ps.params import PersistentDatabaseParams, VolatileDatabaseParams
from tierserve.ps.redis_tier import RedisConfig
from tierserve.ps.rocksdb_tier import RocksDBConfig
from tierserve.ps.tier_registry import create_tier

pytestmark = pytest.mark.redis


def _calls(client, command: str) -> int:
    stats = client.info("commandstats").get(f"cmdstat_{command}", {})
    return int(stats.get("calls", 0))


def test_reads_and_writes_are_chunked_by_their_own_size(redis_server):
    import redis

    config = RedisConfig(address=redis_server.address, num_partitions=1,  # a margin: times kept
                         max_get_batch_size=50, max_set_batch_size=10, overflow_margin=10**6)
    assert (config.max_get_batch_size, config.max_set_batch_size) == (50, 10)
    tier = create_tier(config)
    client = redis.Redis(host=redis_server.host, port=redis_server.port)
    tag = "hps_et.batchsizes.t"
    try:
        tier.create_table(tag, 2)
        keys = np.arange(100)
        client.config_resetstat()
        tier.insert(tag, keys, np.ones((100, 2), np.float32))
        assert _calls(client, "hset") == 2 * 10  # 10 rows a write, to the value and time hashes
        client.config_resetstat()
        emb, found = tier.lookup(tag, keys)
        assert found.all() and _calls(client, "hmget") == 2  # 50 per read
    finally:
        tier.drop_table(tag)
        tier.close()


def test_max_batch_size_is_the_default_of_both_and_the_params_pass_them_on(tmp_path):
    config = parse_ps_config({"persistent_db": {"type": "rocks_db", "path": str(tmp_path),
                                                "max_batch_size": 7, "max_set_batch_size": 3}})
    assert isinstance(config.persistent_db, RocksDBConfig)
    assert (config.persistent_db.max_get_batch_size, config.persistent_db.max_set_batch_size) == (7, 3)
    v = VolatileDatabaseParams(type="redis_cluster", max_get_batch_size=5)
    assert (v.to_config().max_get_batch_size, v.to_config().max_set_batch_size) == (5, 65536)
    p = PersistentDatabaseParams(type="rocks_db", path=str(tmp_path), max_set_batch_size=4)
    assert p.to_config().max_set_batch_size == 4
