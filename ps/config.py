"""The parameter-server configuration file ``ps.json``: its top level and its models.

Field names and defaults are HugeCTR HPS's (docs/formats.md).  ``volatile_db`` and
``persistent_db`` are each tier's own config model, selected by its ``type`` through
:mod:`tierserve.ps.tier_registry` (the models live beside their tiers: ``hash_map.py``,
``shm_hash_map.py``, ``redis_config.py``, ``rocksdb_tier.py``); ``update_source`` is
:class:`~tierserve.ps.kafka_source.KafkaUpdateSourceConfig` or none.  Unknown fields and
impossible values are rejected with :class:`~tierserve.core.errors.ConfigError` naming the
field.  Relative paths in a file loaded with :func:`load_ps_config` are resolved against the
file's folder.

Beyond HugeCTR: ``type: "redis"`` is a standalone Redis server given by ``address`` (a
``redis://`` URL or ``host:port``), for small deployments; and the older HugeCTR fields
``max_get_batch_size`` / ``max_set_batch_size`` chunk reads and writes by their own sizes
(both default to ``max_batch_size``).  HugeCTR has no settings for how its Redis client waits
and retries; ours are on the Redis configs
(:class:`~tierserve.ps.redis_tier.RedisTierConfig`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import Field, field_validator, model_validator

from tierserve.core.errors import ConfigError

from .config_base import (
    DisabledConfig,
    Fraction,
    NonNegativeFloat,
    NonNegativeInt,
    NullUpdateSourceConfig,
    PositiveInt,
    StrictModel,
    validate,
)
from .hash_map import ParallelHashMapConfig
from .id_admission import DEFAULT_SKETCH_WIDTH
from .kafka_source import KafkaUpdateSourceConfig
from .rocksdb_tier import RocksDBConfig
from .row_codec import STORAGE_DTYPES, StorageDtype
from .table_tag import NAME_PATTERN
from .tier_registry import PersistentDBConfig, VolatileDBConfig

Name = Annotated[str, Field(pattern=rf"^{NAME_PATTERN}$")]

#: ``update_source``: none, or Kafka, selected by ``type``.
UpdateSourceConfig = Annotated[
    Union[NullUpdateSourceConfig, KafkaUpdateSourceConfig], Field(discriminator="type")
]


# --- models --------------------------------------------------------------------------------


#: The most keys one request may carry (INT32 row pointers): bounds ``max_batch_size`` times
#: the sum of ``maxnum_catfeature_query_per_table_per_sample``, the default key limit.
MAX_KEYS_PER_REQUEST = 2**31 - 1


def _each(value, ok, field: str, what: str):
    """``value`` (one setting for all tables, or a list of one per table) when ``ok`` holds
    for each entry (never a bool); else a ValueError naming ``field`` and ``what`` it takes."""
    for v in value if isinstance(value, list) else [value]:
        if isinstance(v, bool) or not ok(v):
            raise ValueError(f"{v!r} is not a {field}: give {what}, for all tables or as a "
                             "list with one per table")  # fmt: skip
    return value


class ModelConfig(StrictModel):
    """One served model: its files and per-table settings (``models[]`` in ``ps.json``)."""

    model: Name
    sparse_files: list[str]
    dense_file: str = ""
    network_file: str = ""
    max_batch_size: PositiveInt = 64
    deployed_device_list: list[NonNegativeInt] = Field(default_factory=lambda: [0])
    default_value_for_each_table: list[float] | None = None
    maxnum_des_feature_per_sample: NonNegativeInt = 26
    maxnum_catfeature_query_per_table_per_sample: list[PositiveInt] = Field(default_factory=list)
    embedding_vecsize_per_table: list[PositiveInt] = Field(default_factory=list)
    embedding_table_names: list[Name] | None = None
    hit_rate_threshold: Fraction = 0.9
    gpucache: bool = True
    #: The share of each table's rows its embedding cache holds (HugeCTR's
    #: ``cache_size_percentage``); 0 is the smallest cache, as in HugeCTR.
    gpucacheper: Fraction = 0.5
    embedding_cache_type: Literal["dynamic", "static"] = "dynamic"
    use_static_table: bool = False
    cache_refresh_percentage_per_iteration: Fraction = 0.0
    refresh_interval: NonNegativeFloat = 0.0  # seconds; 0: never
    refresh_delay: NonNegativeFloat = 0.0
    num_of_worker_buffer_in_pool: PositiveInt = 1
    num_of_refresher_buffer_in_pool: PositiveInt = 1
    use_context_stream: bool = True
    fuse_embedding_table: bool = False
    use_mixed_precision: bool = False
    label_dim: PositiveInt = 1
    slot_num: PositiveInt = 10
    #: How each table's rows are stored in every tier and the embedding cache (one value for
    #: all tables, or one per table): ``float32``, ``float16`` or ``int8`` (row-wise scale and
    #: bias); see :mod:`tierserve.ps.row_codec`.  Lookups answer float32 either way.
    storage_dtype: StorageDtype | list[StorageDtype] = StorageDtype.float32
    #: Online updates of an id no tier stores yet apply only once that many updates of it
    #: came (one value for all tables, or one per table; 1: at once); counted in a bounded
    #: count-min sketch of ``admission_sketch_width`` counters per row
    #: (:mod:`tierserve.ps.id_admission`).
    min_update_count: PositiveInt | list[PositiveInt] = 1
    admission_sketch_width: Annotated[int, Field(ge=64, le=2**30)] = DEFAULT_SKETCH_WIDTH
    #: Rows not written or looked up for that many seconds are removed from every tier (one
    #: value for all tables, or one per table; null: never); see :mod:`tierserve.ps.expiry`.
    ttl_seconds: float | None | list[float | None] = None

    @property
    def num_tables(self) -> int:
        return len(self.sparse_files)

    def updated(self, source: str, names: dict[str, str] | None = None, **changes: Any) -> ModelConfig:
        """A copy with ``changes``, validated as a whole (unlike ``model_copy``): a refused
        value raises :class:`ConfigError` naming ``source`` and the field (as ``names`` calls
        it, e.g. ``cache_size_percentage`` for ``gpucacheper``)."""
        return validate(ModelConfig, {**self.model_dump(exclude_unset=True), **changes},
                        source, names)  # fmt: skip

    @field_validator("storage_dtype", mode="before")
    @classmethod
    def _known_storage_dtypes(cls, value):
        for v in value if isinstance(value, list) else [value]:
            if not isinstance(v, StorageDtype) and v not in STORAGE_DTYPES:
                raise ValueError(
                    f"{v!r} is not a storage_dtype: give one of {', '.join(STORAGE_DTYPES)} "
                    "(default float32), for all tables or as a list with one per table"
                )
        return value

    @field_validator("min_update_count", mode="before")
    @classmethod
    def _whole_counts(cls, value):
        return _each(value, lambda v: isinstance(v, int) and v >= 1, "min_update_count",
                     "a whole number >= 1 (default 1: admit new ids at once)")  # fmt: skip

    @field_validator("ttl_seconds", mode="before")
    @classmethod
    def _positive_ttls(cls, value):
        return _each(value, lambda v: v is None or isinstance(v, int | float) and 0 < v < 2**31,
                     "ttl_seconds", "a number of seconds > 0 (and below 2**31), or null for no "
                     "expiry (the default)")  # fmt: skip

    @model_validator(mode="after")
    def _per_table_lists(self) -> ModelConfig:
        n = len(self.sparse_files)
        if n == 0:
            raise ValueError("sparse_files must name at least one sparse model folder")
        if self.default_value_for_each_table is None:
            object.__setattr__(self, "default_value_for_each_table", [0.0] * n)
        if self.embedding_table_names is None:
            names = [f"sparse_embedding{i + 1}" for i in range(n)]
            object.__setattr__(self, "embedding_table_names", names)
        for field in ("storage_dtype", "min_update_count", "ttl_seconds"):
            if not isinstance(getattr(self, field), list):
                object.__setattr__(self, field, [getattr(self, field)] * n)
        for field in (
            "default_value_for_each_table",
            "storage_dtype",
            "min_update_count",
            "ttl_seconds",
            "maxnum_catfeature_query_per_table_per_sample",
            "embedding_vecsize_per_table",
            "embedding_table_names",
        ):
            values = getattr(self, field)
            if (
                field
                in ("maxnum_catfeature_query_per_table_per_sample", "embedding_vecsize_per_table")
                and not values
            ):
                raise ValueError(f"{field} must give one value per table ({n} tables)")
            if len(values) != n:
                raise ValueError(f"{field} has {len(values)} entries, sparse_files has {n} tables")
        if len(set(self.embedding_table_names)) != n:
            raise ValueError("embedding_table_names must be unique")
        keys = self.max_batch_size * sum(self.maxnum_catfeature_query_per_table_per_sample)
        if keys > MAX_KEYS_PER_REQUEST:
            raise ValueError(
                f"max_batch_size {self.max_batch_size} x maxnum_catfeature_query_per_table_per_"
                f"sample {self.maxnum_catfeature_query_per_table_per_sample} is {keys} keys per "
                f"request, over {MAX_KEYS_PER_REQUEST} (the most keys the INT32 ROWINDEX row "
                "pointers of one request address; the product is the default key limit)"
            )
        return self

    @model_validator(mode="after")
    def _hugectr_switches(self) -> ModelConfig:
        """HugeCTR's ``use_static_table`` is our static cache; the GPU-pipeline switches that
        have no counterpart here warn once (what happens instead: MODEL_NOT_HONOURED)."""
        if self.use_static_table:
            if "embedding_cache_type" in self.model_fields_set and (
                self.embedding_cache_type != "static"
            ):
                raise ValueError("use_static_table is true but embedding_cache_type is "
                                 f"{self.embedding_cache_type!r}; give one of them")
            object.__setattr__(self, "embedding_cache_type", "static")
        from tierserve.core.compat import warn_once

        defaults = type(self).model_fields
        for name, instead in MODEL_NOT_HONOURED.items():
            if getattr(self, name) != defaults[name].default:
                warn_once(f"ps.json models[].{name}", instead, stacklevel=2)
        if len(self.deployed_device_list) > 1:
            warn_once("ps.json models[].deployed_device_list", "the model is served on one "
                      f"device, the first ({self.deployed_device_list[0]})", stacklevel=2)
        return self


#: ``models[]`` fields accepted with no effect here, and what happens instead.
MODEL_NOT_HONOURED = {
    "num_of_worker_buffer_in_pool": "the embedding cache serves concurrent queries without a "
    "buffer pool",
    "num_of_refresher_buffer_in_pool": "the cache refresher needs no buffer pool",
    "use_context_stream": "no CUDA context streams; cupy's current stream is used",
    "fuse_embedding_table": "each table keeps its own cache (the same lookups)",
    "use_mixed_precision": "inference computes in float32",
    "cache_refresh_percentage_per_iteration": "the refresher re-reads every cached key of a "
    "table each refresh_interval",
}


class PSConfig(StrictModel):
    """The whole ``ps.json``: tiers shared by all models, update source, and the models."""

    supportlonglong: bool = True
    volatile_db: VolatileDBConfig = Field(default_factory=ParallelHashMapConfig)
    persistent_db: PersistentDBConfig = Field(default_factory=DisabledConfig)
    update_source: UpdateSourceConfig = Field(default_factory=NullUpdateSourceConfig)
    models: list[ModelConfig] = Field(default_factory=list)

    @model_validator(mode="after")
    def _unique_models(self) -> PSConfig:
        names = [m.model for m in self.models]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"model names must be unique, repeated: {sorted(dup)}")
        return self

    def model(self, name: str) -> ModelConfig:
        """The config of model ``name`` (:class:`ConfigError` when absent)."""
        for m in self.models:
            if m.model == name:
                return m
        raise ConfigError(
            f"ps config has no model {name!r}; it has {[m.model for m in self.models]}"
        )


def parse_ps_config(data: dict[str, Any], source: str = "ps config") -> PSConfig:
    """Validate a decoded ``ps.json``; errors name every bad field."""
    if not isinstance(data, dict):
        raise ConfigError(f"invalid {source}: the top level must be a JSON object")
    return validate(PSConfig, data, source)


def _resolve(base: Path, value: str) -> str:
    return value if not value or os.path.isabs(value) else str(base / value)


def load_ps_config(path: str | os.PathLike) -> PSConfig:
    """Read and validate a ``ps.json`` file; relative model paths resolve against its folder."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"ps config {path} does not exist") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"ps config {path} is not valid JSON: {exc}") from None
    config = parse_ps_config(data, source=str(path))
    base = path.parent.resolve()
    for m in config.models:
        m.sparse_files = [_resolve(base, f) for f in m.sparse_files]
        m.dense_file = _resolve(base, m.dense_file)
        m.network_file = _resolve(base, m.network_file)
    if isinstance(config.persistent_db, RocksDBConfig):
        config.persistent_db.path = _resolve(base, config.persistent_db.path)
    return config


def dump_ps_config(config: PSConfig) -> dict[str, Any]:
    """The JSON-ready form of ``config`` (enum members as their names)."""
    return config.model_dump(mode="json")
