"""What every ``ps.json`` config model shares: HugeCTR's enums, the field types, the base of
the volatile tiers' configs, and how a refused value is reported.

Each tier's config model lives beside its tier (``hash_map.py``, ``shm_hash_map.py``,
``redis_config.py``, ``rocksdb_tier.py``), the Kafka update source's in ``kafka_source.py``;
:mod:`tierserve.ps.tier_registry` gathers them by ``type``, and :mod:`tierserve.ps.config`
holds the top level of ``ps.json`` and the models.  Field names and defaults are HugeCTR
HPS's; each default is declared once, in its config model.  Unknown fields and impossible
values are refused with :class:`~tierserve.core.errors.ConfigError`, one line per refused
value naming the field.
"""

from __future__ import annotations

import os
import re
from enum import Enum
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from tierserve.core.compat import warn_once
from tierserve.core.errors import ConfigError

PositiveInt = Annotated[int, Field(gt=0)]
NonNegativeInt = Annotated[int, Field(ge=0)]
NonNegativeFloat = Annotated[float, Field(ge=0.0, allow_inf_nan=False)]
#: A share in [0, 1]: ``initial_cache_rate``, ``hit_rate_threshold``, the cache percentage.
Fraction = Annotated[float, Field(ge=0.0, le=1.0)]

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


class StrictModel(BaseModel):
    """A config model: unknown fields refused, assignments validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, use_enum_values=False)


#: Validation context of a check that must not warn: a HugeCTR parameter object checks each
#: value as it is set, and the config it becomes warns (once) when it is built.
QUIET = {"quiet": True}


def quiet(info: ValidationInfo) -> bool:
    """Whether a validator runs under :data:`QUIET`."""
    return bool(info.context and info.context.get("quiet"))


class TierConfig(StrictModel):
    """The config of one storage tier; ``level`` says where ``ps.json`` takes it."""

    #: ``"volatile"`` (``volatile_db``) or ``"persistent"`` (``persistent_db``).
    level: ClassVar[str] = ""
    #: Fields of HugeCTR's that this tier accepts but has no use for, and what happens
    #: instead: each warns once when given.
    not_used: ClassVar[dict[str, str]] = {}

    @model_validator(mode="after")
    def _warn_not_used(self, info: ValidationInfo) -> TierConfig:
        if not quiet(info):
            for name, instead in self.not_used.items():
                if name in self.model_fields_set:
                    warn_once(f"{self.type.value}.{name}", instead, stacklevel=2)
        return self


def check_algorithm(value: DatabaseHashMapAlgorithm_t) -> DatabaseHashMapAlgorithm_t:
    """Refuse ``stl``, which tierserve does not implement."""
    if DatabaseHashMapAlgorithm_t(value) is DatabaseHashMapAlgorithm_t.stl:
        raise ValueError(
            "algorithm 'stl' (std::unordered_map) is not available: tierserve's hash map is "
            "an open-addressing table like 'phm'; use algorithm 'phm'"
        )
    return value


def batch_sizes(self):
    """``max_get_batch_size`` / ``max_set_batch_size`` (HugeCTR's two settings: reads and
    writes are chunked by their own size) default to ``max_batch_size``."""
    if self.max_get_batch_size is None:
        object.__setattr__(self, "max_get_batch_size", self.max_batch_size)
    if self.max_set_batch_size is None:
        object.__setattr__(self, "max_set_batch_size", self.max_batch_size)
    return self


def check_filters(filters: list[str]) -> list[str]:
    """``update_filters`` must be regular expressions."""
    for pattern in filters:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ValueError(f"{pattern!r} is not a regular expression: {exc}") from None
    return filters


class VolatileConfig(TierConfig):
    """The fields every volatile tier shares (HugeCTR's ``VolatileDatabaseParams``)."""

    level: ClassVar[str] = "volatile"

    max_batch_size: PositiveInt = 65536
    overflow_margin: PositiveInt = UNBOUNDED
    overflow_policy: DatabaseOverflowPolicy_t = DatabaseOverflowPolicy_t.evict_oldest
    overflow_resolution_target: Annotated[float, Field(gt=0.0, lt=1.0)] = 0.8
    initialize_after_startup: bool = True
    initial_cache_rate: Fraction = 1.0
    cache_missed_embeddings: bool = False
    refresh_time_after_fetch: bool = False
    update_filters: list[str] = Field(default_factory=lambda: [".+"])

    max_get_batch_size: PositiveInt | None = None
    max_set_batch_size: PositiveInt | None = None

    _batch_sizes = model_validator(mode="after")(batch_sizes)
    _filters = field_validator("update_filters")(check_filters)


class InProcessConfig(VolatileConfig):
    """What the hash maps in this host's memory (``hash_map``, ``parallel_hash_map``,
    ``multi_process_hash_map``) share: HugeCTR's ``algorithm`` (``phm`` only), and no use
    for HugeCTR's batch sizes, since each call is worked whole (they warn once when given)."""

    not_used: ClassVar[dict[str, str]] = {
        name: "the in-process hash map works each call whole; reads and writes are not chunked"
        for name in ("max_batch_size", "max_get_batch_size", "max_set_batch_size")
    }

    algorithm: DatabaseHashMapAlgorithm_t = DatabaseHashMapAlgorithm_t.phm

    _algorithm = field_validator("algorithm")(check_algorithm)


class DisabledConfig(TierConfig):
    """No tier at this level."""

    type: Literal[DatabaseType_t.disabled] = DatabaseType_t.disabled


class NullUpdateSourceConfig(StrictModel):
    """No online updates."""

    type: Literal[UpdateSourceType_t.null] = UpdateSourceType_t.null


def _problem(err: dict[str, Any], names: dict[str, str] | None) -> tuple[str, str]:
    """``(where, what)`` of one pydantic error, in the file's terms: a discriminator's
    allowed values as they are written in JSON, not as enum reprs; fields renamed by
    ``names``."""
    loc = [names.get(p, p) if names and isinstance(p, str) else p for p in err["loc"]]
    loc = [str(p) for p in loc]
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


class RefusedValues(ConfigError):
    """A :class:`ConfigError` that lists its refused values (``"<dotted path>: <problem>"``
    each, in ``problems``), so that a caller checking several values can gather them."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = list(problems)
        if len(self.problems) == 1:
            message = f"invalid {source}: {self.problems[0]}"
        else:
            message = f"invalid {source}:\n  " + "\n  ".join(self.problems)
        super().__init__(message)


def validation_problems(exc: ValidationError, names: dict[str, str] | None = None) -> list[str]:
    """``<dotted path>: <problem>`` of each refused value (unknown fields named so);
    ``names`` renames fields for a caller that knows them by another name."""
    return [f"{where}: {what}" for where, what in (_problem(e, names) for e in exc.errors())]


def format_validation_errors(
    exc: ValidationError, source: str, names: dict[str, str] | None = None
) -> str:
    """``invalid <source>: <dotted path>: <problem>``: on one line for one refused value,
    one line per value after the first line for several."""
    return str(RefusedValues(source, validation_problems(exc, names)))


def validate(
    target: Any, data: Any, source: str, names: dict[str, str] | None = None,
    context: dict | None = None,
) -> Any:  # fmt: skip
    """``data`` validated as ``target`` (a model or a type), or a :class:`ConfigError` from
    :class:`RefusedValues` naming each refused value."""
    try:
        if isinstance(target, type) and issubclass(target, BaseModel):
            return target.model_validate(data, context=context)
        return TypeAdapter(target).validate_python(data, context=context)
    except ValidationError as exc:
        raise RefusedValues(source, validation_problems(exc, names)) from None
