"""HugeCTR's Embedding Training Cache (ETC): train tables larger than memory, a keyset at a time.

``Model(solver, reader, optimizer, etc=CreateETC(...))`` keeps each table's full contents
(vectors and optimizer state) in a parameter server built from the project's own tiers:

* ``TrainPSType_t.Staged``: the in-process hash map (:class:`tierserve.ps.hash_map.HashMapTier`);
  the whole table sits in host memory.
* ``TrainPSType_t.Cached``: RocksDB on disk (:class:`tierserve.ps.rocksdb_tier.RocksDBTier`,
  at ``local_paths[rank]``) behind a host-memory cache of at most
  ``num_blocks * block_size_mb`` MB (:func:`CreateHMemCache`).  That budget holds RocksDB's
  own memory (a quarter: its two memtables and its block cache, :func:`rocksdb_memory`) and
  an in-process hash map of rows (the rest) that evicts the least used rows.  Writes go to
  RocksDB, which always holds the whole table, and refresh the rows the hash map holds;
  rows read from RocksDB enter the hash map.

The model's embedding table holds only the working set: ``get_embedding_training_cache().update
(keyset)`` writes the working set back to the parameter server, empties the table and loads
the rows of the keyset's keys (keys not yet in the server start as a fresh key does).  So
memory holds one keyset's rows (bounded by ``workspace_size_per_gpu_in_mb``) plus, for
``Cached``, the host cache.  ``set_source(source=[...], keyset=[...])`` with ``fit`` does the
same for each file list in turn (HugeCTR's epoch-mode ETC training).

Under ``mpiexec -n N`` each rank keeps the rows it owns (the sharded table's rule:
``DistributedSlot`` keys by the key mixer, ``Localized`` slots ``s % N``) in a server of its
own: Staged, its own hash map; Cached, its own RocksDB at ``local_paths[rank]`` when
``local_paths`` lists one path per rank, else at ``<local_paths[0]>/rank<r>``.  ``update``
loads, on each rank, its keys of the keyset (every rank reads the whole keyset file and
keeps its own), and training moves lookups and gradients between ranks as without the
cache.  ``save_params_to_files`` merges the ranks' rows on rank 0, which writes the one
table in key order, as one process does; ``total_rows`` counts every rank's rows.

``save_params_to_files`` writes each full table (working set written back first) to its
``sparse_models`` path, streamed from the server: the sparse model folder (``key``,
``emb_vector``[, ``slot_id``]) and the optimizer state beside its vectors as
``<Optimizer>.<state>`` files in the same row order, as HugeCTR's ETC writes them; the dense
files go to the prefix as usual.  An existing ``sparse_models`` folder is loaded at start
(incremental training).  Keyset files are HugeCTR's: the keys, raw little-endian, in the
model's key width (``i64_input_key``: int64, else uint32; HugeCTR's ``load_keyset_from_file``
reads ``sizeof(TypeKey)``-byte keys and ``criteo2hugectr`` writes uint32 ones).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from tierserve.core.errors import ConfigError
from tierserve.model.device import to_numpy
from tierserve.ps.atomic import atomic_directory
from tierserve.ps.sparse_file import KEY_FILE, SLOT_FILE, VECTOR_FILE, SparseTable

from .etc_keysets import (  # noqa: F401 - KeysetReader, write_keyset: re-exported
    KeysetReader,
    _keyset_chunks,
    keyset_dtype,
    keyset_size,
    read_keyset,
    write_keyset,
)
from .etc_params import (  # noqa: F401 - HugeCTR's names, re-exported
    CreateETC,
    CreateHMemCache,
    EmbeddingTrainingCacheParams,
    HMemCacheConfig,
    TrainPSType_t,
)
from .etc_server import (  # noqa: F401 - rocksdb_memory, ...: re-exported
    CHUNK_ROWS,
    ROCKSDB_BLOCK_CACHE_BYTES,
    ROCKSDB_WRITE_BUFFER_BYTES,
    TableServer,
    _bounded_rocksdb,
    _chunks,
    _read_rows,
    _RowLayout,
    rocksdb_memory,
)


class EmbeddingTrainingCache:
    """The ETC of a compiled model (``Model.get_embedding_training_cache()``)."""

    def __init__(self, model: Any, params: EmbeddingTrainingCacheParams) -> None:
        if len(params.ps_types) != len(model.tables):
            raise ConfigError(f"CreateETC gives {len(params.ps_types)} ps_types but the model "
                              f"has {len(model.tables)} embedding tables")
        self.model = model
        self.params = params
        self.i64_input_key = bool(model.solver.i64_input_key)  # the keyset files' key width
        dist = getattr(model, "_dist", None)
        self.comm = None if dist is None else dist.comm
        self.rank, self.size = (0, 1) if dist is None else (dist.rank, dist.size)
        self.servers: list[TableServer] = []
        _map_large_allocations()
        for i in range(len(model.tables)):
            table = self._table(i)
            if table._index is None:
                raise ConfigError(f"etc: embedding {table.name!r} is one-hot "
                                  "(LocalizedSlotSparseEmbeddingOneHot), which has no keys to "
                                  "page; use a hash embedding")
            ps_type = params.ps_types[i]
            local = cache = None
            if ps_type is TrainPSType_t.Cached:
                local = os.path.join(self._rank_path(params.local_paths), f"etc_table{i}")
                cache = params.cache_config(i)
            server = TableServer(table.name, ps_type, _RowLayout(table), local, cache)
            self.servers.append(server)
            if os.path.isdir(params.sparse_models[i]):
                self._load_model(i, params.sparse_models[i])
        self._sources: list[tuple[Any, Any]] = []

    # -- ranks ------------------------------------------------------------------------------

    def _table(self, i: int) -> Any:
        """This rank's working table ``i`` (under several ranks, the rows it owns)."""
        table = self.model.tables[i]
        return table.local if self.size > 1 else table

    def _rank_path(self, paths: list[str]) -> str:
        """This rank's folder for its Cached tables: ``local_paths[rank]`` when there is one
        path per rank, else ``<local_paths[0]>/rank<r>`` under several ranks."""
        if self.size == 1:
            return paths[0]
        if len(paths) == self.size:
            return paths[self.rank]
        if len(paths) == 1:
            return os.path.join(paths[0], f"rank{self.rank}")
        raise ConfigError(f"CreateETC: local_paths lists {len(paths)} paths but the job has "
                          f"{self.size} ranks: give one per rank, or one folder (rank r then "
                          "uses <folder>/rank<r>)")

    def _mine(self, i: int, keys: np.ndarray, slots: np.ndarray | None = None) -> np.ndarray:
        """Which of ``keys`` (with their ``slots``) this rank owns (all in one process).  A
        Localized table's key without its slot counts as this rank's: only its owner's server
        holds it, which the lookup settles."""
        if self.size == 1:
            return np.ones(keys.shape[0], dtype=bool)
        owner = self.model.tables[i]
        if owner.localized and slots is None:
            return np.ones(keys.shape[0], dtype=bool)
        return owner.owner_of(keys, slots) == self.rank

    # -- moving rows ------------------------------------------------------------------------

    def _write_back(self, i: int) -> None:
        """Write table ``i``'s working rows to its server, then empty the working table."""
        self._store(i)
        self._reset_table(i)
        _release_freed_memory()

    def _store(self, i: int) -> None:
        """Write table ``i``'s working rows to its server (the table stays as it is)."""
        table = self._table(i)
        server = self.servers[i]
        n = table.num_rows
        keys = to_numpy(table.keys)
        for lo in range(0, n, CHUNK_ROWS):  # device arrays come to the host a chunk at a time
            hi = min(n, lo + CHUNK_ROWS)
            states = {k: to_numpy(a[lo:hi]) for k, a in table.state.items()}
            slots = None if table._slot_ids is None else to_numpy(table._slot_ids[lo:hi])
            server.put(keys[lo:hi], server.layout.pack(to_numpy(table.values[lo:hi]), states,
                                                       slots))

    def _reset_table(self, i: int) -> None:
        from . import adapters

        old = self._table(i)
        spec = self.model.embedding_specs[i]
        fresh = adapters.make_table(spec, self.model._table_optimizer(spec), self.model.solver,
                                    self.model.xp)
        if old.frozen:
            fresh.freeze()
        if self.size > 1:  # the sharded table keeps its place; its rows start afresh
            self.model.tables[i].local = fresh
            self.model.tables[i]._saved = None
        else:
            self.model.tables[i] = fresh

    def _check_keyset(self, i: int, path: Any, count: int) -> None:
        """Refuse a keyset with more distinct keys than table ``i``'s workspace holds."""
        table = self._table(i)
        if self.size == 1 and count > table.max_rows:  # (only then is it read whole, to count;
            # a rank of several holds its share, which the lookups check)
            table._check_capacity(
                int(np.unique(read_keyset(path, self.i64_input_key)).shape[0]))

    def _fill(self, i: int, path: Any, count: int) -> None:
        """Load the server's rows of the keys of keyset file ``path`` (``count`` keys) into
        the (empty) working table ``i``, streamed a chunk at a time: the keyset is never in
        memory whole.  Rows follow the keyset's order."""
        table, server = self._table(i), self.servers[i]
        need = count
        if self.size > 1:  # this rank's share: its keys of a DistributedSlot table (a
            # Localized table's share is known as rows are found: it grows as they come)
            need = 0 if self.model.tables[i].localized else sum(
                int(self._mine(i, chunk).sum())
                for chunk in _keyset_chunks(path, self.i64_input_key))
        need = min(need, table.max_rows)
        if need:
            table._reserve(need)  # once: no doubling (old and new arrays) mid-pass
            table._index.reserve(need)
        for chunk in _keyset_chunks(path, self.i64_input_key):
            if self.size > 1:
                chunk = chunk[self._mine(i, chunk)]
            rows, found = server.get(chunk)
            if not found.any():
                continue
            have = chunk[found]
            vectors, states, slots = server.layout.unpack(rows[found])
            table.load(SparseTable(keys=have, embeddings=vectors, slot_ids=slots))
            table.load_optimizer_state(have, states)
        table._dirty[: table.num_rows] = False

    def _load_model(self, i: int, folder: str) -> None:
        """Put an existing sparse model (and its optimizer state, when beside it) into the
        server of table ``i``."""
        from tierserve.ps.sparse_file import read_sparse_model

        table, server = self._table(i), self.servers[i]
        model = read_sparse_model(folder, table.dim)
        opt = table.optimizer
        n = len(model)
        files = {name: Path(folder) / f"{type(opt).__name__}.{name}"
                 for name in [*opt.state_names, *opt.row_state_names]}
        have_state = all(p.is_file() for p in files.values())
        for lo in range(0, n, CHUNK_ROWS):
            hi = min(n, lo + CHUNK_ROWS)
            keys = np.asarray(model.keys[lo:hi], dtype=np.int64)
            states = {}
            for name in opt.state_names:
                states[name] = (_read_rows(files[name], np.float32, lo, hi, table.dim)
                                if have_state else opt.init_state((hi - lo, table.dim))[name])
            for name in opt.row_state_names:
                states[name] = (_read_rows(files[name], np.int64, lo, hi, 1).reshape(-1)
                                if have_state else np.ones(hi - lo, dtype=np.int64))
            slots = None
            if server.layout.has_slots:
                slots = (np.asarray(model.slot_ids[lo:hi]) if model.slot_ids is not None
                         else np.zeros(hi - lo, dtype=np.int64))
            vectors = np.asarray(model.embeddings[lo:hi])
            if self.size > 1:  # this rank's rows only
                mine = self._mine(i, keys, slots if slots is not None
                                  else np.zeros(hi - lo, dtype=np.int64))
                keys, vectors = keys[mine], vectors[mine]
                states = {k: v[mine] for k, v in states.items()}
                slots = None if slots is None else slots[mine]
            server.put(keys, server.layout.pack(vectors, states, slots))

    # -- HugeCTR's API ----------------------------------------------------------------------

    def update(self, keyset: Any) -> None:
        """Make the keyset's rows the working set: a keyset file (every table), or a list
        of keyset files (one per table).  The current working set is written back first."""
        files = [keyset] * len(self.servers) if isinstance(keyset, (str, os.PathLike)) \
            else list(keyset)
        if len(files) != len(self.servers):
            raise ConfigError(f"EmbeddingTrainingCache.update: {len(files)} keyset files for "
                              f"{len(self.servers)} embedding tables")
        counts = [keyset_size(f, self.i64_input_key) for f in files]
        for i, (path, count) in enumerate(zip(files, counts)):
            self._check_keyset(i, path, count)
        for i, (path, count) in enumerate(zip(files, counts)):
            self._write_back(i)
            self._fill(i, path, count)

    def flush(self) -> None:
        """Write every working set back (the working tables stay loaded)."""
        for i in range(len(self.model.tables)):
            self._store(i)

    def total_rows(self, i: int) -> int:
        """Rows table ``i`` has in all (its servers on every rank, after a flush; collective
        under several ranks)."""
        n = self.servers[i].size()
        if self.size == 1:
            return n
        sizes, _ = self.comm.allgatherv(np.asarray([n], dtype=np.int64), "etc: table rows")
        return int(sizes.sum())

    def save(self) -> list[str]:
        """Write every full table to its ``sparse_models`` path (streamed from the server);
        returns the folders."""
        self.flush()
        return [self._save_table(i, self.params.sparse_models[i])
                for i in range(len(self.servers))]

    def _save_table(self, i: int, folder: str) -> str:
        server, table = self.servers[i], self._table(i)
        opt = table.optimizer
        chunks = self._sorted_rows(i)
        if self.rank != 0:  # the other ranks send their rows to rank 0, which writes
            for _ in chunks:
                pass
            return folder
        state_files = [f"{type(opt).__name__}.{n}" for n in
                       [*opt.state_names, *opt.row_state_names]]
        with atomic_directory(folder) as tmp:
            names = [KEY_FILE, VECTOR_FILE, *state_files]
            if server.layout.has_slots:
                names.append(SLOT_FILE)
            handles = {n: open(tmp / n, "wb") for n in names}  # noqa: SIM115 - closed below
            try:
                for chunk, rows in chunks:
                    vectors, states, slots = server.layout.unpack(rows)
                    handles[KEY_FILE].write(chunk.astype("<i8").tobytes())
                    handles[VECTOR_FILE].write(np.ascontiguousarray(vectors, "<f4").tobytes())
                    for n in opt.state_names:
                        handles[f"{type(opt).__name__}.{n}"].write(
                            np.ascontiguousarray(states[n], "<f4").tobytes())
                    for n in opt.row_state_names:
                        handles[f"{type(opt).__name__}.{n}"].write(
                            np.ascontiguousarray(states[n], "<i8").tobytes())
                    if slots is not None:
                        handles[SLOT_FILE].write(slots.astype("<i8").tobytes())
            finally:
                for f in handles.values():
                    f.flush()
                    os.fsync(f.fileno())
                    f.close()
        return folder

    def _sorted_rows(self, i: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Table ``i``'s rows in key order, a chunk at a time, as one process writes them: on
        rank 0 (the rows of every rank; the other ranks yield nothing and send theirs).

        Each round every rank offers the key ``CHUNK_ROWS`` past what it has sent (or none,
        when fewer are left); the smallest offer bounds the round, and every rank sends rank 0
        its keys below it, which rank 0 merges: the rounds follow key order, and no rank sends
        more than ``CHUNK_ROWS`` rows in one."""
        server = self.servers[i]
        keys = np.sort(server.keys())
        if self.size == 1:
            yield from _chunks(server, keys)
            return
        width = server.layout.width
        at, n, last = 0, int(keys.shape[0]), np.iinfo(np.int64).max
        while True:
            offer = keys[at + CHUNK_ROWS] if at + CHUNK_ROWS < n else last
            offers, _ = self.comm.allgatherv(np.asarray([[offer, n - at]], dtype=np.int64),
                                             "etc save: key bounds")
            if not offers[:, 1].any():
                return
            bound = int(offers[:, 0].min())
            hi = n if bound == last else at + int(np.searchsorted(keys[at:], bound))
            send = keys[at:hi]
            rows, _ = server.get(send)
            counts = np.zeros(self.size, dtype=np.int64)
            counts[0] = send.shape[0]
            got_keys, _ = self.comm.alltoallv(send, counts, "etc save: keys")
            got_rows, _ = self.comm.alltoallv(rows, counts, "etc save: rows",
                                              row_shape=(width,))
            at = hi
            if self.rank == 0:
                order = np.argsort(got_keys, kind="stable")
                yield got_keys[order], got_rows[order]

    def set_sources(self, sources: list[Any], keysets: list[Any]) -> None:
        """The (file list, keyset) pairs an epoch trains in turn (``Model.set_source``)."""
        if len(sources) != len(keysets):
            raise ConfigError(f"set_source: {len(sources)} sources but {len(keysets)} keysets; "
                              "give one keyset per file list")
        self._sources = list(zip(sources, keysets))

    def close(self) -> None:
        for server in self.servers:
            server.close()


def _map_large_allocations() -> None:
    """Serve allocations of 1 MB and more with their own mappings, returned to the system when
    freed, and keep RocksDB's background threads to two malloc arenas.  glibc otherwise raises
    the mapping threshold as large blocks are freed and carves the next working tables out of
    a heap that never shrinks, and gives each compaction thread an arena that keeps what it
    freed: RSS would climb pass after pass although the live data does not."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 1 << 20)  # M_MMAP_THRESHOLD
        libc.mallopt(-8, 2)  # M_ARENA_MAX
    except (OSError, AttributeError):
        pass


def _release_freed_memory() -> None:
    """Hand memory freed by the old working table back to the system (glibc keeps freed
    heap memory otherwise, and RSS would not fall between keysets)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
