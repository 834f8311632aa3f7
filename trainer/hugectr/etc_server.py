"""The parameter server of one Embedding Training Cache table (:mod:`.etc`): the table's
full rows (vector and optimizer state packed in one row, :class:`_RowLayout`) in the
project's in-process hash map (``Staged``) or in RocksDB behind a bounded host cache
(``Cached``), and the helpers that move rows to and from it a chunk at a time."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from .etc_params import HMemCacheConfig, TrainPSType_t

#: Rows moved between the working table and the parameter server per call.
CHUNK_ROWS = 1 << 13


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
