"""The parameter-server configuration file ``ps.json`` as pydantic models.

Field names and defaults are HugeCTR HPS's (docs/formats.md, Files and messages 4).  Each tier has
its own model, chosen by its ``type`` field; unknown fields and impossible values are rejected with
:class:`~tierserve.core.errors.ConfigError` naming the field.  Relative paths in a file loaded
with :func:`load_ps_config` are resolved against the file's folder.

Beyond HugeCTR: ``type: "redis"`` is a standalone Redis server given by ``address`` (a
``redis://`` URL or ``host:port``), for small deployments; and the older HugeCTR fields
``max_get_batch_size`` / ``max_set_batch_size`` chunk reads and writes by their own sizes
(both default to ``max_batch_size``).
HugeCTR has no settings for how its Redis client waits and retries; ours are on the ``redis``
and ``redis_cluster`` configs (:class:`_RedisBase`): ``socket_timeout_ms``,
``connect_timeout_ms``, ``max_retries``, the circuit breaker's ``failure_threshold``,
``failure_backoff_ms`` and ``max_failure_backoff_ms``, and ``refill_interval_ms``; a
cluster's also ``topology_refresh_ms``.
"""

from __future__ import annotations

import json
import os
import re
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from tierserve.core.errors import ConfigError

from .table_tag import NAME_PATTERN

Name = Annotated[str, Field(pattern=rf"^{NAME_PATTERN}$")]
PositiveInt = Annotated[int, Field(gt=0)]
NonNegativeInt = Annotated[int, Field(ge=0)]
NonNegativeFloat = Annotated[float, Field(ge=0.0, allow_inf_nan=False)]

#: ``overflow_margin`` default: HugeCTR's 2^64 - 1, de-facto unbounded.
UNBOUNDED = 2**64 - 1


class DatabaseType_t(str, Enum):  # noqa: N801 - HugeCTR's name
    """Kinds of storage tier (HugeCTR's ``DatabaseType_t``, plus standalone ``redis``)."""

    disabled = "disabled"
    hash_map = "hash_map"
    parallel_hash_map = "parallel_hash_map"
    multi_process_hash_map = "multi_process_hash_map"
    redis_cluster = "redis_cluster"
    redis = "redis"
    rocks_db = "rocks_db"


class DatabaseHashMapAlgorithm_t(str, Enum):  # noqa: N801 - HugeCTR's name
    """The hash map behind ``hash_map`` / ``parallel_hash_map``: HugeCTR's ``phm`` (a
    parallel open-addressing map, its default) or ``stl`` (``std::unordered_map``).  tierserve
    has one implementation, an open-addressing table like ``phm``; ``stl`` is refused."""

    stl = "stl"
    phm = "phm"


def _check_algorithm(value: DatabaseHashMapAlgorithm_t) -> DatabaseHashMapAlgorithm_t:
    if DatabaseHashMapAlgorithm_t(value) is DatabaseHashMapAlgorithm_t.stl:
        raise ValueError(
            "algorithm 'stl' (std::unordered_map) is not available: tierserve's hash map is "
            "an open-addressing table like 'phm'; use algorithm 'phm'"
        )
    return value


class DatabaseOverflowPolicy_t(str, Enum):  # noqa: N801 - HugeCTR's name
    """What a volatile tier evicts when a partition exceeds ``overflow_margin``."""

    evict_oldest = "evict_oldest"
    evict_least_used = "evict_least_used"
    evict_random = "evict_random"


class UpdateSourceType_t(str, Enum):  # noqa: N801 - HugeCTR's name
    """Where online embedding updates come from."""

    null = "null"
    kafka_message_queue = "kafka_message_queue"


def default_num_partitions() -> int:
    """HugeCTR's default partition count for parallel tiers: min(cores, 16)."""
    return max(1, min(os.cpu_count() or 1, 16))


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, use_enum_values=False)


def _batch_sizes(self):
    """``max_get_batch_size`` / ``max_set_batch_size`` (HugeCTR's two settings: reads and
    writes are chunked by their own size) default to ``max_batch_size``."""
    if self.max_get_batch_size is None:
        object.__setattr__(self, "max_get_batch_size", self.max_batch_size)
    if self.max_set_batch_size is None:
        object.__setattr__(self, "max_set_batch_size", self.max_batch_size)
    return self


def _check_filters(filters: list[str]) -> list[str]:
    for pattern in filters:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ValueError(f"{pattern!r} is not a regular expression: {exc}") from None
    return filters


# --- volatile tiers ------------------------------------------------------------------------


class _VolatileBase(_Strict):
    max_batch_size: PositiveInt = 65536
    overflow_margin: PositiveInt = UNBOUNDED
    overflow_policy: DatabaseOverflowPolicy_t = DatabaseOverflowPolicy_t.evict_oldest
    overflow_resolution_target: Annotated[float, Field(gt=0.0, lt=1.0)] = 0.8
    initialize_after_startup: bool = True
    initial_cache_rate: Annotated[float, Field(ge=0.0, le=1.0)] = 1.0
    cache_missed_embeddings: bool = False
    refresh_time_after_fetch: bool = False
    update_filters: list[str] = Field(default_factory=lambda: [".+"])

    max_get_batch_size: PositiveInt | None = None
    max_set_batch_size: PositiveInt | None = None
    _batch_sizes = model_validator(mode="after")(_batch_sizes)
    _filters = field_validator("update_filters")(_check_filters)


class DisabledConfig(_Strict):
    """No tier at this level."""

    type: Literal[DatabaseType_t.disabled] = DatabaseType_t.disabled


class HashMapConfig(_VolatileBase):
    """In-process hash map, one partition."""

    type: Literal[DatabaseType_t.hash_map] = DatabaseType_t.hash_map
    num_partitions: Literal[1] = 1
    algorithm: DatabaseHashMapAlgorithm_t = DatabaseHashMapAlgorithm_t.phm

    _algorithm = field_validator("algorithm")(_check_algorithm)


class ParallelHashMapConfig(_VolatileBase):
    """In-process hash map split into partitions that are worked in parallel."""

    type: Literal[DatabaseType_t.parallel_hash_map] = DatabaseType_t.parallel_hash_map
    num_partitions: PositiveInt = Field(default_factory=default_num_partitions)
    algorithm: DatabaseHashMapAlgorithm_t = DatabaseHashMapAlgorithm_t.phm

    _algorithm = field_validator("algorithm")(_check_algorithm)


class MultiProcessHashMapConfig(_VolatileBase):
    """The hash map in shared memory (``/dev/shm``): one copy per host that every process of
    the host reads (HugeCTR's ``multi_process_hash_map``; see ``tierserve.ps.shm_hash_map``).
    ``shared_memory_size`` caps the bytes its tables may take, ``shared_memory_name`` names
    its folder under ``/dev/shm``; ``auto_remove`` removes a table's memory when the last
    process using it drops it or closes."""

    type: Literal[DatabaseType_t.multi_process_hash_map] = DatabaseType_t.multi_process_hash_map
    num_partitions: PositiveInt = 1
    shared_memory_size: PositiveInt = 16 * 1024**3
    shared_memory_name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{1,100}$")] = (
        "hctr_mp_hash_map_database"
    )
    auto_remove: bool = True
    algorithm: DatabaseHashMapAlgorithm_t = DatabaseHashMapAlgorithm_t.phm

    _algorithm = field_validator("algorithm")(_check_algorithm)

    @model_validator(mode="after")
    def _loads_itself(self):
        if not self.initialize_after_startup:
            raise ValueError(
                "initialize_after_startup false is not available for multi_process_hash_map: "
                "the first process that loads a version fills its tables and the others attach "
                "to them; there are no tables of an earlier run to attach to"
            )
        return self


class _RedisBase(_VolatileBase):
    """Settings of both Redis tiers.

    HugeCTR's fields, plus ours for failing servers (HugeCTR has none):

    - ``socket_timeout_ms`` (5000): how long one call to a node may wait for its reply.
    - ``connect_timeout_ms`` (1000): how long opening a connection to a node may take.
    - ``max_retries`` (0): how many times a call that failed on the network (refused, reset,
      timed out) is repeated on the same node, after 10, 20, 40 ... ms (at most 1 s), before
      the node counts as failed.  A frozen node costs a call up to
      ``(1 + max_retries) * socket_timeout_ms``.
    - ``failure_threshold`` (3): after this many failed calls in a row a node is skipped: its
      keys read as not found (the next tier or the default vector answers, counted in
      ``tierserve_tier_skipped``) without being asked for.
    - ``failure_backoff_ms`` (1000) / ``max_failure_backoff_ms`` (10000): how long a node is
      skipped; the back-off doubles with every probe that fails again, up to the maximum.
      After the back-off one call probes the node while the others still skip it; skipped
      writes raise a retryable error at once, as writes to an unreachable node do.
    - ``refill_interval_ms`` (1000): how often each served table's partitions are checked for
      a node that came back empty (restarted without persistence); such partitions are
      refilled in the background from the persistent tier, or from the model files, as at
      startup.  Only with ``initialize_after_startup``; 0 turns the check off.
    """

    user_name: str = "default"
    password: str = ""
    num_partitions: PositiveInt = Field(default_factory=default_num_partitions)
    enable_tls: bool = False
    tls_ca_certificate: str = "cacertbundle.crt"
    tls_client_certificate: str = "client_cert.pem"
    tls_client_key: str = "client_key.key"
    tls_server_name_identification: str = "redis.localhost"
    socket_timeout_ms: PositiveInt = 5000
    connect_timeout_ms: PositiveInt = 1000
    max_retries: Annotated[int, Field(ge=0, le=100)] = 0
    failure_threshold: PositiveInt = 3
    failure_backoff_ms: PositiveInt = 1000
    max_failure_backoff_ms: PositiveInt = 10000
    refill_interval_ms: NonNegativeInt = 1000

    @model_validator(mode="after")
    def _sni(self) -> _RedisBase:
        if self.enable_tls and self.tls_server_name_identification != "redis.localhost":
            from tierserve.core.compat import warn_once

            warn_once("tls_server_name_identification", "redis-py sends each node's host name "
                      "as the TLS server name; the setting is not used", stacklevel=2)
        return self

    @model_validator(mode="after")
    def _backoff_range(self) -> _RedisBase:
        if self.max_failure_backoff_ms < self.failure_backoff_ms:
            raise ValueError(
                f"max_failure_backoff_ms ({self.max_failure_backoff_ms}) must be at least "
                f"failure_backoff_ms ({self.failure_backoff_ms})"
            )
        return self


class RedisClusterConfig(_RedisBase):
    """An existing Redis Cluster; ``address`` lists seed nodes ``host:port[,host:port...]``.

    ``topology_refresh_ms`` (500): while calls to a node fail, are skipped or are redirected
    (``MOVED``), the slot map is read again in the background at most this often, so a
    replica the cluster promoted in place of a dead master is used within this time.
    """

    type: Literal[DatabaseType_t.redis_cluster] = DatabaseType_t.redis_cluster
    address: str = "127.0.0.1:7000"
    topology_refresh_ms: PositiveInt = 500

    @field_validator("address")
    @classmethod
    def _addresses(cls, value: str) -> str:
        for node in re.split(r"[;,]", value):
            host, sep, port = node.strip().rpartition(":")
            if not sep or not host or not port.isdigit():
                raise ValueError(f"{node!r} is not host:port")
        return value


class RedisConfig(_RedisBase):
    """A standalone Redis server: ``address`` is a ``redis://`` URL or ``host:port``."""

    type: Literal[DatabaseType_t.redis] = DatabaseType_t.redis
    address: str = "127.0.0.1:6379"


VolatileDBConfig = Annotated[
    Union[
        DisabledConfig, HashMapConfig, ParallelHashMapConfig, MultiProcessHashMapConfig,
        RedisClusterConfig, RedisConfig,
    ],
    Field(discriminator="type"),
]


# --- persistent tier -----------------------------------------------------------------------


class RocksDBConfig(_Strict):
    """An embedded RocksDB database at ``path`` (created when missing)."""

    type: Literal[DatabaseType_t.rocks_db] = DatabaseType_t.rocks_db
    path: str = "/tmp/rocksdb"
    num_threads: PositiveInt = 16
    read_only: bool = False
    max_batch_size: PositiveInt = 10000
    update_filters: list[str] = Field(default_factory=lambda: [".+"])

    max_get_batch_size: PositiveInt | None = None
    max_set_batch_size: PositiveInt | None = None
    _batch_sizes = model_validator(mode="after")(_batch_sizes)
    _filters = field_validator("update_filters")(_check_filters)


PersistentDBConfig = Annotated[Union[DisabledConfig, RocksDBConfig], Field(discriminator="type")]


# --- update source -------------------------------------------------------------------------


class NullUpdateSourceConfig(_Strict):
    """No online updates."""

    type: Literal[UpdateSourceType_t.null] = UpdateSourceType_t.null


class KafkaUpdateSourceConfig(_Strict):
    """Apache Kafka brokers ``host[:port][;host[:port]...]`` that carry embedding updates."""

    type: Literal[UpdateSourceType_t.kafka_message_queue] = UpdateSourceType_t.kafka_message_queue
    brokers: str = "127.0.0.1:9092"
    metadata_refresh_interval_ms: PositiveInt = 500  # HugeCTR: 30000 (30 s to see a new topic)
    poll_timeout_ms: PositiveInt = 500
    receive_buffer_size: PositiveInt = 2000  # embedding rows, as HugeCTR counts them
    max_batch_size: PositiveInt = 1000
    failure_backoff_ms: NonNegativeInt = 50
    max_commit_interval: PositiveInt = 32

    @model_validator(mode="before")
    @classmethod
    def _hugectr_spelling(cls, data: Any) -> Any:
        """HugeCTR's name for ``receive_buffer_size`` is ``max_receive_buffer_size``."""
        if isinstance(data, dict) and "max_receive_buffer_size" in data:
            data = dict(data)
            value = data.pop("max_receive_buffer_size")
            if "receive_buffer_size" in data and data["receive_buffer_size"] != value:
                raise ValueError("give receive_buffer_size or max_receive_buffer_size, not both")
            data["receive_buffer_size"] = value
        return data


UpdateSourceConfig = Annotated[
    Union[NullUpdateSourceConfig, KafkaUpdateSourceConfig], Field(discriminator="type")
]


# --- models --------------------------------------------------------------------------------


#: The most keys one request may carry (INT32 row pointers): bounds ``max_batch_size`` times
#: the sum of ``maxnum_catfeature_query_per_table_per_sample``, the default key limit.
MAX_KEYS_PER_REQUEST = 2**31 - 1


class ModelConfig(_Strict):
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
    hit_rate_threshold: Annotated[float, Field(ge=0.0, le=1.0)] = 0.9
    gpucache: bool = True
    gpucacheper: Annotated[float, Field(ge=0.0, le=1.0)] = 0.5
    embedding_cache_type: Literal["dynamic", "static"] = "dynamic"
    use_static_table: bool = False
    cache_refresh_percentage_per_iteration: Annotated[float, Field(ge=0.0, le=1.0)] = 0.0
    refresh_interval: NonNegativeFloat = 0.0  # seconds; 0: never
    refresh_delay: NonNegativeFloat = 0.0
    num_of_worker_buffer_in_pool: PositiveInt = 1
    num_of_refresher_buffer_in_pool: PositiveInt = 1
    use_context_stream: bool = True
    fuse_embedding_table: bool = False
    use_mixed_precision: bool = False
    label_dim: PositiveInt = 1
    slot_num: PositiveInt = 10

    @property
    def num_tables(self) -> int:
        return len(self.sparse_files)

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
        for field in (
            "default_value_for_each_table",
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


class PSConfig(_Strict):
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


def _problem(err: dict[str, Any]) -> tuple[str, str]:
    """``(where, what)`` of one pydantic error, in the file's terms: a discriminator's
    allowed values as they are written in JSON, not as enum reprs."""
    loc = [str(p) for p in err["loc"]]
    if err["type"] == "union_tag_invalid":
        ctx = err.get("ctx") or {}
        field = ctx.get("discriminator", "type").strip("'")
        # the tags come as "<DatabaseType_t.hash_map: 'hash_map'>, ..." or "'a', 'b'"
        allowed = re.findall(r"'([^']*)'>?(?:,|$)", str(ctx.get("expected_tags", "")))
        where = ".".join([*loc, field])
        return where, f"{ctx.get('tag')!r} is not one of: {', '.join(allowed)}"
    if err["type"] == "union_tag_not_found":
        field = str((err.get("ctx") or {}).get("discriminator", "type")).strip("'")
        return ".".join(loc) or "(top level)", f"has no {field!r} field"
    where = ".".join(loc) or "(top level)"
    if err["type"] == "extra_forbidden":
        return where, "unknown field"
    return where, str(err["msg"]).removeprefix("Value error, ")


def format_validation_errors(exc: ValidationError, source: str) -> str:
    """``invalid <source>: <dotted path>: <problem>``: on one line for one invalid field,
    one line per field after the first line for several (unknown fields named so)."""
    problems = [f"{where}: {what}" for where, what in map(_problem, exc.errors())]
    if len(problems) == 1:
        return f"invalid {source}: {problems[0]}"
    return f"invalid {source}:\n  " + "\n  ".join(problems)


def parse_ps_config(data: dict[str, Any], source: str = "ps config") -> PSConfig:
    """Validate a decoded ``ps.json``; errors name every bad field."""
    if not isinstance(data, dict):
        raise ConfigError(f"invalid {source}: the top level must be a JSON object")
    try:
        return PSConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_errors(exc, source)) from None


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
