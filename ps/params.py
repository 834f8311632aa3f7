"""HugeCTR's Python-side parameter objects for the tiers and the update source.

``VolatileDatabaseParams``, ``PersistentDatabaseParams`` and ``UpdateSourceParams`` keep
HugeCTR's names, argument order (by position or keyword), enum values and attribute
assignment.  They declare no field of their own: each holds what was given, each value is
validated at once by the config model that will use it (the one of the chosen ``type``, else
the first tier config of that level that has the field), each default read back is that
model's, and :meth:`~_Params.to_config` builds the one typed config for ``type``
(:mod:`tierserve.ps.tier_registry`, :mod:`tierserve.ps.kafka_source`), where a field the
chosen ``type`` does not use is refused.

:func:`volatile_config`, :func:`persistent_config` and :func:`update_source_config` take a
parameter object, a typed config, a ``ps.json``-style dict or None (HugeCTR's default) and
return the typed config: the one path from HugeCTR's objects to the tiers.

:class:`ParamsModel` is the base of the trainer's HugeCTR parameter objects (pydantic models
with HugeCTR's positional order).
"""

from __future__ import annotations

from typing import Any, ClassVar, get_args

from pydantic import BaseModel, ConfigDict, ValidationError

from tierserve.core.compat import warn_once
from tierserve.core.errors import ConfigError

from .config import PSConfig, UpdateSourceConfig
from .config_base import (
    QUIET,
    DatabaseType_t,
    RefusedValues,
    UpdateSourceType_t,
    format_validation_errors,
    validate,
)
from .tier_registry import PersistentDBConfig, VolatileDBConfig


class ParamsModel(BaseModel):
    """Base of HugeCTR-style parameter objects that are their own model: built by keyword or
    positionally (HugeCTR's argument order = field order), validated on construction and on
    every assignment, with :class:`ConfigError` naming the field."""

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


def _members(union: Any) -> tuple[type[BaseModel], ...]:
    """The config models of a discriminated union (``Annotated[Union[...], Field]``)."""
    return get_args(get_args(union)[0])


class _Params:
    """A HugeCTR parameter object over the config models of one ``ps.json`` field."""

    #: HugeCTR's fields in its argument order.
    FIELDS: ClassVar[tuple[str, ...]] = ()
    #: HugeCTR's name -> the config models' name, where the two differ.
    RENAMED: ClassVar[dict[str, str]] = {}
    #: The ``ps.json`` field these parameters configure.
    _ps_field: ClassVar[str] = ""
    _union: ClassVar[Any] = None
    _enum: ClassVar[type] = DatabaseType_t

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        object.__setattr__(self, "_given", {})
        name = type(self).__name__
        if len(args) > len(self.FIELDS):
            raise ConfigError(f"{name} takes at most {len(self.FIELDS)} positional arguments")
        for field, value in zip(self.FIELDS, args):
            if field in kwargs:
                raise ConfigError(f"{name}: {field} given twice")
            kwargs[field] = value
        problems = []
        # The type first: it says which config model checks the other values.
        for field in sorted(kwargs, key=lambda f: f != "type"):
            try:
                setattr(self, field, kwargs[field])
            except RefusedValues as exc:
                problems.extend(exc.problems)
        if problems:
            raise RefusedValues(name, problems)

    # --- which config model checks what ----------------------------------------------------

    @classmethod
    def _models(cls) -> dict[Any, type[BaseModel]]:
        """``{type enum member: config model}`` of this level."""
        return {m.model_fields["type"].default: m for m in _members(cls._union)}

    def _model_for(self, key: str) -> type[BaseModel] | None:
        models = self._models()
        own = models[self.type]
        if key in own.model_fields:
            return own
        return next((m for m in models.values() if key in m.model_fields), None)

    def _check(self, field: str, value: Any) -> Any:
        name = type(self).__name__
        if field == "type":
            try:
                member = self._enum(value)
            except ValueError:
                known = ", ".join(t.value for t in self._enum)
                raise RefusedValues(name, [f"type: {value!r} is not one of {known}"]) from None
            if member not in self._models():
                allowed = ", ".join(t.value for t in self._models())
                raise RefusedValues(name, [f"type: {member.value!r} is not a {self._ps_field} "
                                           f"type; one of {allowed}"])  # fmt: skip
            return member
        key = self.RENAMED.get(field, field)
        model = self._model_for(key)
        if field not in self.FIELDS or model is None:
            raise RefusedValues(name, [f"{field}: unknown field"])
        checked = validate(model, {key: value}, name, {key: field}, context=QUIET)
        return None if value is None else getattr(checked, key)

    # --- attributes ------------------------------------------------------------------------

    def __setattr__(self, field: str, value: Any) -> None:
        self._given[field] = self._check(field, value)

    def __getattr__(self, field: str) -> Any:
        if field.startswith("_") or field not in type(self).FIELDS:
            raise AttributeError(f"{type(self).__name__} has no field {field!r}")
        given = self.__dict__["_given"]
        if field in given:
            return given[field]
        if field == "type":  # ps.json's default for this level
            return PSConfig.model_fields[self._ps_field].get_default(
                call_default_factory=True
            ).type
        key = self.RENAMED.get(field, field)
        return self._model_for(key).model_fields[key].get_default(call_default_factory=True)

    def __repr__(self) -> str:
        given = ", ".join(f"{k}={v!r}" for k, v in self._given.items())
        return f"{type(self).__name__}({given})"

    # --- the typed config ------------------------------------------------------------------

    def to_config(self) -> BaseModel:
        """The typed config for ``self.type``; fields that type does not use must be unset,
        except for a ``disabled`` / ``null`` one, which uses none of them (each given warns
        once, as HugeCTR ignores them too: its own scripts set a RocksDB ``path`` on the
        default, disabled, persistent tier)."""
        name = type(self).__name__
        kind = self.type
        given = {f: v for f, v in self._given.items() if f != "type"}
        if kind.value in ("disabled", "null"):
            for field in sorted(given):
                warn_once(f"{name}.{field}", f"not used: the tier's type is {kind.value!r}")
            given = {}
        data = {"type": kind, **{self.RENAMED.get(f, f): v for f, v in given.items()}}
        back = {v: k for k, v in self.RENAMED.items()}
        return validate(self._union, data, f"{name} ({kind.value})", back)


class VolatileDatabaseParams(_Params):
    """The volatile (in-memory or Redis) tier: HugeCTR's ``VolatileDatabaseParams``."""

    FIELDS = (
        "type", "address", "user_name", "password", "num_partitions", "max_batch_size",
        "max_get_batch_size", "max_set_batch_size", "overflow_margin", "overflow_policy",
        "overflow_resolution_target", "initialize_after_startup", "initial_cache_rate",
        "cache_missed_embeddings", "refresh_time_after_fetch", "update_filters", "enable_tls",
        "tls_ca_certificate", "tls_client_certificate", "tls_client_key",
        "tls_server_name_identification", "algorithm",
    )  # fmt: skip
    _ps_field = "volatile_db"
    _union = VolatileDBConfig


class PersistentDatabaseParams(_Params):
    """The persistent tier: HugeCTR's ``PersistentDatabaseParams`` (disabled by default);
    ``backend=`` is the binding's keyword for ``type``."""

    FIELDS = (
        "type", "path", "num_threads", "read_only", "max_batch_size", "max_get_batch_size",
        "max_set_batch_size", "update_filters",
    )  # fmt: skip
    _ps_field = "persistent_db"
    _union = PersistentDBConfig

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if "backend" in kwargs:  # the keyword HugeCTR's binding gives the type
            if "type" in kwargs or args:
                raise ConfigError("PersistentDatabaseParams: give backend (or type) once")
            kwargs["type"] = kwargs.pop("backend")
        super().__init__(*args, **kwargs)


class UpdateSourceParams(_Params):
    """The online update source: HugeCTR's ``UpdateSourceParams`` (none by default).

    ``max_receive_buffer_size``: embedding rows received before they are applied without
    waiting out ``poll_timeout_ms`` (ps.json's ``receive_buffer_size``).
    """

    FIELDS = (
        "type", "brokers", "metadata_refresh_interval_ms", "poll_timeout_ms",
        "max_receive_buffer_size", "max_batch_size", "failure_backoff_ms", "max_commit_interval",
    )  # fmt: skip
    RENAMED = {"max_receive_buffer_size": "receive_buffer_size"}
    _ps_field = "update_source"
    _union = UpdateSourceConfig
    _enum = UpdateSourceType_t


def _typed(value: Any, params: type[_Params]) -> BaseModel:
    if value is None:
        value = params()
    if isinstance(value, _Params):
        if not isinstance(value, params):
            raise ConfigError(f"{params._ps_field} takes a {params.__name__}, not a "
                              f"{type(value).__name__}")  # fmt: skip
        return value.to_config()
    if isinstance(value, BaseModel):
        if not isinstance(value, _members(params._union)):
            raise ConfigError(f"{params._ps_field} takes a {params.__name__} or one of "
                              f"{[m.__name__ for m in _members(params._union)]}, not a "
                              f"{type(value).__name__}")  # fmt: skip
        return value
    if isinstance(value, dict):
        return validate(params._union, value, params._ps_field)
    raise ConfigError(f"{params._ps_field} takes a {params.__name__}, a config or a dict, not "
                      f"{value!r}")  # fmt: skip


def volatile_config(value: Any = None) -> BaseModel:
    """The typed ``volatile_db`` config of ``value`` (see the module docstring)."""
    return _typed(value, VolatileDatabaseParams)


def persistent_config(value: Any = None) -> BaseModel:
    """The typed ``persistent_db`` config of ``value`` (see the module docstring)."""
    return _typed(value, PersistentDatabaseParams)


def update_source_config(value: Any = None) -> BaseModel:
    """The typed ``update_source`` config of ``value`` (see the module docstring)."""
    return _typed(value, UpdateSourceParams)
