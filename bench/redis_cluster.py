"""A three-node Redis Cluster on loopback for the benchmarks, started with the test suite's
helpers (``tests/services``: they install Redis where it is missing)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def start_redis_cluster(tmp: Path):
    """A started ``tests/services/redis.py`` ``RedisCluster`` with its node folders and logs
    under ``tmp``; the caller stops it (``cluster.addresses``: its seed nodes)."""
    sys.path.insert(0, str(ROOT / "tests"))
    from services.redis import RedisCluster, ensure_redis

    ensure_redis()
    dirs = [tmp / f"redis-{i}" for i in range(3)]
    for d in dirs:
        d.mkdir()
    cluster = RedisCluster(dirs, [tmp / f"redis-{i}.log" for i in range(3)])
    cluster.start()
    return cluster
