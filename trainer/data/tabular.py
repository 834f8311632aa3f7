"""Parquet files as a ``Dataset`` of named columns (HybridBackend's
``hb.data.Dataset.from_parquet``; pyarrow, the ``parquet`` extra).

Each element is one row: a dict from column name to its value (a scalar, or a 1-D array for
a list column); ``.batch(n)`` makes dicts of ``[n]`` arrays (list columns: ``[n]`` object
arrays of per-row arrays, which feature columns read as variable-length ids).  Row groups
are read one at a time (only the selected ``fields``), in order, so memory holds one row
group and what the pipeline's buffers hold.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from tierserve.core.errors import ConfigError, require_extra

from .dataset import AUTOTUNE, Dataset
from .errors import DataFileError


class Field:
    """A column to read (HybridBackend's ``hb.data.DataFrame.Field``): its ``name``, and
    optionally the ``dtype`` its values are converted to; ``ragged_rank`` 1 marks a list
    column (read as such whatever it says), ``shape`` a fixed-length list made dense."""

    def __init__(self, name: str, dtype: Any = None, ragged_rank: int | None = None,
                 shape: Sequence[int] | None = None) -> None:
        if ragged_rank not in (None, 0, 1):
            raise ConfigError(f"Field {name!r}: ragged_rank {ragged_rank} (nested lists) is not "
                              "supported; lists of scalars only")
        self.name, self.dtype, self.ragged_rank = str(name), dtype, ragged_rank
        self.shape = None if shape is None else tuple(int(d) for d in shape)

    def __repr__(self) -> str:
        return f"Field({self.name!r})"


def _files(filenames: Any) -> list[str]:
    if isinstance(filenames, (str, os.PathLike)):
        return [os.fspath(filenames)]
    if isinstance(filenames, Dataset):  # a dataset of file names (HybridBackend's example 2)
        return [str(np.asarray(f).item()) for f in filenames]
    files = [os.fspath(f) for f in filenames]
    if not files:
        raise ConfigError("from_parquet: no file names given")
    return files


def _numpy_dtype(dtype: Any) -> np.dtype | None:
    if dtype is None:
        return None
    dtype = getattr(dtype, "as_numpy_dtype", dtype)
    return np.dtype(str) if dtype in (str, "string") else np.dtype(dtype)


def _column(col: Any, path: str, field: Field, to_dense: Any, pa: Any) -> np.ndarray:
    """One row group's column as numpy (see the module docstring)."""
    arr = col.combine_chunks() if hasattr(col, "combine_chunks") else col
    if arr.null_count:
        first = int(np.flatnonzero(np.asarray(arr.is_null()))[0])
        raise DataFileError(path, "missing value (null); fill the column before training",
                            record=first, field=field.name)
    dtype = _numpy_dtype(field.dtype)
    if pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type) or \
            pa.types.is_fixed_size_list(arr.type):
        values = arr.flatten().to_numpy(zero_copy_only=False)
        if values.dtype == object:
            values = values.astype(str)
        if dtype is not None:
            values = values.astype(dtype)
        lengths = np.asarray(arr.value_lengths())
        shape = field.shape or (to_dense if isinstance(to_dense, (tuple, list)) else None)
        if shape is not None or to_dense is True:
            width = int(shape[0]) if shape is not None else (int(lengths[0]) if len(lengths) else 0)
            if shape is None and (lengths != width).any():
                raise DataFileError(path, f"to_dense: rows have {sorted(set(lengths.tolist()))[:5]} "
                                    "values; give to_dense a shape to pad or cut to",
                                    field=field.name)
            out = np.zeros((len(lengths), width), dtype=values.dtype)
            starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
            take = np.minimum(lengths, width)
            rows = np.repeat(np.arange(len(lengths)), take)
            cols = np.arange(take.sum()) - np.repeat(np.cumsum(take) - take, take)
            out[rows, cols] = values[np.repeat(starts, take) + cols]
            return out
        out = np.empty(len(lengths), dtype=object)
        out[:] = np.split(values, np.cumsum(lengths)[:-1]) if len(lengths) else []
        return out
    values = arr.to_numpy(zero_copy_only=False)
    if values.dtype == object:
        values = values.astype(str)
    return values.astype(dtype) if dtype is not None else values


def from_parquet(filenames: Any, fields: Sequence[Any] | None = None, partition_count: int = 1,
                 partition_index: int = 0, skip_corrupted_data: bool = False,
                 to_dense: Any = False, num_parallel_reads: int | None = None,
                 num_parallel_parser_calls: int | None = None, field_ignore_case: bool = False,
                 field_map_fn: Any = None) -> Dataset:
    """The rows of Parquet ``filenames`` (a path, a list of paths, or a Dataset of paths):
    ``fields`` (names or :class:`Field`; default every column); row group ``i`` (counted
    over the files) belongs to partition ``i % partition_count``, of which this reads
    ``partition_index``; ``to_dense`` makes list columns of one length 2-D (a shape: padded
    with zeros or cut to it); ``field_ignore_case`` matches field names to columns whatever
    their case.  Files are read one after another (``num_parallel_reads`` and
    ``num_parallel_parser_calls`` other than 1 / AUTOTUNE are refused); corrupt files raise
    (``skip_corrupted_data`` is refused), as does ``field_map_fn``."""
    pa = require_extra("pyarrow", "parquet", "Parquet datasets")
    pq = require_extra("pyarrow.parquet", "parquet", "Parquet datasets")
    for name, value in (("num_parallel_reads", num_parallel_reads),
                        ("num_parallel_parser_calls", num_parallel_parser_calls)):
        if value not in (None, 1, AUTOTUNE):
            raise ConfigError(f"from_parquet: {name}={value} is not supported: files are read "
                              "one after another (pyarrow decodes each row group's columns "
                              "in its own threads); use None or AUTOTUNE")
    if skip_corrupted_data:
        raise ConfigError("from_parquet: skip_corrupted_data=True is not supported; a corrupt "
                          "file raises naming it")
    if field_map_fn is not None:
        raise ConfigError("from_parquet: field_map_fn is not supported; map the batches with "
                          "Dataset.map")
    if not 0 <= int(partition_index) < int(partition_count):
        raise ConfigError(f"from_parquet: partition_index {partition_index} is outside "
                          f"[0, {partition_count})")
    files = _files(filenames)
    wanted = None if fields is None else [f if isinstance(f, Field) else Field(f)
                                          for f in fields]

    def select(path: str, names: list[str]) -> list[tuple[str, Field]]:
        if wanted is None:
            return [(n, Field(n)) for n in names]
        lookup = {(n.lower() if field_ignore_case else n): n for n in names}
        out = []
        for f in wanted:
            column = lookup.get(f.name.lower() if field_ignore_case else f.name)
            if column is None:
                raise DataFileError(path, f"no column {f.name!r} (columns: {', '.join(names)})")
            out.append((column, f))
        return out

    def batches() -> Iterator[dict[str, np.ndarray]]:
        group = 0
        for path in files:
            try:
                pf = pq.ParquetFile(path)
            except (OSError, pa.ArrowException) as exc:
                raise DataFileError(path, f"not a readable Parquet file ({exc})") from None
            chosen = select(path, pf.schema_arrow.names)
            for rg in range(pf.num_row_groups):
                mine = group % int(partition_count) == int(partition_index)
                group += 1
                if not mine:
                    continue
                table = pf.read_row_group(rg, columns=[c for c, _ in chosen])
                yield {f.name: _column(table.column(c), path, f, to_dense, pa)
                       for c, f in chosen}

    return Dataset.from_batches(batches)


__all__ = ["Field", "from_parquet"]
