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
import math
import os
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tierserve.core.errors import (
    BackendSkippedError,
    BackendUnavailableError,
    ConfigError,
    InvalidInputError,
    NotFoundError,
    NotReadyError,
    ReadOnlyError,
)

from .config import ModelConfig, PSConfig, load_ps_config
from .config_base import VolatileConfig
from .expiry import ExpirySweeper
from .id_admission import UpdateAdmission
from .keys import as_keys
from .rocksdb_tier import RocksDBConfig
from .row_codec import RowCodec
from .sparse_file import read_rows
from .table_tag import parse_table_tag, table_tag
from .tier import Tier
from .tier_registry import create_tier

log = logging.getLogger(__name__)

#: How long unloading waits for lookups still running on a replaced version.
RETIRE_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class TableSpec:
    """One served table: its names, where it is stored, its vector length and default."""

    name: str
    tag: str
    storage: str
    dim: int
    default: float
    #: How the table's rows are stored (float32 unless ``storage_dtype`` says otherwise).
    codec: RowCodec = None
    #: Seconds a row lives after its last write or lookup (``ttl_seconds``; None: forever).
    ttl: float | None = None

    def __post_init__(self) -> None:
        if self.codec is None:
            object.__setattr__(self, "codec", RowCodec("float32", self.dim))


class ServedModel:
    """One loaded version of a model; lookups hold a reference while they run."""

    def __init__(
        self,
        config: ModelConfig,
        generation: int,
        tables: dict[str, TableSpec],
        attached: bool = False,
    ):
        self.config = config
        self.name = config.model
        self.generation = generation
        self.tables = tables
        self.attached = attached  # its tables are another process's (shared tier), not loaded
        self.dropped = False
        self._cond = threading.Condition()
        self._refs = 0
        self._retired = False

    def table(self, name: str) -> TableSpec:
        spec = self.tables.get(name)
        if spec is None:
            raise NotFoundError(
                f"model {self.name!r} has no table {name!r}; it has {list(self.tables)}"
            )
        return spec

    def acquire(self) -> bool:
        with self._cond:
            if self._retired:
                return False
            self._refs += 1
            return True

    def release(self) -> None:
        with self._cond:
            self._refs -= 1
            if self._refs == 0:
                self._cond.notify_all()

    def retire(self, timeout: float) -> bool:
        """Refuse new lookups and wait until running ones finish; False on timeout."""
        with self._cond:
            self._retired = True
            return self._cond.wait_for(lambda: self._refs == 0, timeout)


class HierarchicalParameterServer:
    """Every embedding table of the served models, in a volatile and a persistent tier."""

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
        if load:
            try:
                for model in config.models:
                    self.load_model(model)
            except BaseException:
                self.close()
                raise
        from .refill import start_refill

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

    def version_view(self, served: ServedModel) -> VersionView:
        """A parameter-server interface bound to version ``served`` (for its embedding cache)."""
        return VersionView(self, served)

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

    # --- lookups ---------------------------------------------------------------------------

    def _acquire(self, model: str | ServedModel) -> ServedModel:
        if isinstance(model, ServedModel):
            if model.acquire():
                return model
            raise NotReadyError(
                f"model {model.name!r} generation {model.generation} has been retired"
            )
        for _ in range(1000):
            m = self.model(model)
            if m.acquire():
                return m
        raise NotReadyError(f"model {model!r} is being replaced")  # pragma: no cover

    def _keys(self, keys) -> np.ndarray:
        """int64 keys by :mod:`tierserve.ps.keys`' rule: 32-bit keys when supportlonglong is
        false (int32 / uint32 arrays, or int64 values in 0 .. 2**32-1)."""
        return as_keys(keys, 64 if self.config.supportlonglong else 32)

    def lookup(self, model: str | ServedModel, table: str, keys) -> np.ndarray:
        """The embeddings ``float32 [n, dim]`` of ``keys`` in ``model``'s ``table``.

        ``model`` is a name (the committed version) or a :class:`ServedModel` (that version).
        """
        m = self._acquire(model)
        try:
            return self._lookup(m.table(table), self._keys(keys))
        finally:
            m.release()

    def lookup_tables(self, model: str | ServedModel, keys_per_table: Sequence) -> list[np.ndarray]:
        """Look up one key array per table (in ``embedding_table_names`` order), one version."""
        m = self._acquire(model)
        try:
            specs = list(m.tables.values())
            if len(keys_per_table) != len(specs):
                raise InvalidInputError(
                    f"model {m.name!r} has {len(specs)} tables, got {len(keys_per_table)} key arrays"
                )
            return [self._lookup(s, self._keys(k)) for s, k in zip(specs, keys_per_table)]
        finally:
            m.release()

    def _tier_lookup(self, tier: Tier, storage: str, keys: np.ndarray, width: int,
                     codec: RowCodec | None = None):  # fmt: skip
        """``(rows [n, width], found)`` from one tier: stored rows, or decoded by ``codec``
        (then ``width`` is its dim); a tier that cannot be reached finds nothing."""
        try:
            if codec is not None and not codec.identity:
                return tier.lookup_decoded(storage, keys, codec)
            return tier.lookup(storage, keys)
        except BackendUnavailableError as exc:
            tier.stats.errors += 1
            log.warning("%s tier unavailable for %s, falling through: %s", tier.kind, storage, exc)
            return np.zeros((keys.size, width), np.float32), np.zeros(keys.size, dtype=bool)

    def _lookup(self, spec: TableSpec, keys: np.ndarray) -> np.ndarray:
        """float32 embeddings: the volatile tier's rows (decoded as they are read), then the
        persistent tier's stored rows (decoded; copied up as they are stored), then defaults."""
        n = keys.size
        codec = spec.codec
        if self.volatile is not None:
            out, found = self._tier_lookup(self.volatile, spec.storage, keys, spec.dim, codec)
            if found.all():
                return out
            missing = np.flatnonzero(~found)
        else:
            out = np.empty((n, spec.dim), dtype=np.float32)
            missing = np.arange(n)
        if self.persistent is not None and missing.size:
            mkeys = keys[missing]
            rows, found = self._tier_lookup(self.persistent, spec.storage, mkeys, codec.words)
            if found.any():
                out[missing[found]] = codec.decode(rows[found])
                if self._cache_missed and self.volatile is not None:
                    try:
                        self.volatile.insert(spec.storage, mkeys[found], rows[found])
                    except BackendSkippedError:
                        pass  # the tier is known to be down: the lookup has its answer
                    except BackendUnavailableError as exc:  # the tier counted the failure
                        log.warning("could not cache missed embeddings of %s: %s", spec.tag, exc)
                missing = missing[~found]
        if missing.size:
            out[missing] = spec.default
        return out

    # --- online updates --------------------------------------------------------------------

    def update_filters(self, level: str) -> list[str]:
        """The ``update_filters`` regular expressions of tier level ``volatile``/``persistent``."""
        return [f.pattern for f in self._filters[level]]

    def accepts_updates(self, level: str, model: str) -> bool:
        """Whether tier ``level`` takes online updates of ``model`` (its filters match)."""
        tier = self.tiers.get(level)
        if tier is None or tier.read_only:
            return False
        return any(f.fullmatch(model) for f in self._filters[level])

    def insert(
        self, model: str | ServedModel, table: str, keys, embeddings, *, level: str | None = None
    ) -> None:
        """Write embeddings into the served version of ``model``'s ``table``.

        ``level`` limits the write to one tier (``"volatile"`` or ``"persistent"``); by
        default every tier whose ``update_filters`` match the model name is written.  The
        committed version and every staged one are written.  A tier that cannot be reached
        raises :class:`BackendUnavailableError` (retryable).
        """
        m = self._acquire(model)
        staged = [s for s in self._staged.get(m.name, ()) if s.acquire()]
        try:
            specs = list({v.table(table).storage: v.table(table) for v in (m, *staged)}.values())
            keys = self._keys(keys)
            rows = _encode_for(specs, keys, embeddings, f"update of {m.name}.{table}")
            levels = [level] if level is not None else list(self.tiers)
            written = []
            for lv in levels:
                if lv not in self._filters:
                    raise InvalidInputError(f"level must be volatile or persistent, got {lv!r}")
                if self.accepts_updates(lv, m.name):
                    for spec in specs:
                        self.tiers[lv].insert(spec.storage, keys, rows[spec.codec.dtype])
                    written.append(lv)
        finally:
            for v in (m, *staged):
                v.release()
        model = m.name
        if written:
            # Listeners get the new vectors only when lookup is sure to return them (every
            # tier written); otherwise they must drop the rows and read them again.
            # They get what a lookup returns: the stored rows, decoded.
            full = set(written) == set(self.tiers)
            stored = specs[0].codec.decode(rows[specs[0].codec.dtype]) if full else None
            self._notify(model, table, keys, stored)

    update = insert

    def apply_update(self, tag: str, keys, embeddings, *, level: str | None = None) -> None:
        """:meth:`insert` addressed by table tag ``hps_et.<model>.<table>`` (a Kafka topic).

        With the table's ``min_update_count`` above 1, updates of ids that no tier written
        here stores yet are held back until the id has that many
        (:mod:`tierserve.ps.id_admission`); the tiers count admitted and held-back keys.
        """
        model, table = parse_table_tag(tag)
        admitted = self._admit(model, table, keys, embeddings, level)
        if admitted is None:
            self.insert(model, table, keys, embeddings, level=level)
            return
        rule, keys, stored, admit, stats = admitted
        if admit.any():
            self.insert(model, table, keys[admit], np.asarray(embeddings)[admit], level=level)
        rule.record(keys, ~admit)
        for st in stats:
            st.admitted += int(np.count_nonzero(admit & ~stored))
            st.held_back += int(np.count_nonzero(~admit))

    def _admit(self, model: str, table: str, keys, embeddings, level: str | None):
        """``(rule, keys, stored, admitted, tier stats)`` for a table with an admission rule (its
        ids stored in no tier this update writes count as new); None for one without."""
        m = self._acquire(model)
        try:
            spec = m.table(table)
            count = m.config.min_update_count[list(m.tables).index(table)]
            if count <= 1:
                return None
            keys = self._keys(keys)
            emb = np.asarray(embeddings)
            if emb.ndim != 2 or emb.shape[0] != keys.size:
                return None  # insert refuses it
            levels = [level] if level is not None else list(self.tiers)
            tiers = [self.tiers[lv] for lv in levels
                     if lv in self.tiers and self.accepts_updates(lv, m.name)]  # fmt: skip
            if not tiers:
                return None
            stored = np.zeros(keys.size, dtype=bool)
            for tier in tiers:
                stored |= tier.contains(spec.storage, keys)
            with self._load_lock:
                rule = self._admission.get((spec.storage, tuple(levels)))
                if rule is None:
                    rule = UpdateAdmission(count, m.config.admission_sketch_width)
                    self._admission[(spec.storage, tuple(levels))] = rule
        finally:
            m.release()
        return rule, keys, stored, rule.admit(keys, stored), [t.stats for t in tiers]

    def add_update_listener(self, listener) -> None:
        """Call ``listener(model, table, keys, embeddings)`` after each insert or evict.

        It runs after the tiers were written and before ``insert``/``evict`` returns, holding
        no lock of this server; ``embeddings`` is ``None`` when the listener must drop the
        keys rather than take new vectors (evictions, partial writes).  Embedding caches use
        it so that no lookup after an update returns the old vector.
        """
        with self._listener_lock:
            self._listeners = [*self._listeners, listener]

    def remove_update_listener(self, listener) -> None:
        """Stop calling ``listener``."""
        with self._listener_lock:
            self._listeners = [fn for fn in self._listeners if fn != listener]

    def _notify(self, model: str, table: str, keys: np.ndarray, embeddings) -> None:
        for listener in self._listeners:
            try:
                listener(model, table, keys, embeddings)
            except Exception:
                log.exception("update listener %r failed for %s/%s", listener, model, table)

    def notify_update(self, tag: str, keys, embeddings=None) -> None:
        """Tell the update listeners that ``keys`` of table ``tag`` (``hps_et.<model>.<table>``)
        changed in a shared tier that another replica wrote; no tier is written here.
        ``embeddings`` as for :meth:`add_update_listener` (``None``: drop the keys)."""
        model, table = parse_table_tag(tag)
        self._notify(model, table, np.asarray(keys, np.int64).reshape(-1), embeddings)

    def evict(self, model: str | ServedModel, table: str, keys) -> None:
        """Remove ``keys`` from every writable tier (they then read as defaults)."""
        m = self._acquire(model)
        try:
            spec = m.table(table)
            keys = self._keys(keys)
            for tier in self.tiers.values():
                if not tier.read_only:
                    tier.evict(spec.storage, keys)
        finally:
            m.release()
        model = m.name
        self._notify(model, table, keys, None)

    # --- monitoring and lifetime ----------------------------------------------------------

    def tier_stats(self) -> dict[str, object]:
        """``{"volatile": TierStats, "persistent": TierStats}`` for the configured tiers."""
        return {level: tier.stats for level, tier in self.tiers.items()}

    def close(self) -> None:
        """Close the tiers (shared tiers keep their data)."""
        refill = getattr(self, "_refill", None)
        if refill is not None:
            refill.close()
        expiry = getattr(self, "expiry", None)
        if expiry is not None:
            expiry.close()
        for tier in self.tiers.values():
            tier.close()

    def __enter__(self) -> HierarchicalParameterServer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


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


def _encode_for(specs: list[TableSpec], keys: np.ndarray, embeddings, what: str) -> dict:
    """The stored rows of ``embeddings`` for each layout among ``specs`` (by dtype); a value
    a layout cannot hold is refused before anything is written."""
    emb = np.asarray(embeddings)
    if emb.ndim != 2 or emb.shape[0] != keys.size:
        raise InvalidInputError(
            f"embeddings for {what} must have shape [{keys.size}, {specs[0].dim}], "
            f"got {list(emb.shape)}"
        )
    return {s.codec.dtype: s.codec.encode(emb, what) for s in specs}


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
