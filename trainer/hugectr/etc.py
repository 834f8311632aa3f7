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

import enum
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tierserve.core.errors import ConfigError
from tierserve.model.device import to_numpy
from tierserve.ps.atomic import atomic_directory
from tierserve.ps.sparse_file import KEY_FILE, SLOT_FILE, VECTOR_FILE, SparseTable

#: Rows moved between the working table and the parameter server per call.
CHUNK_ROWS = 1 << 13


class TrainPSType_t(enum.Enum):  # noqa: N801 - HugeCTR's name
    """Where an ETC table lives: ``Staged`` (host memory) or ``Cached`` (disk + host cache)."""

    Staged = "Staged"
    Cached = "Cached"


@dataclass(frozen=True)
class HMemCacheConfig:
    """The host-memory cache of a ``Cached`` table: ``num_blocks`` blocks of
    ``block_size_mb`` MB (vectors and optimizer state)."""

    num_blocks: int = 1
    block_size_mb: float = 64.0

    @property
    def capacity_bytes(self) -> int:
        return int(self.num_blocks * self.block_size_mb * (1 << 20))


def CreateHMemCache(num_blocks: int = 1, target_hit_rate: float | None = None,  # noqa: N802
                    max_num_evict: int | None = None,
                    block_size_mb: float = 64.0) -> HMemCacheConfig:
    """HugeCTR's ``CreateHMemCache``: a host cache of ``num_blocks`` x ``block_size_mb`` MB.

    ``target_hit_rate`` (0 .. 1) and ``max_num_evict`` (>= 0), HugeCTR's tuning of when its
    pass-sized blocks are evicted and when the cache freezes, are checked and then warn: this
    cache evicts its least used rows whenever it is full and never freezes.  Either way every
    row is read from and written back to the RocksDB table, so the trained values are the
    same; only the disk traffic differs."""
    from tierserve.core.compat import warn_once

    if target_hit_rate is not None:
        if not 0.0 <= float(target_hit_rate) <= 1.0:
            raise ConfigError(f"CreateHMemCache: target_hit_rate must be in [0, 1], "
                              f"got {target_hit_rate}")
        warn_once("CreateHMemCache.target_hit_rate", "the host cache evicts its least used "
                  "rows whenever it is full, whatever its hit rate (the trained values are "
                  "the same)")
    if max_num_evict is not None:
        if int(max_num_evict) < 0:
            raise ConfigError(f"CreateHMemCache: max_num_evict must be >= 0, got {max_num_evict}")
        warn_once("CreateHMemCache.max_num_evict", "the host cache is never frozen: it evicts "
                  "its least used rows whenever it is full (the trained values are the same)")
    if int(num_blocks) < 1 or float(block_size_mb) <= 0:
        raise ConfigError(f"CreateHMemCache: num_blocks must be >= 1 and block_size_mb > 0, "
                          f"got {num_blocks}, {block_size_mb}")
    return HMemCacheConfig(int(num_blocks), float(block_size_mb))


@dataclass(frozen=True)
class EmbeddingTrainingCacheParams:
    """What :func:`CreateETC` returns (HugeCTR's ``EmbeddingTrainingCacheParams``)."""

    ps_types: list[TrainPSType_t]
    sparse_models: list[str]
    local_paths: list[str] = field(default_factory=list)
    hmem_cache_configs: list[HMemCacheConfig] = field(default_factory=list)

    def cache_config(self, table: int) -> HMemCacheConfig:
        """The host cache of table ``table`` (a ``Cached`` one): the only config, or the one
        for this table's occurrence among the ``Cached`` tables."""
        if len(self.hmem_cache_configs) == 1:
            return self.hmem_cache_configs[0]
        nth = sum(t is TrainPSType_t.Cached for t in self.ps_types[:table])
        return self.hmem_cache_configs[nth]


def CreateETC(ps_types: list[Any], sparse_models: list[str],  # noqa: N802 - HugeCTR's name
              local_paths: list[str] | None = None,
              hmem_cache_configs: list[HMemCacheConfig] | None = None
              ) -> EmbeddingTrainingCacheParams:
    """HugeCTR's ``CreateETC``: one parameter-server type and sparse model path per embedding
    table; ``local_paths`` (one per rank) and ``hmem_cache_configs`` (one, or one per
    ``Cached`` table) when a table is ``Cached``."""
    types = []
    for t in ps_types:
        try:
            types.append(t if isinstance(t, TrainPSType_t) else TrainPSType_t(str(t)))
        except ValueError:
            raise ConfigError(f"CreateETC: ps_types entries must be TrainPSType_t.Staged or "
                              f"Cached, got {t!r}") from None
    models = [os.fspath(p) for p in sparse_models]
    if not types or len(types) != len(models):
        raise ConfigError(f"CreateETC: {len(types)} ps_types for {len(models)} sparse_models; "
                          "give one of each per embedding table")
    paths = [os.fspath(p) for p in (local_paths or [])]
    caches = list(hmem_cache_configs or [])
    cached = sum(t is TrainPSType_t.Cached for t in types)
    if cached:
        if not paths:
            raise ConfigError("CreateETC: a Cached table needs local_paths (one per rank)")
        if len(caches) not in (1, cached):
            raise ConfigError(f"CreateETC: hmem_cache_configs must hold 1 or {cached} entries "
                              f"(one per Cached table), got {len(caches)}")
        if not all(isinstance(c, HMemCacheConfig) for c in caches):
            raise ConfigError("CreateETC: hmem_cache_configs entries come from CreateHMemCache")
    return EmbeddingTrainingCacheParams(types, models, paths, caches)


# -- the parameter server of one table --------------------------------------------------------


class _RowLayout:
    """How a table row (vector, optimizer state, prev_time, slot id) packs into float32s."""

    def __init__(self, table: Any) -> None:
        self.dim = table.dim
        self.states = list(table.optimizer.state_names)
        self.row_states = list(table.optimizer.row_state_names)
        self.has_slots = table._slot_ids is not None
        self.width = (self.dim * (1 + len(self.states)) + 2 * len(self.row_states)
                      + (2 if self.has_slots else 0))

    def pack(self, vectors: np.ndarray, states: dict[str, np.ndarray],
             slot_ids: np.ndarray | None) -> np.ndarray:
        n = vectors.shape[0]
        out = np.empty((n, self.width), dtype=np.float32)
        d, at = self.dim, self.dim
        out[:, :d] = vectors
        for name in self.states:
            out[:, at : at + d] = states[name]
            at += d
        for name in self.row_states:
            out[:, at : at + 2] = np.ascontiguousarray(states[name], dtype=np.int64).view(
                np.float32).reshape(n, 2)
            at += 2
        if self.has_slots:
            out[:, at : at + 2] = np.ascontiguousarray(slot_ids, dtype=np.int64).view(
                np.float32).reshape(n, 2)
        return out

    def unpack(self, rows: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray],
                                                np.ndarray | None]:
        d, at = self.dim, self.dim
        vectors = rows[:, :d]
        states: dict[str, np.ndarray] = {}
        for name in self.states:
            states[name] = rows[:, at : at + d]
            at += d
        for name in self.row_states:
            states[name] = np.ascontiguousarray(rows[:, at : at + 2]).view(np.int64).reshape(-1)
            at += 2
        slot_ids = None
        if self.has_slots:
            slot_ids = np.ascontiguousarray(rows[:, at : at + 2]).view(np.int64).reshape(-1)
        return vectors, states, slot_ids


class TableServer:
    """One table's full rows in a tier (Staged) or RocksDB behind a bounded cache (Cached)."""

    def __init__(self, name: str, ps_type: TrainPSType_t, layout: _RowLayout,
                 local_path: str | None = None, cache: HMemCacheConfig | None = None) -> None:
        from tierserve.ps.hash_map import HashMapConfig, HashMapTier

        self.tag = f"etc.{name}"
        self.layout = layout
        self.ps_type = ps_type
        self.cache = None
        if ps_type is TrainPSType_t.Staged:
            self.store = HashMapTier(HashMapConfig())
        else:
            write_buffer, block_cache = rocksdb_memory(cache.capacity_bytes)
            self.store = _bounded_rocksdb(os.fspath(local_path), write_buffer, block_cache)
            # the cache's real footprint stays within the rest of the budget: a hash-map row
            # costs its key and floats over the map's fill (0.7 after growth), and an eviction
            # rebuilds the arrays while the old ones are alive (x2)
            rows_budget = max(0, cache.capacity_bytes - 2 * write_buffer - block_cache)
            row_bytes = (4 * layout.width + 8) / 0.7 * 2
            self.cache_rows = max(1, int(rows_budget // row_bytes))
            self.cache = HashMapTier(HashMapConfig(overflow_margin=self.cache_rows,
                                                   overflow_policy="evict_least_used"))
            self.cache.create_table(self.tag, layout.width)
        self.store.create_table(self.tag, layout.width)

    def get(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(rows [n, width], found [n])`` of ``keys``."""
        if self.cache is None:
            return self.store.lookup(self.tag, keys)
        rows, found = self.cache.lookup(self.tag, keys)
        missing = np.flatnonzero(~found)
        if missing.shape[0]:
            disk, on_disk = self.store.lookup(self.tag, keys[missing])
            rows[missing[on_disk]] = disk[on_disk]
            found[missing[on_disk]] = True
            if on_disk.any():
                self.cache.insert(self.tag, keys[missing[on_disk]], disk[on_disk])
        return rows, found

    def put(self, keys: np.ndarray, rows: np.ndarray) -> None:
        self.store.insert(self.tag, keys, rows)
        if self.cache is not None:  # refresh what the cache holds; a working set written
            # back whole would only churn it (and evicting costs memory while it runs)
            _, cached = self.cache.lookup(self.tag, keys)
            if cached.any():
                self.cache.insert(self.tag, keys[cached], rows[cached])

    def keys(self) -> np.ndarray:
        return self.store.list_keys(self.tag)

    def size(self) -> int:
        return self.store.size(self.tag)

    def close(self) -> None:
        self.store.close()
        if self.cache is not None:
            self.cache.close()


#: The most memory RocksDB's memtables (each; two at most) and block cache take.  RocksDB's
#: defaults (64 MB memtables, a 32 MB block cache) would dwarf a small budget.
ROCKSDB_WRITE_BUFFER_BYTES = 4 << 20
ROCKSDB_BLOCK_CACHE_BYTES = 4 << 20
_ROCKSDB_MIN_BYTES = 64 << 10


def rocksdb_memory(capacity_bytes: int) -> tuple[int, int]:
    """``(write buffer, block cache)`` bytes of a Cached table's RocksDB, taken from its host
    cache budget: two write buffers of a sixteenth and a block cache of an eighth of it (a
    quarter in all; each at most 4 MB and at least 64 KB)."""
    def part(fraction: int, most: int) -> int:
        return int(min(most, max(_ROCKSDB_MIN_BYTES, capacity_bytes // fraction)))

    return part(16, ROCKSDB_WRITE_BUFFER_BYTES), part(8, ROCKSDB_BLOCK_CACHE_BYTES)


def _bounded_rocksdb(path: str, write_buffer: int = ROCKSDB_WRITE_BUFFER_BYTES,
                     block_cache: int = ROCKSDB_BLOCK_CACHE_BYTES) -> Any:
    """The project's RocksDB tier with RocksDB's own memory bounded: two memtables of
    ``write_buffer`` bytes at most and a block cache of ``block_cache`` bytes, which holds the
    index and filter blocks too."""
    from tierserve.ps.rocksdb_tier import RocksDBConfig, RocksDBTier

    class BoundedRocksDBTier(RocksDBTier):
        def _options(self):
            options = super()._options()
            options.set_write_buffer_size(write_buffer)
            options.set_max_write_buffer_number(2)
            table = self._rd.BlockBasedOptions()
            table.set_bloom_filter(10, False)
            table.set_block_cache(self._rd.Cache(block_cache))
            table.set_cache_index_and_filter_blocks(True)  # charged to that cache, not beside
            options.set_block_based_table_factory(table)
            return options

    return BoundedRocksDBTier(RocksDBConfig(path=path))


# -- the cache ----------------------------------------------------------------------------------


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


def _chunks(server: TableServer, keys: np.ndarray) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    for lo in range(0, keys.shape[0], CHUNK_ROWS):
        chunk = keys[lo : lo + CHUNK_ROWS]
        rows, found = server.get(chunk)
        yield chunk[found], rows[found]


def _read_rows(path: Path, dtype: Any, lo: int, hi: int, width: int) -> np.ndarray:
    item = np.dtype(dtype).itemsize * width
    with open(path, "rb") as f:
        f.seek(lo * item)
        data = f.read((hi - lo) * item)
    return np.frombuffer(data, dtype=np.dtype(dtype).newbyteorder("<")).astype(dtype).reshape(
        hi - lo, width)


def keyset_dtype(i64_input_key: bool) -> np.dtype:
    """A keyset file's key type: int64 for a model with ``i64_input_key``, else uint32."""
    return np.dtype("<i8") if i64_input_key else np.dtype("<u4")


def keyset_size(path: Any, i64_input_key: bool) -> int:
    """The number of keys in a HugeCTR keyset file of the model's key width, checked: the
    size must be whole keys, and a 32-bit model refuses a file of int64 keys (its first keys'
    high halves, read as uint32 keys, would all be 0, a key a keyset holds once)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"keyset file {path} does not exist")
    size = path.stat().st_size
    dtype = keyset_dtype(i64_input_key)
    width, flag = ("int64", "True") if i64_input_key else ("uint32", "False")
    if size % dtype.itemsize:
        raise ConfigError(f"keyset file {path} has {size} bytes, not a whole number of {width} "
                          f"keys (the model has i64_input_key={flag})")
    if not i64_input_key and size >= 32:
        head = np.fromfile(path, dtype="<u4", count=min(size // 4, 2 * CHUNK_ROWS) // 2 * 2)
        if head[0::2].any() and not head[1::2].any():
            raise ConfigError(
                f"keyset file {path} holds int64 keys (every other 4-byte word is 0) but the "
                "model has i64_input_key=False: write the keyset with 4-byte keys "
                "(write_keyset(path, keys, i64_input_key=False))")
    return size // dtype.itemsize


def read_keyset(path: Any, i64_input_key: bool) -> np.ndarray:
    """The keys of a HugeCTR keyset file of the model's key width, as int64."""
    keyset_size(path, i64_input_key)
    return np.fromfile(path, dtype=keyset_dtype(i64_input_key)).astype(np.int64)


def write_keyset(path: Any, keys: Any, i64_input_key: bool) -> Path:
    """Write ``keys`` as a HugeCTR keyset file of the model's key width (uint32 keys must lie
    in 0 .. 2**32 - 1)."""
    keys = np.asarray(keys)
    if not i64_input_key and keys.size and (keys.min() < 0 or keys.max() >= 2**32):
        bad = keys[(keys < 0) | (keys >= 2**32)][0]
        raise ConfigError(f"keyset key {int(bad)} does not fit a uint32 key "
                          "(i64_input_key=False)")
    path = Path(path)
    keys.astype(keyset_dtype(i64_input_key)).tofile(path)
    return path


def _keyset_chunks(path: Any, i64_input_key: bool, rows: int = CHUNK_ROWS
                   ) -> Iterator[np.ndarray]:
    """The keys of a keyset file, ``rows`` at a time, as int64."""
    dtype = keyset_dtype(i64_input_key)
    with open(path, "rb") as f:
        while True:
            chunk = np.fromfile(f, dtype=dtype, count=rows)
            if not chunk.shape[0]:
                return
            yield chunk.astype(np.int64)


class KeysetReader:
    """A reader handle that trains the (file list, keyset) pairs of ``set_source`` one after
    the other, calling ``update(keyset)`` before each file list; the end of the last is the
    end of the epoch, and ``set_source()`` starts again from the first.

    ``set_source(file_list)`` (HugeCTR's low-level loop: the script calls
    ``EmbeddingTrainingCache.update(keyset)`` itself) reads that file list alone, with no
    keyset of its own, until ``Model.set_source(source, keyset)`` gives pairs again."""

    def __init__(self, inner: Any, cache: EmbeddingTrainingCache) -> None:
        self.inner, self.cache = inner, cache
        self._next = 0
        self._manual = False
        self._start_pair()

    def _start_pair(self) -> bool:
        pairs = self.cache._sources
        if self._manual or self._next >= len(pairs):
            return False
        source, keyset = pairs[self._next]
        self._next += 1
        self.cache.update(keyset)
        self.inner.set_source(source)
        return True

    def next_batch(self):
        while True:
            batch = self.inner.next_batch()
            if batch is not None or not self._start_pair():
                return batch

    def is_eof(self) -> bool:
        while self.inner.is_eof():
            if not self._start_pair():
                return True
        return False

    def set_source(self, file_name: Any = "") -> None:
        if file_name not in ("", None):  # the script's own file list; it updates the keysets
            self._manual = True
            self.inner.set_source(file_name)
            return
        if self._manual:
            self.inner.set_source(file_name)
            return
        self._next = 0
        self._start_pair()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["inner"], name)
