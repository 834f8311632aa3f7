"""The persistent tier ``rocks_db``: an embedded RocksDB database through rocksdict, and its
``ps.json`` config.

Layout (docs/formats.md, Files and messages 8): one column family per table tag; key = the int64 key's 8
little-endian bytes; value = the vector's float32 bytes.  The vector length of each table is
kept in the default column family under ``hps_meta/dim/<tag>`` so that a reopened database
knows its tables.  Reads are multi-gets and writes are write batches, chunked at
``max_batch_size``.  ``read_only`` opens the database read-only; writes then raise
:class:`~tierserve.core.errors.ReadOnlyError`.  One process at a time may open a path for
writing (RocksDB's ``LOCK`` file); a second one gets an error naming the lock and, where
Linux tells, the process that holds it.

A full disk is a fault that can go away: a bulk load that cannot fit in the free space is
refused before anything is written, and a write that fails with an I/O error (a disk that
filled meanwhile) raises :class:`~tierserve.core.errors.StorageFullError` or
:class:`~tierserve.core.errors.BackendUnavailableError` (both retryable).  RocksDB refuses every
write after such an error ("Writer has previous error") while reads go on, so the next write
first reopens the database (once lookups in flight are done and some space is free again).
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import shutil
import threading
import time
from typing import ClassVar, Literal

import numpy as np
from pydantic import Field, field_validator, model_validator

from tierserve.core.errors import (
    BackendUnavailableError,
    ConfigError,
    InvalidInputError,
    ReadOnlyError,
    StorageFullError,
    require_extra,
)

from .codec import decode_values, key_fields, vector_values
from .config_base import (
    DatabaseType_t,
    PositiveInt,
    TierConfig,
    batch_sizes,
    check_filters,
)
from .locks import describe_process, lock_holder
from .partition import as_keys
from .tier import Tier

log = logging.getLogger(__name__)

_META_PREFIX = b"hps_meta/dim/"
#: Free bytes below which a database that failed a write is not reopened (reopening writes).
REOPEN_MIN_FREE = 1 << 20
#: How long a reopen waits for lookups in flight on the failed database.
REOPEN_WAIT_S = 30.0


class RocksDBConfig(TierConfig):
    """An embedded RocksDB database at ``path`` (created when missing)."""

    level: ClassVar[str] = "persistent"

    type: Literal[DatabaseType_t.rocks_db] = DatabaseType_t.rocks_db
    path: str = "/tmp/rocksdb"
    num_threads: PositiveInt = 16
    read_only: bool = False
    max_batch_size: PositiveInt = 10000
    update_filters: list[str] = Field(default_factory=lambda: [".+"])

    max_get_batch_size: PositiveInt | None = None
    max_set_batch_size: PositiveInt | None = None
    _batch_sizes = model_validator(mode="after")(batch_sizes)
    _filters = field_validator("update_filters")(check_filters)


def _drain(iterator) -> None:
    collections.deque(iterator, maxlen=0)


_NO_KEYS = np.empty(0, dtype=np.int64)


def _times_cf(tag: str) -> str:
    """The column family of the access times of table ``tag`` (tables with a TTL)."""
    return f"{tag}#t"


class _Gate:
    """Any number of calls use the database at once; a reopen waits until they are done and
    holds new ones back until it is over."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._users = 0
        self._closed = False

    @contextlib.contextmanager
    def using(self):
        with self._cond:
            self._cond.wait_for(lambda: not self._closed)
            self._users += 1
        try:
            yield
        finally:
            with self._cond:
                self._users -= 1
                if not self._users:
                    self._cond.notify_all()

    @contextlib.contextmanager
    def alone(self, timeout: float):
        """Yields whether every user left within ``timeout`` seconds."""
        with self._cond:
            self._closed = True
            done = self._cond.wait_for(lambda: self._users == 0, timeout)
        try:
            yield done
        finally:
            with self._cond:
                self._closed = False
                self._cond.notify_all()


class RocksDBTier(Tier):
    """``rocks_db``: embeddings on local disk, surviving restarts."""

    configs = (RocksDBConfig,)
    kind = "rocks_db"
    shared = False  # a database on this machine's disk, open in one process
    read_only = False  # or as ps.json's read_only says (set per instance)

    def __init__(self, config: RocksDBConfig) -> None:
        super().__init__()
        rocksdict = require_extra("rocksdict", "rocksdb", "The rocks_db tier")
        self._rd = rocksdict
        self.config = config
        self.path = str(config.path)
        self.read_only = bool(config.read_only)
        self.num_threads = int(config.num_threads)  # RocksDB's background threads
        self.max_batch_size = int(config.max_set_batch_size or config.max_batch_size)  # writes
        self.max_get_batch_size = int(config.max_get_batch_size or config.max_batch_size)
        self._lock = threading.Lock()
        self._gate = _Gate()
        self._reopen_lock = threading.Lock()  # not _lock: writers hold the gate and take _lock
        self._failed: str | None = None  # why RocksDB refuses writes until it is reopened
        self._db = None
        self._ttl: dict[str, float] = {}  # tables with a time-to-live: seconds
        self._open()

    def _open(self) -> None:
        rocksdict = self._rd
        options = self._options()
        options.create_if_missing(not self.read_only)
        options.create_missing_column_families(True)
        options.increase_parallelism(self.num_threads)
        existing = ["default"]
        if os.path.exists(os.path.join(self.path, "CURRENT")):
            existing = rocksdict.Rdict.list_cf(self.path, self._options())
        elif self.read_only:
            raise BackendUnavailableError(f"no RocksDB database at {self.path} to open read-only")
        access = (
            rocksdict.AccessType.read_only() if self.read_only else rocksdict.AccessType.read_write()
        )
        try:
            self._db = rocksdict.Rdict(
                self.path,
                options,
                column_families={cf: self._options() for cf in existing if cf != "default"},
                access_type=access,
            )
        except Exception as exc:  # rocksdict raises plain Exception (e.g. the LOCK is held)
            if "lock" in str(exc).lower():
                raise BackendUnavailableError(self._locked_message(exc)) from exc
            raise BackendUnavailableError(f"cannot open RocksDB at {self.path}: {exc}") from exc
        cfs: dict[str, object] = {}
        handles: dict[str, object] = {}
        dims: dict[str, int] = {}
        for cf in existing:
            if cf == "default":
                continue
            raw = self._db.get(_META_PREFIX + cf.encode())
            if raw is not None:
                dims[cf] = int(raw)
                cfs[cf] = self._db.get_column_family(cf)
                handles[cf] = self._db.get_column_family_handle(cf)
        self._cfs, self._handles, self._dims = cfs, handles, dims

    # --- faults ----------------------------------------------------------------------------

    @contextlib.contextmanager
    def _writing(self, what: str):
        """Run a write: reopen a database that failed one first; an I/O error raises a
        retryable error (see the module docstring)."""
        if self._failed is not None:
            self._reopen()
        with self._gate.using():
            try:
                yield
            except Exception as exc:  # rocksdict raises plain Exception
                message = " ".join(str(exc).split())
                if not message.startswith("IO error"):
                    raise
                self._failed = message
                raise self._fault(what, message) from None

    def _fault(self, what: str, message: str) -> BackendUnavailableError:
        if "No space left" in message:
            return StorageFullError(
                f"rocks_db at {self.path}: the disk is full ({what} failed: {message}); "
                "retried once space is freed"
            )
        return BackendUnavailableError(f"rocks_db at {self.path}: {what} failed: {message}")

    def _reopen(self) -> None:
        """Close and open again a database that refuses writes after an I/O error."""
        with self._reopen_lock:
            if self._failed is None:
                return
            free = shutil.disk_usage(self.path).free
            if free < REOPEN_MIN_FREE:
                raise StorageFullError(
                    f"rocks_db at {self.path}: the disk is still full ({free} bytes free); it "
                    f"failed a write ({self._failed}) and is reopened once space is freed"
                )
            with self._gate.alone(REOPEN_WAIT_S) as alone:
                if not alone:
                    raise BackendUnavailableError(
                        f"rocks_db at {self.path}: lookups still run on the database that "
                        "failed a write; it is reopened on a later write"
                    )
                with self._lock:
                    self._close_db()
                    self._open()
            log.warning("rocks_db at %s reopened after a failed write (%s)", self.path,
                        self._failed)  # fmt: skip
            self._failed = None

    def _close_db(self) -> None:
        self._cfs, self._handles = {}, {}
        db, self._db = self._db, None
        if db is not None:
            try:
                db.close()
            except Exception as exc:  # noqa: BLE001 - a failed writer refuses its last flush
                log.warning("rocks_db at %s closed with an error: %s", self.path, exc)

    def _check_space(self, tag: str, keys: int, dim: int) -> None:
        """Refuse a bulk load that cannot fit, before writing any of it."""
        need = keys * (8 + 4 * dim)
        free = shutil.disk_usage(self.path).free
        if need > free:
            raise StorageFullError(
                f"rocks_db at {self.path}: the disk is full: table {tag} needs at least "
                f"{need:,} bytes and {free:,} are free; retried once space is freed"
            )

    def _locked_message(self, exc: Exception) -> str:
        lock = os.path.join(self.path, "LOCK")
        pid = lock_holder(lock)
        if pid == os.getpid() or "current process" in str(exc):
            holder = "this process, which already has it open (another tier or model)"
        elif pid is not None:
            holder = f"another process, {describe_process(pid)}"
        else:
            holder = "another process"
        return (
            f"cannot open RocksDB at {self.path}: its lock file {lock} is held by {holder}. "
            "One process at a time may open a RocksDB path for writing: stop the other one, "
            "give this server its own persistent_db path, or open it with read_only: true "
            f"(RocksDB said: {exc})"
        )

    def _options(self):
        options = self._rd.Options(raw_mode=True)
        table = self._rd.BlockBasedOptions()
        table.set_bloom_filter(10, False)  # point lookups skip files without the key
        options.set_block_based_table_factory(table)
        return options

    # --- tables ----------------------------------------------------------------------------

    def create_table(self, tag: str, dim: int) -> None:
        with self._lock:
            old = self._dims.get(tag)
            if old is not None:
                if old != dim:
                    raise InvalidInputError(f"table {tag} exists with dim {old}, not {dim}")
                return
            if self.read_only:
                raise ReadOnlyError(f"rocks_db at {self.path} is read-only; it has no table {tag}")
        with self._writing(f"creating table {tag}"), self._lock:
            if tag in self._dims:  # created meanwhile
                return
            self._db.create_column_family(tag, self._options())
            self._db.put(_META_PREFIX + tag.encode(), str(int(dim)).encode())
            self._cfs[tag] = self._db.get_column_family(tag)
            self._handles[tag] = self._db.get_column_family_handle(tag)
            self._dims[tag] = int(dim)

    # --- expiry ----------------------------------------------------------------------------

    def set_ttl(self, tag: str, seconds: float | None) -> None:
        """:meth:`Tier.set_ttl`: the table gets a column family ``<tag>#t`` of each row's last
        write or lookup time (int64 microseconds), written with the rows and by lookups that
        find them, and swept by :meth:`expire`.  (rocksdict's ``AccessType.with_ttl`` is one
        TTL for the whole database, counted from writes only and applied when compaction
        happens to run: not a table's TTL after its last lookup.)"""
        if seconds is None:
            return
        if self.read_only:
            raise ConfigError(f"ttl_seconds: rocks_db at {self.path} is read-only, it cannot "
                              "expire rows")  # fmt: skip
        self._require_dim(tag)
        name = _times_cf(tag)
        with self._writing(f"creating the access times of {tag}"), self._lock:
            if name not in self._db.list_cf(self.path, self._options()):
                self._db.create_column_family(name, self._options())
            self._ttl[tag] = float(seconds)

    def _stamp(self, wb, tag: str, fields: list) -> None:
        """Queue the access time of ``fields`` of a table with a TTL into write batch ``wb``."""
        handle = self._db.get_column_family_handle(_times_cf(tag))
        now = (time.time_ns() // 1000).to_bytes(8, "little")
        for f in fields:
            wb.put(f, now, handle)

    def _touch(self, tag: str, fields: list) -> None:
        """Record a lookup of ``fields`` (best effort: a failed write only loses the time)."""
        try:
            with self._writing(f"recording access times of {tag}"):
                wb = self._rd.WriteBatch(raw_mode=True)
                self._stamp(wb, tag, fields)
                self._db.write(wb)
        except BackendUnavailableError as exc:
            log.warning("rocks_db: could not record access times of %s: %s", tag, exc)

    def expire(self, tag: str, keep=None) -> np.ndarray:
        """Remove the rows of ``tag`` not written or looked up for its TTL: a scan of its
        access times, then one write batch per ``max_batch_size`` old rows."""
        seconds = self._ttl.get(tag)
        if seconds is None or tag not in self._dims:
            return _NO_KEYS
        cutoff = time.time_ns() // 1000 - int(seconds * 1e6)
        with self._gate.using():
            times = self._db.get_column_family(_times_cf(tag))
            raw = [(k, v) for k, v in times.items()]
        if not raw:
            return _NO_KEYS
        stamps = np.frombuffer(b"".join(v for _, v in raw), dtype="<i8")
        old = [raw[i][0] for i in np.flatnonzero(stamps < cutoff).tolist()]
        if keep is not None and old:
            spared = keep(np.frombuffer(b"".join(old), dtype="<i8").astype(np.int64))
            if spared.any():
                self._touch(tag, [f for f, s in zip(old, spared.tolist()) if s])
                old = [f for f, s in zip(old, spared.tolist()) if not s]
        mb = self.max_batch_size
        with self._writing(f"expiring rows of {tag}"):
            for c0 in range(0, len(old), mb):
                self._write(tag, lambda wb, f=old[c0 : c0 + mb]: self._delete(wb, tag, f))
        self.stats.expired += len(old)
        return np.frombuffer(b"".join(old), dtype="<i8").astype(np.int64)

    def dim(self, tag: str) -> int | None:
        return self._dims.get(tag)

    def tables(self) -> list[str]:
        return list(self._dims)

    def drop_table(self, tag: str) -> None:
        if self.read_only and tag in self._dims:
            raise ReadOnlyError(f"rocks_db at {self.path} is read-only")
        with self._writing(f"dropping table {tag}"), self._lock:
            if tag not in self._dims:
                return
            self._cfs.pop(tag)
            self._handles.pop(tag)
            self._dims.pop(tag)
            self._db.drop_column_family(tag)
            self._db.delete(_META_PREFIX + tag.encode())
            if self._ttl.pop(tag, None) is not None:
                self._db.drop_column_family(_times_cf(tag))

    # --- data ------------------------------------------------------------------------------

    def contains(self, tag: str, keys) -> np.ndarray:
        with self._gate.using():
            return self._lookup(tag, keys)[1]  # no access time recorded

    def lookup(self, tag: str, keys) -> tuple[np.ndarray, np.ndarray]:
        with self._gate.using():
            emb, found = self._lookup(tag, keys)
        if tag in self._ttl and found.any():  # outside the gate: the touch is a write
            self._touch(tag, key_fields(as_keys(keys)[found]))
        return emb, found

    def _lookup(self, tag: str, keys) -> tuple[np.ndarray, np.ndarray]:
        dim = self._require_dim(tag)
        cf = self._cfs.get(tag)
        if cf is None:  # a reopen after a failed write did not succeed yet
            raise BackendUnavailableError(f"rocks_db at {self.path} is not open: {self._failed}")
        keys = as_keys(keys)
        with self.stats.timed("lookup"):
            fields = key_fields(keys)
            mb = self.max_get_batch_size
            if keys.size <= mb:
                values = cf.get(fields)
            else:
                values = []
                for c0 in range(0, keys.size, mb):
                    values.extend(cf.get(fields[c0 : c0 + mb]))
            found, found_emb = decode_values(values, dim, f"rocks_db table {tag}")
            if found_emb.shape[0] == keys.size:
                emb = found_emb.copy()
            else:
                emb = np.zeros((keys.size, dim), dtype=np.float32)
                emb[found] = found_emb
            hits = found_emb.shape[0]
            self.stats.hits += hits
            self.stats.misses += keys.size - hits
        return emb, found

    def _write(self, tag: str, fill) -> None:
        wb = self._rd.WriteBatch(raw_mode=True)
        wb.set_default_column_family(self._handles[tag])
        fill(wb)
        self._db.write(wb)

    def insert(self, tag: str, keys, embeddings) -> None:
        if self.read_only:
            raise ReadOnlyError(f"rocks_db at {self.path} is read-only")
        dim = self._require_dim(tag)
        keys, embeddings = self._check_insert(keys, embeddings, dim, tag)
        with self.stats.timed("insert"), self._writing(f"writing table {tag}"):
            mb = self.max_batch_size
            for c0 in range(0, keys.size, mb):
                fields = key_fields(keys[c0 : c0 + mb])
                vals = vector_values(embeddings[c0 : c0 + mb])
                stamp = tag in self._ttl

                def fill(wb, f=fields, v=vals, stamp=stamp):
                    _drain(map(wb.put, f, v))
                    if stamp:
                        self._stamp(wb, tag, f)

                self._write(tag, fill)
            self.stats.inserts += keys.size

    def load_table(self, tag: str, keys, embeddings, chunk: int = 1 << 18) -> None:
        """Bulk insert (refused first when it cannot fit on the disk), then compact the column
        family so reads touch few files."""
        self._check_space(tag, int(np.asarray(keys).shape[0]), self._require_dim(tag))
        super().load_table(tag, keys, embeddings, chunk)
        with self._writing(f"compacting table {tag}"):
            self._cfs[tag].compact_range(None, None)

    def evict(self, tag: str, keys) -> int:
        if self.read_only:
            raise ReadOnlyError(f"rocks_db at {self.path} is read-only")
        if tag not in self._dims:
            return 0
        keys = as_keys(keys)
        present = int(np.count_nonzero(self.lookup(tag, keys)[1]))
        mb = self.max_batch_size
        with self._writing(f"evicting from table {tag}"):
            for c0 in range(0, keys.size, mb):
                fields = key_fields(keys[c0 : c0 + mb])
                self._write(tag, lambda wb, f=fields: self._delete(wb, tag, f))
        return present

    def _delete(self, wb, tag: str, fields: list) -> None:
        """Queue the deletion of rows ``fields`` (and their access times) into ``wb``."""
        _drain(map(wb.delete, fields))
        if tag in self._ttl:
            handle = self._db.get_column_family_handle(_times_cf(tag))
            for f in fields:
                wb.delete(f, handle)

    def size(self, tag: str) -> int:
        """The exact number of keys (iterates the column family)."""
        with self._gate.using():
            cf = self._cfs.get(tag)
            return 0 if cf is None else sum(1 for _ in cf.keys())  # noqa: SIM118 - Rdict.keys() iterates lazily

    def list_keys(self, tag: str) -> np.ndarray:
        with self._gate.using():
            cf = self._cfs.get(tag)
            if cf is None:
                return np.empty(0, dtype=np.int64)
            return np.frombuffer(b"".join(cf.keys()), dtype="<i8").astype(np.int64)

    def get_meta(self, name: str) -> str | None:
        with self._gate.using():
            if self._db is None:
                raise BackendUnavailableError(
                    f"rocks_db at {self.path} is not open: {self._failed}"
                )
            raw = self._db.get(b"hps_meta/" + name.encode())
        return None if raw is None else raw.decode()

    def set_meta(self, name: str, value: str) -> None:
        if self.read_only:
            raise ReadOnlyError(f"rocks_db at {self.path} is read-only")
        with self._writing(f"recording {name}"):
            self._db.put(b"hps_meta/" + name.encode(), value.encode())

    def flush(self) -> None:
        """Flush memtables to disk."""
        if not self.read_only:
            with self._writing("flushing"):
                self._db.flush()

    def close(self) -> None:
        with self._lock:
            self._close_db()
