"""HugeCTR's parameters of the Embedding Training Cache (:mod:`.etc`): ``TrainPSType_t``,
``CreateHMemCache`` (a ``Cached`` table's host cache) and ``CreateETC`` (one parameter-server
type and sparse model path per table), checked when they are made."""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass, field
from typing import Any

from tierserve.core.errors import ConfigError


class TrainPSType_t(enum.Enum):  # noqa: N801 - HugeCTR's name
    """Where an ETC table lives: ``Staged`` (host memory) or ``Cached`` (disk + host cache)."""

    Staged = "Staged"
    Cached = "Cached"


@dataclass(frozen=True)
class HMemCacheConfig:
    """The host-memory cache of a ``Cached`` table: ``num_blocks`` blocks of
    ``block_size_mb`` MB (vectors and optimizer state)."""

    num_blocks: int = 1
    block_size_mb: float = 64.0

    @property
    def capacity_bytes(self) -> int:
        return int(self.num_blocks * self.block_size_mb * (1 << 20))


def CreateHMemCache(num_blocks: int = 1, target_hit_rate: float | None = None,  # noqa: N802
                    max_num_evict: int | None = None,
                    block_size_mb: float = 64.0) -> HMemCacheConfig:
    """HugeCTR's ``CreateHMemCache``: a host cache of ``num_blocks`` x ``block_size_mb`` MB.

    ``target_hit_rate`` (0 .. 1) and ``max_num_evict`` (>= 0), HugeCTR's tuning of when its
    pass-sized blocks are evicted and when the cache freezes, are checked and then warn: this
    cache evicts its least used rows whenever it is full and never freezes.  Either way every
    row is read from and written back to the RocksDB table, so the trained values are the
    same; only the disk traffic differs."""
    from tierserve.core.compat import warn_once

    if target_hit_rate is not None:
        if not 0.0 <= float(target_hit_rate) <= 1.0:
            raise ConfigError(f"CreateHMemCache: target_hit_rate must be in [0, 1], "
                              f"got {target_hit_rate}")
        warn_once("CreateHMemCache.target_hit_rate", "the host cache evicts its least used "
                  "rows whenever it is full, whatever its hit rate (the trained values are "
                  "the same)")
    if max_num_evict is not None:
        if int(max_num_evict) < 0:
            raise ConfigError(f"CreateHMemCache: max_num_evict must be >= 0, got {max_num_evict}")
        warn_once("CreateHMemCache.max_num_evict", "the host cache is never frozen: it evicts "
                  "its least used rows whenever it is full (the trained values are the same)")
    if int(num_blocks) < 1 or float(block_size_mb) <= 0:
        raise ConfigError(f"CreateHMemCache: num_blocks must be >= 1 and block_size_mb > 0, "
                          f"got {num_blocks}, {block_size_mb}")
    return HMemCacheConfig(int(num_blocks), float(block_size_mb))


@dataclass(frozen=True)
class EmbeddingTrainingCacheParams:
    """What :func:`CreateETC` returns (HugeCTR's ``EmbeddingTrainingCacheParams``)."""

    ps_types: list[TrainPSType_t]
    sparse_models: list[str]
    local_paths: list[str] = field(default_factory=list)
    hmem_cache_configs: list[HMemCacheConfig] = field(default_factory=list)

    def cache_config(self, table: int) -> HMemCacheConfig:
        """The host cache of table ``table`` (a ``Cached`` one): the only config, or the one
        for this table's occurrence among the ``Cached`` tables."""
        if len(self.hmem_cache_configs) == 1:
            return self.hmem_cache_configs[0]
        nth = sum(t is TrainPSType_t.Cached for t in self.ps_types[:table])
        return self.hmem_cache_configs[nth]


def CreateETC(ps_types: list[Any], sparse_models: list[str],  # noqa: N802 - HugeCTR's name
              local_paths: list[str] | None = None,
              hmem_cache_configs: list[HMemCacheConfig] | None = None
              ) -> EmbeddingTrainingCacheParams:
    """HugeCTR's ``CreateETC``: one parameter-server type and sparse model path per embedding
    table; ``local_paths`` (one per rank) and ``hmem_cache_configs`` (one, or one per
    ``Cached`` table) when a table is ``Cached``."""
    types = []
    for t in ps_types:
        try:
            types.append(t if isinstance(t, TrainPSType_t) else TrainPSType_t(str(t)))
        except ValueError:
            raise ConfigError(f"CreateETC: ps_types entries must be TrainPSType_t.Staged or "
                              f"Cached, got {t!r}") from None
    models = [os.fspath(p) for p in sparse_models]
    if not types or len(types) != len(models):
        raise ConfigError(f"CreateETC: {len(types)} ps_types for {len(models)} sparse_models; "
                          "give one of each per embedding table")
    paths = [os.fspath(p) for p in (local_paths or [])]
    caches = list(hmem_cache_configs or [])
    cached = sum(t is TrainPSType_t.Cached for t in types)
    if cached:
        if not paths:
            raise ConfigError("CreateETC: a Cached table needs local_paths (one per rank)")
        if len(caches) not in (1, cached):
            raise ConfigError(f"CreateETC: hmem_cache_configs must hold 1 or {cached} entries "
                              f"(one per Cached table), got {len(caches)}")
        if not all(isinstance(c, HMemCacheConfig) for c in caches):
            raise ConfigError("CreateETC: hmem_cache_configs entries come from CreateHMemCache")
    return EmbeddingTrainingCacheParams(types, models, paths, caches)


__all__ = ["CreateETC", "CreateHMemCache", "EmbeddingTrainingCacheParams", "HMemCacheConfig",
           "TrainPSType_t"]
