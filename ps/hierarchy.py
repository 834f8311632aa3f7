"""The hierarchical parameter server: a volatile tier in front of a persistent tier.

:class:`HierarchicalParameterServer` is built from a ``ps.json`` (:class:`PSConfig`).  For
each model it loads every sparse file into the persistent tier (when configured) and the
first ``initial_cache_rate`` of each table into the volatile tier; with
``initialize_after_startup: false`` (or a read-only RocksDB) it attaches to what an existing
Redis or RocksDB already holds instead.

A lookup asks the volatile tier, then the persistent tier for what was missing, and fills
the rest with the table's ``default_value_for_each_table``; with ``cache_missed_embeddings``
persistent hits are copied up into the volatile tier.  A tier that cannot be reached is
counted and logged and treated as a miss: lookups never fail because a backend is down.

Versions: a model version's tables are *staged* (:meth:`HierarchicalParameterServer.stage_model`)
beside the served ones, under the storage name ``<tag>@<generation>``, and change nothing that
is served.  The owner of the version (the server's model repository, or
:meth:`~HierarchicalParameterServer.load_model` for direct use) then *commits* it, which makes
it the version that name-addressed calls (``lookup("m", ...)``, online updates) reach, or
*drops* it, which frees its tables once no call is using them.  A caller that holds a
:class:`ServedModel` looks up exactly that version's tables (:meth:`version_view`), so a model
version always reads the embeddings it was loaded with, whatever is committed meanwhile.
Online updates are written to the committed version and to every staged one, so a version
staged while updates flow misses none.  A version's storage names stay its own until its drop
is done: a version staged while an older one is still read (replaced or unloaded, requests in
flight) or being dropped takes new names.  Shared tiers record the committed storage name under
``active/<tag>`` (:meth:`Tier.set_meta`) for processes that attach later.

Compact rows: each table's rows are stored as its ``storage_dtype`` says (:class:`~tierserve.
ps.row_codec.RowCodec`): tiers hold the encoded rows as ``codec.words`` 4-byte words; this
class encodes on load and on insert (online updates included) and decodes on lookup, so
callers always see float32.  A table's layout is recorded beside it (``layout/<storage>``),
and attaching to a table stored in another layout is refused.

Expiry and admission for online learning: a table's ``ttl_seconds`` has every writable tier
keep its rows' last use and :class:`~tierserve.ps.expiry.ExpirySweeper` (owned here) remove
the rows unused for that long; its ``min_update_count`` holds back online updates of ids no
tier stores yet (:meth:`HierarchicalParameterServer.apply_update`,
:mod:`tierserve.ps.id_admission`).
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Sequence

import numpy as np

from tierserve.core.errors import ConfigError, NotFoundError

from .config import PSConfig, load_ps_config
from .config_base import VolatileConfig
from .expiry import ExpirySweeper
from .hierarchy_lookup import LookupPath
from .hierarchy_updates import UpdatePath
from .hierarchy_versions import RETIRE_TIMEOUT_S, ModelVersions
from .id_admission import UpdateAdmission
from .refill import Refiller, start_refill
from .rocksdb_tier import RocksDBConfig
from .served_model import ServedModel, TableSpec
from .tier import Tier
from .tier_registry import create_tier

#: what this module has held since before its parts moved to their own modules
__all__ = [
    "RETIRE_TIMEOUT_S",
    "CreateParameterServer",
    "HierarchicalParameterServer",
    "ServedModel",
    "TableSpec",
    "VersionView",
]

log = logging.getLogger(__name__)


class HierarchicalParameterServer(ModelVersions, LookupPath, UpdatePath):
    """Every embedding table of the served models, in a volatile and a persistent tier.

    Its parts: :class:`~.hierarchy_versions.ModelVersions` (stage, commit, drop),
    :class:`~.hierarchy_lookup.LookupPath` (lookups) and
    :class:`~.hierarchy_updates.UpdatePath` (inserts, online updates, evictions, listeners).
    """

    def __init__(self, config: PSConfig, *, load: bool = True) -> None:
        self.config = config
        self.volatile: Tier | None = create_tier(config.volatile_db)
        try:
            self.persistent: Tier | None = create_tier(config.persistent_db)
        except BaseException:
            if self.volatile is not None:
                self.volatile.close()
            raise
        # The settings of the configured tiers (a disabled level has none: no filters).
        vdb = config.volatile_db if isinstance(config.volatile_db, VolatileConfig) else None
        pdb = config.persistent_db if isinstance(config.persistent_db, RocksDBConfig) else None
        self._cache_missed = vdb is not None and vdb.cache_missed_embeddings
        self._initial_cache_rate = vdb.initial_cache_rate if vdb is not None else None
        self._attach = (vdb is not None and not vdb.initialize_after_startup) or (
            pdb is not None and pdb.read_only
        )
        self._filters = {
            level: [re.compile(f) for f in (tier.update_filters if tier is not None else [])]
            for level, tier in (("volatile", vdb), ("persistent", pdb))
        }
        self._models: dict[str, ServedModel] = {}  # committed versions, by model name
        self._staged: dict[str, list[ServedModel]] = {}  # staged, not yet committed
        # Every version whose tables exist: staged, committed, replaced or unloaded but still
        # read by requests in flight, or being dropped.  A new version never takes a storage
        # name one of them holds, or staging (or that one's drop) would free the other's.
        self._versions: list[ServedModel] = []
        self._listeners: list = []  # update listeners (embedding caches), see add_update_listener
        self._listener_lock = threading.Lock()
        self._load_lock = threading.Lock()  # guards _models and _staged
        self._stage_lock = threading.Lock()  # one stage at a time: storage names stay unique
        self._generation = 0
        self._admission: dict[tuple, UpdateAdmission] = {}  # (storage, levels): its rule
        self._refill: Refiller | None = None
        self.expiry: ExpirySweeper | None = None
        if load:
            try:
                for model in config.models:
                    self.load_model(model)
            except BaseException:
                self.close()
                raise
        self._refill = start_refill(self)  # refills a Redis node that comes back empty
        self.expiry = ExpirySweeper(self).start()  # removes rows whose ttl_seconds passed

    @classmethod
    def from_file(cls, path: str | os.PathLike, **kwargs) -> HierarchicalParameterServer:
        """Build from a ``ps.json`` file."""
        return cls(load_ps_config(path), **kwargs)

    # --- models ----------------------------------------------------------------------------

    @property
    def tiers(self) -> dict[str, Tier]:
        """The configured tiers by level: ``volatile`` and/or ``persistent``."""
        return {
            level: tier
            for level, tier in (("volatile", self.volatile), ("persistent", self.persistent))
            if tier is not None
        }

    def models(self) -> list[str]:
        """Names of the models being served."""
        return list(self._models)

    def model(self, name: str) -> ServedModel:
        """The version of ``name`` being served."""
        m = self._models.get(name)
        if m is None:
            raise NotFoundError(f"no model {name!r} is loaded; loaded: {list(self._models)}")
        return m

    # --- monitoring and lifetime ----------------------------------------------------------

    def version_view(self, served: ServedModel) -> VersionView:
        """A parameter-server interface bound to version ``served`` (for its embedding cache)."""
        return VersionView(self, served)

    def tier_stats(self) -> dict[str, object]:
        """``{"volatile": TierStats, "persistent": TierStats}`` for the configured tiers."""
        return {level: tier.stats for level, tier in self.tiers.items()}

    def close(self) -> None:
        """Close the tiers (shared tiers keep their data)."""
        if self._refill is not None:
            self._refill.close()
        if self.expiry is not None:
            self.expiry.close()
        for tier in self.tiers.values():
            tier.close()

    def __enter__(self) -> HierarchicalParameterServer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class VersionView:
    """One version of a model behind the parameter-server interface an embedding cache uses.

    Lookups read that version's tables whatever is committed meanwhile; inserts and
    listeners behave as the parameter server's own (an insert reaches every live version).
    """

    def __init__(self, ps: HierarchicalParameterServer, served: ServedModel) -> None:
        self.ps, self.served = ps, served

    def _check(self, model: str) -> None:
        if model != self.served.name:
            raise NotFoundError(f"this view serves model {self.served.name!r}, not {model!r}")

    def lookup(self, model: str, table: str, keys) -> np.ndarray:
        self._check(model)
        return self.ps.lookup(self.served, table, keys)

    def lookup_tables(self, model: str, keys_per_table: Sequence) -> list[np.ndarray]:
        self._check(model)
        return self.ps.lookup_tables(self.served, keys_per_table)

    def insert(self, model: str, table: str, keys, embeddings) -> None:
        self._check(model)
        self.ps.insert(self.served, table, keys, embeddings)

    def add_update_listener(self, listener) -> None:
        self.ps.add_update_listener(listener)

    def remove_update_listener(self, listener) -> None:
        self.ps.remove_update_listener(listener)


def CreateParameterServer(  # noqa: N802 - HugeCTR's name
    model_config_paths: Sequence[str | os.PathLike],
    model_names: Sequence[str],
    i64_input_key: bool = True,
) -> HierarchicalParameterServer:
    """HugeCTR's factory: ``ps.json`` files, or the older document's inference JSONs
    (:mod:`tierserve.ps.inference_json`), and the model to serve from each.

    The tiers and update source come from the first ``ps.json`` given (HugeCTR's defaults
    when only inference JSONs are); ``i64_input_key`` sets ``supportlonglong``.
    """
    from .inference_json import load_model_source

    if len(model_config_paths) != len(model_names) or not model_names:
        raise ConfigError("model_config_paths and model_names must be non-empty and of equal length")
    sources = [load_model_source(p, name) for p, name in zip(model_config_paths, model_names)]
    models = [model for _, model in sources]
    data = next((cfg for cfg, _ in sources if cfg is not None), PSConfig()).model_dump()
    data.update(models=[m.model_dump() for m in models], supportlonglong=bool(i64_input_key))
    return HierarchicalParameterServer(PSConfig.model_validate(data))
