"""Fixtures of the ps tests: every tier kind behind one factory, built on the real services."""

from __future__ import annotations

import contextlib
import sys
import uuid
from pathlib import Path

import pytest

from tierserve.ps.hash_map import HashMapConfig, ParallelHashMapConfig
from tierserve.ps.redis_tier import RedisClusterConfig, RedisConfig
from tierserve.ps.rocksdb_tier import RocksDBConfig
from tierserve.ps.shm_hash_map import MultiProcessHashMapConfig
from tierserve.ps.tier_registry import create_tier

if str(Path(__file__).parent) not in sys.path:  # for `import ps_helpers`
    sys.path.append(str(Path(__file__).parent))

VOLATILE_KINDS = [
    "hash_map",
    "parallel_hash_map",
    "multi_process_hash_map",
    pytest.param("redis", marks=pytest.mark.redis),
    pytest.param("redis_cluster", marks=pytest.mark.redis_cluster),
]
ALL_KINDS = [*VOLATILE_KINDS, "rocks_db"]


class TierFactory:
    """Builds tiers of one kind with config overrides; unique table tags; cleans up."""

    def __init__(self, kind: str, request, tmp_path) -> None:
        self.kind = kind
        self._request = request
        self._tmp_path = tmp_path
        self._made: list = []
        self._tags: list[tuple[object, str]] = []

    @property
    def volatile(self) -> bool:
        return self.kind != "rocks_db"

    @property
    def shared(self) -> bool:
        """Data outlives the tier object (reopen sees it)."""
        return self.kind in ("redis", "redis_cluster", "rocks_db")

    def config(self, **overrides):
        if self.kind == "hash_map":
            return HashMapConfig(**overrides)
        if self.kind == "parallel_hash_map":
            overrides.setdefault("num_partitions", 4)
            return ParallelHashMapConfig(**overrides)
        if self.kind == "multi_process_hash_map":
            if not hasattr(self, "_shm_name"):  # one folder in /dev/shm per test
                self._shm_name = f"tierserve-test-{uuid.uuid4().hex[:12]}"
            overrides.setdefault("num_partitions", 2)
            return MultiProcessHashMapConfig(shared_memory_name=self._shm_name, **overrides)
        if self.kind == "redis":
            server = self._request.getfixturevalue("redis_server")
            overrides.setdefault("num_partitions", 3)
            return RedisConfig(address=server.url, **overrides)
        if self.kind == "redis_cluster":
            cluster = self._request.getfixturevalue("redis_cluster")
            overrides.setdefault("num_partitions", 6)
            return RedisClusterConfig(address=cluster.addresses, **overrides)
        overrides.setdefault("path", str(self._tmp_path / "rocksdb"))
        return RocksDBConfig(**overrides)

    def __call__(self, **overrides):
        tier = create_tier(self.config(**overrides))
        self._made.append(tier)
        return tier

    def tag(self, tier, dim: int = 8) -> str:
        """A fresh table in ``tier`` (unique across the shared Redis servers)."""
        tag = f"hps_et.t{uuid.uuid4().hex[:10]}.emb"
        tier.create_table(tag, dim)
        self._tags.append((tier, tag))
        return tag

    def close(self) -> None:
        for tier, tag in self._tags:
            if self.kind.startswith("redis"):
                with contextlib.suppress(Exception):  # best-effort cleanup
                    tier.drop_table(tag)
        for tier in self._made:
            tier.close()
        if hasattr(self, "_shm_name"):
            import shutil

            from tierserve.ps.shm_hash_map import SHM_ROOT

            shutil.rmtree(SHM_ROOT / self._shm_name, ignore_errors=True)


@pytest.fixture(params=ALL_KINDS)
def tiers(request, tmp_path):
    """A :class:`TierFactory` for each tier kind."""
    factory = TierFactory(request.param, request, tmp_path)
    yield factory
    factory.close()


@pytest.fixture(params=VOLATILE_KINDS)
def volatile_tiers(request, tmp_path):
    """A :class:`TierFactory` for each volatile tier kind (overflow handling)."""
    factory = TierFactory(request.param, request, tmp_path)
    yield factory
    factory.close()
