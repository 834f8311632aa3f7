"""The caches of one model on one device, and HugeCTR's ``CreateEmbeddingCache`` factory."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from tierserve.core.errors import (
    ConfigError,
    CorruptModelFileError,
    InvalidInputError,
    NotFoundError,
)
from tierserve.ps.config import ModelConfig, PSConfig
from tierserve.ps.sparse_file import KEY_DTYPE, KEY_FILE

from .device import device_context, to_host
from .embedding_cache import EmbeddingCache
from .metrics import CacheMetrics
from .protocols import ParameterServerLike


class ModelEmbeddingCache:
    """One :class:`EmbeddingCache` per table of a model, on one device.

    Tables are addressed by name or by index in ``embedding_table_names`` order.
    """

    def __init__(self, model: str, caches: Sequence[EmbeddingCache]) -> None:
        self.model = model
        self._caches = list(caches)
        self._by_name = {c.table: c for c in self._caches}
        self._fusable = None  # (kernels, descriptors) or False, decided at the first request

    @property
    def tables(self) -> list[str]:
        return [c.table for c in self._caches]

    @property
    def xp(self):
        """The array module of the caches' tables and answers: cupy on a GPU, else numpy."""
        return self._caches[0].xp if self._caches else np

    @property
    def device_id(self) -> int:
        """The CUDA device the caches live on (meaningless on numpy)."""
        return self._caches[0].device_id if self._caches else 0

    def cache(self, table: str | int) -> EmbeddingCache:
        """The cache of ``table`` (a name or an index)."""
        if isinstance(table, (int, np.integer)):
            if not 0 <= table < len(self._caches):
                raise NotFoundError(f"model {self.model!r} has {len(self._caches)} tables, no table {table}")
            return self._caches[int(table)]
        try:
            return self._by_name[table]
        except KeyError:
            raise NotFoundError(f"model {self.model!r} has no table {table!r}; it has {self.tables}") from None

    __getitem__ = cache

    def query(self, table: str | int, keys):
        """float32 ``[len(keys), dim]`` embeddings of ``keys`` in ``table``."""
        return self.cache(table).query(keys)

    def lookup(self, table_id: int, keys):
        """HugeCTR's spelling of :meth:`query`, by table index."""
        return self.cache(table_id).query(keys)

    def query_tables(self, keys_per_table: Sequence) -> list:
        """One embedding array per table, keys given in table order."""
        if len(keys_per_table) != len(self._caches):
            raise InvalidInputError(
                f"model {self.model!r} has {len(self._caches)} tables, got {len(keys_per_table)} key arrays"
            )
        fused = self._fused(keys_per_table)
        if fused is None:
            return [c.query(k) for c, k in zip(self._caches, keys_per_table)]
        return self._query_fused(*fused, keys_per_table)

    def _fused(self, keys_per_table: Sequence):
        """``(kernels, descriptors)`` when one ``ts_cache_lookup_tables`` launch can read
        every table: dynamic float32 caches on one device sharing the CUDA kernels, and host
        keys; else ``None`` (each cache queries on its own)."""
        if self._fusable is None:
            caches = self._caches
            kernels = caches[0]._kernel if caches else None
            fusable = kernels is not None and all(
                c.cache_type == "dynamic" and c._kernel is kernels and c.codec.identity
                and c.device_id == caches[0].device_id for c in caches
            )
            self._fusable = False
            if fusable:
                from .kernels import TableDescriptors

                with device_context(self.xp, self.device_id):
                    self._fusable = (kernels, TableDescriptors([c._table for c in caches], self.xp))
        if self._fusable is False or not all(type(k) is np.ndarray for k in keys_per_table):
            return None
        return self._fusable

    def _query_fused(self, kernels, descriptors, keys_per_table: Sequence) -> list:
        """:meth:`query_tables` with every table's hits read in one launch (one copy of the
        keys to the device, one of the hit counts back); each cache then completes its own
        misses.  A table whose writer overlapped the read is read again on its own."""
        caches = self._caches
        with device_context(self.xp, self.device_id):
            keys_h = [c._as_keys(k, "keys") for c, k in zip(caches, keys_per_table)]
            ticks = [c._next_tick() for c in caches]
            seqs = [c._seq for c in caches]
            read = kernels.lookup_tables(descriptors, keys_h, ticks)
            out = []
            for c, keys, seq, tick, (rows, hit, hits, keys_d) in zip(caches, keys_h, seqs, ticks, read):
                miss_idx = None
                if seq & 1 or c._seq != seq:
                    rows, hit, hits, miss_idx = c._read(keys_d, tick)
                out.append(c._serve(keys, keys_d, rows, hit, hits, miss_idx))
            return out

    @property
    def i64_input_key(self) -> bool:
        """Whether the caches take 64-bit keys (False: 32-bit, see tierserve.ps.keys)."""
        return all(c.i64_input_key for c in self._caches)

    def lookup_tables(self, model: str, keys_per_table: Sequence) -> list[np.ndarray]:
        """The parameter server's form of :meth:`query_tables` (host arrays), so a model's
        cache can stand where its tables are read (the older ``InferenceSession``)."""
        if model != self.model:
            raise NotFoundError(f"this embedding cache is model {self.model!r}'s, not {model!r}")
        return [to_host(v) for v in self.query_tables(keys_per_table)]

    def update(self, table: str | int, keys, embeddings) -> None:
        """Write through to the parameter server and the cache."""
        self.cache(table).update(keys, embeddings)

    def refresh(self) -> int:
        return sum(c.refresh() for c in self._caches)

    def flush(self, timeout: float | None = None) -> bool:
        return all(c.flush(timeout) for c in self._caches)

    def clear(self) -> None:
        for c in self._caches:
            c.clear()

    def metrics(self) -> list[CacheMetrics]:
        return [c.metrics() for c in self._caches]

    def close(self) -> None:
        for c in self._caches:
            c.close()

    def __enter__(self) -> ModelEmbeddingCache:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _model_config(source, model_name: str) -> ModelConfig:
    if isinstance(source, ModelConfig):
        if source.model != model_name:
            raise ConfigError(f"model config is for {source.model!r}, not {model_name!r}")
        return source
    if isinstance(source, PSConfig):
        return source.model(model_name)
    from tierserve.ps.inference_json import load_model_source

    return load_model_source(source, model_name)[1]


def table_rows(sparse_folder: str | os.PathLike) -> int:
    """Rows of a sparse model folder, from the size of its key file."""
    path = Path(sparse_folder) / KEY_FILE
    try:
        return path.stat().st_size // KEY_DTYPE.itemsize
    except FileNotFoundError:
        raise CorruptModelFileError(
            f"sparse model file {path} is missing: the cache size is a percentage of the "
            f"table's rows; pass table_rows= or capacities= to size it without the file"
        ) from None


def _static_keys(sparse_folder: str | os.PathLike) -> np.ndarray:
    path = Path(sparse_folder) / KEY_FILE
    if not path.is_file():
        raise CorruptModelFileError(f"sparse model file {path} is missing: a static cache loads every key")
    return np.fromfile(path, dtype=KEY_DTYPE)


def CreateEmbeddingCache(  # noqa: N802 - HugeCTR's name
    parameter_server: ParameterServerLike,
    cuda_dev_id: int,
    use_gpu_embedding_cache: bool,
    cache_size_percentage: float | None,
    model_config_path: str | os.PathLike | PSConfig | ModelConfig,
    model_name: str,
    i64_input_key: bool = True,
    *,
    table_rows_per_table: Sequence[int] | None = None,
    capacities: Sequence[int] | None = None,
    **cache_options,
) -> ModelEmbeddingCache:
    """HugeCTR's factory: the caches of ``model_name``'s tables on one device.

    ``model_config_path`` is a ``ps.json``, the older document's inference JSON, or a parsed
    :class:`PSConfig` / :class:`ModelConfig`.  Each table's cache holds ``cache_size_percentage`` (default: the
    model's ``gpucacheper``; validated as that field) of the table's rows, counted from its
    sparse file, at least one row (0 is the smallest cache, as in HugeCTR), or the explicit
    ``capacities``.  ``use_gpu_embedding_cache`` puts the caches on CUDA device
    ``cuda_dev_id`` with cupy (in host memory, warning once, where there is none); without it
    they live in host memory with numpy.
    ``embedding_cache_type``, ``hit_rate_threshold``, ``refresh_interval`` and
    ``refresh_delay`` (seconds) come from the model config; other keyword arguments go to
    every :class:`EmbeddingCache`.
    """
    config = _model_config(model_config_path, model_name)
    use_gpu_embedding_cache = _gpu_available(use_gpu_embedding_cache)
    if cache_size_percentage is not None:  # HugeCTR's argument: the model's gpucacheper
        config = config.updated("CreateEmbeddingCache", {"gpucacheper": "cache_size_percentage"},
                                gpucacheper=cache_size_percentage)  # fmt: skip
    sizes = _capacities(config, model_name, capacities, table_rows_per_table)
    caches: list[EmbeddingCache] = []
    try:
        for i, table in enumerate(config.embedding_table_names):
            static_keys = None
            if config.embedding_cache_type == "static":
                static_keys = _static_keys(config.sparse_files[i])
            caches.append(
                EmbeddingCache(
                    parameter_server,
                    model_name,
                    table,
                    config.embedding_vecsize_per_table[i],
                    sizes[i],
                    cache_type=config.embedding_cache_type,
                    hit_rate_threshold=config.hit_rate_threshold,
                    refresh_interval=config.refresh_interval,
                    refresh_delay=config.refresh_delay,
                    use_gpu=use_gpu_embedding_cache,
                    device_id=cuda_dev_id,
                    i64_input_key=i64_input_key,
                    static_keys=static_keys,
                    storage_dtype=config.storage_dtype[i],
                    **cache_options,
                )
            )
    except BaseException:
        for c in caches:
            c.close()
        raise
    return ModelEmbeddingCache(model_name, caches)


def _gpu_available(use_gpu: bool) -> bool:
    """``use_gpu`` where cupy sees a CUDA device; else False, with a warning (once) when a
    GPU was asked for: as the trainer does, the CPU stands in for the GPU."""
    if not use_gpu:
        return False
    from .device import cupy_or_none

    if cupy_or_none() is None:
        from tierserve.core.compat import warn_once

        warn_once("CreateEmbeddingCache.use_gpu_embedding_cache", "no usable CUDA device "
                  "(or no cupy): the embedding cache lives in host memory (numpy)")
        return False
    return True


def _capacities(
    config: ModelConfig,
    model_name: str,
    capacities: Sequence[int] | None,
    table_rows_per_table: Sequence[int] | None,
) -> list[int]:
    """Each table's cache capacity: ``capacities``, else ``gpucacheper`` of its rows
    (``table_rows_per_table``, else counted from its sparse file), at least one."""
    n = len(config.embedding_table_names)
    for what, given in (("capacities", capacities), ("table_rows_per_table", table_rows_per_table)):
        if given is not None and len(given) != n:
            raise ConfigError(f"{what} has {len(given)} entries, model {model_name!r} has {n} tables")
    if capacities is not None:
        return [int(c) for c in capacities]
    out = []
    for i in range(n):
        rows = (
            int(table_rows_per_table[i])
            if table_rows_per_table is not None
            else table_rows(config.sparse_files[i])
        )
        out.append(max(1, math.ceil(config.gpucacheper * rows)))
    return out
