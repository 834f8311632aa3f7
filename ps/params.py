"""HugeCTR's Python-side parameter objects for the tiers and the update source.

``VolatileDatabaseParams``, ``PersistentDatabaseParams`` and ``UpdateSourceParams`` take
HugeCTR's attribute names and defaults, accept keyword arguments or attribute assignment
(validated at once), and turn into the typed configs of :mod:`tierserve.ps.config` with
:meth:`to_config`.  Setting a field that the chosen ``type`` does not use is an error there.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator

from tierserve.core.errors import ConfigError

from .config import (
    UNBOUNDED,
    DatabaseHashMapAlgorithm_t,
    DatabaseOverflowPolicy_t,
    DatabaseType_t,
    PersistentDBConfig,
    UpdateSourceConfig,
    UpdateSourceType_t,
    VolatileDBConfig,
    _check_algorithm,
    default_num_partitions,
    format_validation_errors,
)


class ParamsModel(BaseModel):
    """Base of HugeCTR-style parameter objects: built by keyword or positionally (HugeCTR's
    argument order = field order), validated on construction and on every assignment, with
    :class:`ConfigError` naming the field."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        names = list(type(self).model_fields)
        if len(args) > len(names):
            raise ConfigError(
                f"{type(self).__name__} takes at most {len(names)} positional arguments"
            )
        for name, value in zip(names, args):
            if name in kwargs:
                raise ConfigError(f"{type(self).__name__}: {name} given twice")
            kwargs[name] = value
        try:
            super().__init__(**kwargs)
        except ValidationError as exc:
            raise ConfigError(format_validation_errors(exc, type(self).__name__)) from None

    def __setattr__(self, name: str, value: Any) -> None:
        try:
            super().__setattr__(name, value)
        except ValidationError as exc:
            raise ConfigError(format_validation_errors(exc, type(self).__name__)) from None


class _TierParams(ParamsModel):
    _target: Any = None  # the discriminated union this object converts into

    def to_config(self):
        """The typed config for ``self.type``; fields that type does not use must be unset,
        except for a ``disabled`` / ``null`` one, which uses none of them (each given warns
        once, as HugeCTR ignores them too: its own scripts set a RocksDB ``path`` on the
        default, disabled, persistent tier)."""
        fields = self.model_fields_set - {"type"}
        if self.type.value in ("disabled", "null"):
            from tierserve.core.compat import warn_once

            for name in sorted(fields):
                warn_once(f"{type(self).__name__}.{name}",
                          f"not used: the tier's type is {self.type.value!r}")
            fields = set()
        data = self.model_dump(include=fields | {"type"}, mode="json")
        try:
            return TypeAdapter(self._target).validate_python(data)
        except ValidationError as exc:
            raise ConfigError(
                format_validation_errors(exc, f"{type(self).__name__} ({self.type.value})")
            ) from None


class VolatileDatabaseParams(_TierParams):
    """The volatile (in-memory or Redis) tier: HugeCTR's ``VolatileDatabaseParams``."""

    _target = VolatileDBConfig

    type: DatabaseType_t = DatabaseType_t.parallel_hash_map
    address: str = "127.0.0.1:7000"
    user_name: str = "default"
    password: str = ""
    num_partitions: Annotated[int, Field(gt=0)] = Field(default_factory=default_num_partitions)
    max_batch_size: Annotated[int, Field(gt=0)] = 65536
    max_get_batch_size: Annotated[int, Field(gt=0)] | None = None  # None: max_batch_size
    max_set_batch_size: Annotated[int, Field(gt=0)] | None = None
    overflow_margin: Annotated[int, Field(gt=0)] = UNBOUNDED
    overflow_policy: DatabaseOverflowPolicy_t = DatabaseOverflowPolicy_t.evict_oldest
    overflow_resolution_target: Annotated[float, Field(gt=0.0, lt=1.0)] = 0.8
    initialize_after_startup: bool = True
    initial_cache_rate: Annotated[float, Field(ge=0.0, le=1.0)] = 1.0
    cache_missed_embeddings: bool = False
    refresh_time_after_fetch: bool = False
    update_filters: list[str] = Field(default_factory=lambda: [".+"])
    enable_tls: bool = False
    tls_ca_certificate: str = "cacertbundle.crt"
    tls_client_certificate: str = "client_cert.pem"
    tls_client_key: str = "client_key.key"
    tls_server_name_identification: str = "redis.localhost"
    algorithm: DatabaseHashMapAlgorithm_t = DatabaseHashMapAlgorithm_t.phm

    _algorithm = field_validator("algorithm")(_check_algorithm)


class PersistentDatabaseParams(_TierParams):
    """The persistent tier: HugeCTR's ``PersistentDatabaseParams`` (disabled by default);
    ``backend=`` is the binding's keyword for ``type``."""

    _target = PersistentDBConfig

    type: DatabaseType_t = DatabaseType_t.disabled
    path: str = "/tmp/rocksdb"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if "backend" in kwargs:  # the keyword HugeCTR's binding gives the type
            if "type" in kwargs or args:
                raise ConfigError("PersistentDatabaseParams: give backend (or type) once")
            kwargs["type"] = kwargs.pop("backend")
        super().__init__(*args, **kwargs)
    num_threads: Annotated[int, Field(gt=0)] = 16
    read_only: bool = False
    max_batch_size: Annotated[int, Field(gt=0)] = 10000
    max_get_batch_size: Annotated[int, Field(gt=0)] | None = None  # None: max_batch_size
    max_set_batch_size: Annotated[int, Field(gt=0)] | None = None
    update_filters: list[str] = Field(default_factory=lambda: [".+"])


class UpdateSourceParams(_TierParams):
    """The online update source: HugeCTR's ``UpdateSourceParams`` (none by default).

    ``max_receive_buffer_size``: embedding rows received before they are applied without
    waiting out ``poll_timeout_ms`` (ps.json's ``receive_buffer_size``).
    """

    _target = UpdateSourceConfig

    type: UpdateSourceType_t = UpdateSourceType_t.null
    brokers: str = "127.0.0.1:9092"
    metadata_refresh_interval_ms: Annotated[int, Field(gt=0)] = 500  # HugeCTR: 30000
    poll_timeout_ms: Annotated[int, Field(gt=0)] = 500
    max_receive_buffer_size: Annotated[int, Field(gt=0)] = 2000  # rows; ps.json: receive_buffer_size
    max_batch_size: Annotated[int, Field(gt=0)] = 1000
    failure_backoff_ms: Annotated[int, Field(ge=0)] = 50
    max_commit_interval: Annotated[int, Field(gt=0)] = 32
