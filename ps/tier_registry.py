"""The tiers a ``ps.json`` can name, and the factory that builds one from its config.

Each tier lists the config models it is built from (:attr:`Tier.configs
<tierserve.ps.tier.Tier.configs>`, declared beside the tier), and each config model says its
``type`` and its ``level``: ``volatile`` (``volatile_db``) or ``persistent``
(``persistent_db``).  From those this module derives the discriminated unions that
:mod:`tierserve.ps.config` validates ``volatile_db`` / ``persistent_db`` with, and
:func:`create_tier`.  The interface (:mod:`tierserve.ps.tier`) imports no tier; this module
imports the interface and every tier.
"""

from __future__ import annotations

from typing import Annotated, Union

from pydantic import Field

from tierserve.core.errors import ConfigError

from .config_base import DisabledConfig, TierConfig
from .hash_map import HashMapTier
from .redis_tier import RedisTier
from .rocksdb_tier import RocksDBTier
from .shm_hash_map import SharedHashMapTier
from .tier import Tier

#: Every tier, in the order ``ps.json``'s types are documented.
TIERS: tuple[type[Tier], ...] = (HashMapTier, SharedHashMapTier, RedisTier, RocksDBTier)

_TIER_OF: dict[type[TierConfig], type[Tier]] = {
    config: tier for tier in TIERS for config in tier.configs
}


def tier_configs(level: str) -> tuple[type[TierConfig], ...]:
    """The config models of ``level`` (``"volatile"`` or ``"persistent"``), in registry order."""
    return tuple(config for config in _TIER_OF if config.level == level)


def config_type(config: type) -> str:
    """The ``ps.json`` ``type`` value a config model is selected by."""
    return config.model_fields["type"].default.value


def _union(level: str):
    members = (DisabledConfig, *tier_configs(level))
    return Annotated[Union[members], Field(discriminator="type")]  # noqa: UP007 - built at run time


#: ``volatile_db``: disabled or one of the volatile tiers, selected by ``type``.
VolatileDBConfig = _union("volatile")
#: ``persistent_db``: disabled or one of the persistent tiers, selected by ``type``.
PersistentDBConfig = _union("persistent")


def create_tier(config: TierConfig | None) -> Tier | None:
    """Build the tier a ``volatile_db`` / ``persistent_db`` config selects (None: disabled)."""
    if config is None or isinstance(config, DisabledConfig):
        return None
    for cls in type(config).__mro__:
        if cls in _TIER_OF:
            return _TIER_OF[cls](config)
    raise ConfigError(f"no tier implements {type(config).__name__}")
