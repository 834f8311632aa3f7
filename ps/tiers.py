"""The tier a ``volatile_db`` / ``persistent_db`` config selects.

Each tier module imports :class:`~tierserve.ps.tier.Tier`; this module, above them all, maps a
config to its tier, importing the tier's module on first use (each pulls in its client or
kernels).
"""

from __future__ import annotations

from tierserve.core.errors import ConfigError

from .config import (
    DisabledConfig,
    HashMapConfig,
    MultiProcessHashMapConfig,
    ParallelHashMapConfig,
    RedisClusterConfig,
    RedisConfig,
    RocksDBConfig,
)
from .tier import Tier


def create_tier(config) -> Tier | None:
    """Build the tier a ``volatile_db`` / ``persistent_db`` config selects (None: disabled)."""
    if isinstance(config, DisabledConfig) or config is None:
        return None
    if isinstance(config, MultiProcessHashMapConfig):
        from .shm_hash_map import SharedHashMapTier

        return SharedHashMapTier(config)
    if isinstance(config, (HashMapConfig, ParallelHashMapConfig)):
        from .hash_map import HashMapTier

        return HashMapTier(config)
    if isinstance(config, (RedisClusterConfig, RedisConfig)):
        from .redis_tier import RedisTier

        return RedisTier(config)
    if isinstance(config, RocksDBConfig):
        from .rocksdb_tier import RocksDBTier

        return RocksDBTier(config)
    raise ConfigError(f"no tier implements {type(config).__name__}")
