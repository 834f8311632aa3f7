"""The version lifecycle of :class:`~tierserve.ps.hierarchy.HierarchicalParameterServer`:
stage a model version's tables beside the served ones (read from its sparse files, or
attached to what a shared tier holds), commit it, drop it once no lookup uses it, and record
the committed storage name (``active/<tag>``) and row layout (``layout/<storage>``) in shared
tiers.  See :mod:`tierserve.ps.hierarchy` for the rules."""

from __future__ import annotations

import logging
import math
import threading

import numpy as np

from tierserve.core.errors import (
    BackendUnavailableError,
    ConfigError,
    InvalidInputError,
    NotReadyError,
    ReadOnlyError,
)

from .config import ModelConfig, PSConfig
from .id_admission import UpdateAdmission
from .keys import as_keys
from .row_codec import RowCodec
from .served_model import ServedModel, TableSpec
from .sparse_file import read_rows
from .table_tag import table_tag
from .tier import Tier

log = logging.getLogger("tierserve.ps.hierarchy")

#: How long unloading waits for lookups still running on a replaced version.
RETIRE_TIMEOUT_S = 30.0


class ModelVersions:
    """Staging, committing and dropping model versions (a part of
    :class:`~tierserve.ps.hierarchy.HierarchicalParameterServer`, which sets the state
    below)."""

    config: PSConfig
    persistent: Tier | None
    tiers: dict[str, Tier]
    _attach: bool
    _initial_cache_rate: float | None
    _models: dict[str, ServedModel]
    _staged: dict[str, list[ServedModel]]
    _versions: list[ServedModel]
    _load_lock: threading.Lock
    _stage_lock: threading.Lock
    _generation: int
    _admission: dict[tuple, UpdateAdmission]

    def stage_model(self, config: ModelConfig | str) -> ServedModel:
        """Load a version's tables beside the served ones; nothing served changes.

        ``config`` is a :class:`ModelConfig` or the name of a model in this server's config.
        The staged version is then passed to :meth:`commit_model` or :meth:`drop_model`.  On
        any error the half-loaded tables are dropped and the error raised.
        """
        if isinstance(config, str):
            config = self.config.model(config)
        with self._stage_lock:
            return self._stage(config)

    def _stage(self, config: ModelConfig) -> ServedModel:
        with self._load_lock:
            self._generation += 1
            gen = self._generation
            live = config.model in self._models or bool(self._staged.get(config.model))
            busy = {spec.storage for v in self._versions for spec in v.tables.values()}
        attach = self._attach and not live
        tables = self._read_tables(config) if not attach else None
        specs: dict[str, TableSpec] = {}
        created: list[tuple[Tier, str]] = []
        try:
            for i, name in enumerate(config.embedding_table_names):
                tag = table_tag(config.model, name)
                dim = int(config.embedding_vecsize_per_table[i])
                if attach:
                    storage = self._attached_storage(tag)
                else:
                    storage = f"{tag}@{gen}" if live or tag in busy else tag
                codec = RowCodec(config.storage_dtype[i], dim)
                spec = TableSpec(name, tag, storage, dim, config.default_value_for_each_table[i],
                                 codec, config.ttl_seconds[i])  # fmt: skip
                if attach:
                    for tier in self.tiers.values():
                        _check_layout(tier, spec)
                        tier.create_table(storage, codec.words)
                        if not tier.read_only:
                            tier.set_ttl(storage, spec.ttl)
                else:
                    keys, emb = tables[i]
                    self._fill(spec, keys, emb, created)
                specs[name] = spec
        except BaseException:
            self._drop_storage(created)
            raise
        served = ServedModel(config, gen, specs, attached=attach)
        with self._load_lock:
            self._staged.setdefault(config.model, []).append(served)
            self._versions.append(served)
        log.info("model %s staged (generation %d, %d tables)", config.model, gen, len(specs))
        return served

    def commit_model(self, served: ServedModel) -> ServedModel | None:
        """Make a staged version the one name-addressed calls reach; returns the one before.

        The version it replaces keeps its tables until it is dropped (:meth:`drop_model`).
        """
        with self._load_lock:
            staged = self._staged.get(served.name, [])
            if served not in staged:
                raise NotReadyError(
                    f"model {served.name!r} generation {served.generation} is not staged"
                )
            staged.remove(served)
            if not staged:
                self._staged.pop(served.name, None)
            old = self._models.get(served.name)
            self._models = {**self._models, served.name: served}
        if not served.attached:
            self._publish(served)
        log.info("model %s generation %d committed", served.name, served.generation)
        return old

    def drop_model(self, served: ServedModel) -> None:
        """Retire a version (staged, committed or replaced) and free the tables only it uses.

        Waits for calls still using it.  A committed version stops being served by name.
        Idempotent.
        """
        with self._load_lock:
            staged = self._staged.get(served.name, [])
            if served in staged:
                staged.remove(served)
                if not staged:
                    self._staged.pop(served.name, None)
            if self._models.get(served.name) is served:
                models = dict(self._models)
                del models[served.name]
                self._models = models
            if served.dropped:
                return
            served.dropped = True
            others = [v for v in self._versions if not v.dropped]
            live = {spec.storage for v in others for spec in v.tables.values()}
        try:
            self._retire(served, keep=live)
        finally:
            with self._load_lock:
                self._versions = [v for v in self._versions if v is not served]

    def load_model(self, config: ModelConfig | str) -> ServedModel:
        """Stage, commit, and drop the version it replaces (direct use, outside a repository).

        On any error the version already served stays served.
        """
        served = self.stage_model(config)
        old = self.commit_model(served)
        if old is not None:
            self.drop_model(old)
        return served

    def _read_tables(self, config: ModelConfig) -> list[tuple[np.ndarray, np.ndarray]]:
        """Open every sparse file first, so a corrupt one fails before any tier changes;
        each table's rows as its ``storage_dtype`` stores them (converted here if need be)."""
        out = []
        for i, path in enumerate(config.sparse_files):
            codec = RowCodec(config.storage_dtype[i], int(config.embedding_vecsize_per_table[i]))
            keys, rows = read_rows(path, codec)
            keys = np.asarray(keys)
            if not self.config.supportlonglong:
                try:
                    keys = as_keys(keys, 32, f"{path}")
                except InvalidInputError as exc:
                    raise ConfigError(f"{exc} (supportlonglong is false)") from None
            _warn_repeated_keys(keys, path)
            out.append((keys, rows))
        return out

    def _fill(self, spec: TableSpec, keys, emb, created: list) -> None:
        n = keys.shape[0]
        for level, tier in self.tiers.items():
            if level == "persistent" and tier.read_only:
                continue
            tier.drop_table(spec.storage)  # what an earlier run or interrupted load left
            tier.create_table(spec.storage, spec.codec.words)
            created.append((tier, spec.storage))
            tier.set_ttl(spec.storage, spec.ttl)
            tier.set_meta(f"layout/{spec.storage}", spec.codec.dtype.value)
            if level == "volatile" and self.persistent is not None:
                count = min(n, int(math.ceil(self._initial_cache_rate * n)))
            else:
                count = n
            if count:
                tier.load_table(spec.storage, keys[:count], emb[:count])

    @staticmethod
    def _drop_storage(created: list[tuple[Tier, str]]) -> None:
        for tier, storage in created:
            try:
                tier.drop_table(storage)
            except Exception as exc:  # noqa: BLE001 - cleanup must not mask the cause
                log.warning("could not drop half-loaded table %s: %s", storage, exc)

    def _attached_storage(self, tag: str) -> str:
        for tier in self.tiers.values():
            try:
                active = tier.get_meta(f"active/{tag}")
            except BackendUnavailableError as exc:
                log.warning("cannot read the live storage name of %s: %s", tag, exc)
                continue
            if active:
                return active
        return tag

    def _publish(self, served: ServedModel) -> None:
        for tier in self.tiers.values():
            if tier.read_only:
                continue
            for spec in served.tables.values():
                try:
                    tier.set_meta(f"active/{spec.tag}", spec.storage)
                except (BackendUnavailableError, ReadOnlyError) as exc:
                    log.warning("cannot record the live storage of %s: %s", spec.tag, exc)

    def _retire(self, old: ServedModel, keep: set[str] = frozenset()) -> None:
        if not old.retire(RETIRE_TIMEOUT_S):
            log.warning("lookups on %s generation %d still running", old.name, old.generation)
        for spec in old.tables.values():
            if spec.storage in keep:
                continue
            with self._load_lock:
                self._admission = {k: v for k, v in self._admission.items()
                                   if k[0] != spec.storage}  # fmt: skip
            for tier in self.tiers.values():
                if tier.read_only:
                    continue
                try:
                    tier.drop_table(spec.storage)
                except BackendUnavailableError as exc:
                    log.warning("could not drop %s from %s: %s", spec.storage, tier.kind, exc)

    def unload_model(self, name: str) -> None:
        """Stop serving ``name`` and free its tables in this process's and shared tiers."""
        self.drop_model(self.model(name))


def _check_layout(tier: Tier, spec: TableSpec) -> None:
    """Refuse to attach to a table that ``tier`` stores in another layout than ``spec``'s."""
    try:
        stored = tier.get_meta(f"layout/{spec.storage}")
    except BackendUnavailableError as exc:
        log.warning("cannot read the layout of %s: %s", spec.storage, exc)
        return
    if stored is not None and stored != spec.codec.dtype.value:
        raise ConfigError(
            f"the {tier.kind} tier stores {spec.storage} as {stored}, but ps.json gives "
            f"storage_dtype {spec.codec.dtype.value} for it: set storage_dtype to {stored}, "
            "or load the table from its sparse files (initialize_after_startup true)"
        )


def _warn_repeated_keys(keys: np.ndarray, path) -> None:
    """Log how many rows of a key file repeat a key of an earlier row.  They are loaded as
    HugeCTR's backends load them, row after row, so a key's last row is the one served (every
    tier inserts in file order)."""
    if keys.size < 2:
        return
    ordered = np.sort(keys)
    repeated = int(np.count_nonzero(ordered[1:] == ordered[:-1]))
    if repeated:
        log.warning(
            "%s: %d rows repeat a key of an earlier row; each key's last row is served",
            path, repeated,
        )  # fmt: skip
