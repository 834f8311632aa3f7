"""The persistent tier ``rocks_db``: an embedded RocksDB database through rocksdict.

Layout (DESIGN.md, Formats 8): one column family per table tag; key = the int64 key's 8
little-endian bytes; value = the vector's float32 bytes.  The vector length of each table is
kept in the default column family under ``hps_meta/dim/<tag>`` so that a reopened database
knows its tables.  Reads are multi-gets and writes are write batches, chunked at
``max_batch_size``.  ``read_only`` opens the database read-only; writes then raise
:class:`~tierserve.ps.errors.ReadOnlyError`.  One process at a time may open a path for
writing (RocksDB's ``LOCK`` file); a second one gets an error naming the lock and, where
Linux tells, the process that holds it.
"""

from __future__ import annotations

import collections
import os
import threading

import numpy as np

from .codec import decode_values, key_fields, vector_values
from .config import RocksDBConfig
from .errors import BackendUnavailableError, InvalidInputError, ReadOnlyError, require_extra
from .locks import describe_process, lock_holder
from .partition import as_keys
from .tier import Tier

_META_PREFIX = b"hps_meta/dim/"


def _drain(iterator) -> None:
    collections.deque(iterator, maxlen=0)


class RocksDBTier(Tier):
    """``rocks_db``: embeddings on local disk, surviving restarts."""

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
        self.max_batch_size = int(config.max_set_batch_size or config.max_batch_size)  # writes
        self.max_get_batch_size = int(config.max_get_batch_size or config.max_batch_size)
        self._lock = threading.Lock()
        options = self._options()
        options.create_if_missing(not self.read_only)
        options.create_missing_column_families(True)
        options.increase_parallelism(int(config.num_threads))
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
        self._cfs: dict[str, object] = {}
        self._handles: dict[str, object] = {}
        self._dims: dict[str, int] = {}
        for cf in existing:
            if cf == "default":
                continue
            raw = self._db.get(_META_PREFIX + cf.encode())
            if raw is not None:
                self._dims[cf] = int(raw)
                self._cfs[cf] = self._db.get_column_family(cf)
                self._handles[cf] = self._db.get_column_family_handle(cf)

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
            self._db.create_column_family(tag, self._options())
            self._db.put(_META_PREFIX + tag.encode(), str(int(dim)).encode())
            self._cfs[tag] = self._db.get_column_family(tag)
            self._handles[tag] = self._db.get_column_family_handle(tag)
            self._dims[tag] = int(dim)

    def dim(self, tag: str) -> int | None:
        return self._dims.get(tag)

    def tables(self) -> list[str]:
        return list(self._dims)

    def drop_table(self, tag: str) -> None:
        with self._lock:
            if tag not in self._dims:
                return
            if self.read_only:
                raise ReadOnlyError(f"rocks_db at {self.path} is read-only")
            self._cfs.pop(tag)
            self._handles.pop(tag)
            self._dims.pop(tag)
            self._db.drop_column_family(tag)
            self._db.delete(_META_PREFIX + tag.encode())

    # --- data ------------------------------------------------------------------------------

    def lookup(self, tag: str, keys) -> tuple[np.ndarray, np.ndarray]:
        dim = self._require_dim(tag)
        cf = self._cfs[tag]
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
        with self.stats.timed("insert"):
            mb = self.max_batch_size
            for c0 in range(0, keys.size, mb):
                fields = key_fields(keys[c0 : c0 + mb])
                vals = vector_values(embeddings[c0 : c0 + mb])
                self._write(tag, lambda wb, f=fields, v=vals: _drain(map(wb.put, f, v)))
            self.stats.inserts += keys.size

    def load_table(self, tag: str, keys, embeddings, chunk: int = 1 << 18) -> None:
        """Bulk insert, then compact the column family so reads touch few files."""
        super().load_table(tag, keys, embeddings, chunk)
        self._cfs[tag].compact_range(None, None)

    def evict(self, tag: str, keys) -> int:
        if self.read_only:
            raise ReadOnlyError(f"rocks_db at {self.path} is read-only")
        if tag not in self._dims:
            return 0
        keys = as_keys(keys)
        present = int(np.count_nonzero(self.lookup(tag, keys)[1]))
        mb = self.max_batch_size
        for c0 in range(0, keys.size, mb):
            fields = key_fields(keys[c0 : c0 + mb])
            self._write(tag, lambda wb, f=fields: _drain(map(wb.delete, f)))
        return present

    def size(self, tag: str) -> int:
        """The exact number of keys (iterates the column family)."""
        cf = self._cfs.get(tag)
        return 0 if cf is None else sum(1 for _ in cf.keys())  # noqa: SIM118 - Rdict.keys() iterates lazily

    def list_keys(self, tag: str) -> np.ndarray:
        cf = self._cfs.get(tag)
        if cf is None:
            return np.empty(0, dtype=np.int64)
        return np.frombuffer(b"".join(cf.keys()), dtype="<i8").astype(np.int64)

    def get_meta(self, name: str) -> str | None:
        raw = self._db.get(b"hps_meta/" + name.encode())
        return None if raw is None else raw.decode()

    def set_meta(self, name: str, value: str) -> None:
        if self.read_only:
            raise ReadOnlyError(f"rocks_db at {self.path} is read-only")
        self._db.put(b"hps_meta/" + name.encode(), value.encode())

    def flush(self) -> None:
        """Flush memtables to disk."""
        if not self.read_only:
            self._db.flush()

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._cfs.clear()
                self._handles.clear()
                self._db.close()
                self._db = None
