"""The Parquet format (NVTabular style), read and written with pyarrow (extra ``parquet``).

A dataset folder holds the data files, ``_file_list.txt`` (a HugeCTR file list) and
``_metadata.json``::

    {"file_stats": [{"file_name": "gen_0.parquet", "num_rows": 40960}, ...],
     "cats":   [{"col_name": "C1", "index": 14}, ...],
     "conts":  [{"col_name": "I1", "index": 1}, ...],
     "labels": [{"col_name": "label", "index": 0}]}

Columns are found by ``col_name`` (``index`` is written for HugeCTR and not relied on).
Label and dense columns are numeric (read as float32); categorical columns are integers, one
key per row, or lists of integers for multi-hot slots.  No value may be missing.  Keys are
local to their slot; the reader adds ``slot_size_array`` offsets.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tierserve.ps.errors import require_extra

from .errors import DataFileError
from .records import Records

METADATA_NAME = "_metadata.json"
FILE_LIST_NAME = "_file_list.txt"


def _pa():
    return require_extra("pyarrow", "parquet", "the Parquet data format")


def _pq():
    _pa()
    return require_extra("pyarrow.parquet", "parquet", "the Parquet data format")


@dataclass(frozen=True)
class ParquetMetadata:
    """The contents of ``_metadata.json``: row counts per file and the column roles."""

    file_stats: dict[str, int]
    cats: list[str]
    conts: list[str]
    labels: list[str]

    @property
    def columns(self) -> list[str]:
        return self.labels + self.conts + self.cats

    def to_json(self) -> dict:
        index = {name: i for i, name in enumerate(self.columns)}
        return {
            "file_stats": [{"file_name": f, "num_rows": n} for f, n in self.file_stats.items()],
            "cats": [{"col_name": c, "index": index[c]} for c in self.cats],
            "conts": [{"col_name": c, "index": index[c]} for c in self.conts],
            "labels": [{"col_name": c, "index": index[c]} for c in self.labels],
        }


def load_parquet_metadata(file_list: str | os.PathLike) -> ParquetMetadata:
    """``_metadata.json`` from the folder of ``file_list``."""
    path = Path(file_list).parent / METADATA_NAME
    try:
        data = json.loads(path.read_text())
        stats = {str(e["file_name"]): int(e["num_rows"]) for e in data.get("file_stats", [])}
        roles = {k: [str(e["col_name"]) for e in data[k]] for k in ("cats", "conts", "labels")}
    except FileNotFoundError:
        raise DataFileError(
            str(path), "missing (Parquet datasets need it beside the file list)"
        ) from None
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise DataFileError(
            str(path), f"not a valid _metadata.json (file_stats, cats, conts, labels): {exc}"
        ) from None
    return ParquetMetadata(stats, roles["cats"], roles["conts"], roles["labels"])


def write_parquet_metadata(folder: str | os.PathLike, metadata: ParquetMetadata) -> Path:
    """Write ``_metadata.json`` into ``folder``."""
    path = Path(folder) / METADATA_NAME
    path.write_text(json.dumps(metadata.to_json(), indent=1) + "\n")
    return path


def default_column_names(label_dim: int, dense_dim: int, slot_num: int):
    """``label`` (or ``label0..``), ``I1..``, ``C1..``: the names the generator and converter use."""
    labels = ["label"] if label_dim == 1 else [f"label{i}" for i in range(label_dim)]
    return labels, [f"I{i + 1}" for i in range(dense_dim)], [f"C{i + 1}" for i in range(slot_num)]


def write_parquet_file(
    path: str | os.PathLike,
    records: Records,
    metadata: ParquetMetadata,
    list_slots: Sequence[bool] | None = None,
    i64_input_key: bool = True,
) -> Path:
    """Write ``records`` as one Parquet file with the column names of ``metadata``.

    ``list_slots[s]`` makes slot ``s`` a list column (multi-hot); otherwise every sample must
    hold exactly one key there.
    """
    pa, pq = _pa(), _pq()
    n, s = len(records), records.slot_num
    list_slots = list(list_slots) if list_slots is not None else [False] * s
    columns = {}
    for j, name in enumerate(metadata.labels):
        columns[name] = pa.array(records.label[:, j], type=pa.float32())
    for j, name in enumerate(metadata.conts):
        columns[name] = pa.array(records.dense[:, j], type=pa.float32())
    key_type = pa.int64() if i64_input_key else pa.int32()
    kdt = np.int64 if i64_input_key else np.int32
    for slot, name in enumerate(metadata.cats):
        keys, offsets = records.select_slots(slot, slot + 1)
        if list_slots[slot]:
            columns[name] = pa.ListArray.from_arrays(
                pa.array(offsets.astype(np.int32)), pa.array(keys.astype(kdt), type=key_type)
            )
        else:
            if len(keys) != n:
                raise DataFileError(
                    str(path), "a one-hot column needs one key per sample", slot=slot
                )
            columns[name] = pa.array(keys.astype(kdt), type=key_type)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(columns), path)
    return path


def iter_parquet_file(
    path: str,
    metadata: ParquetMetadata,
    chunk_records: int = 16384,
) -> Iterator[tuple[int, Records]]:
    """Decode a Parquet file in runs: yields (first record index, records)."""
    pa, pq = _pa(), _pq()
    try:
        pf = pq.ParquetFile(path)
    except FileNotFoundError:
        raise DataFileError(path, "data file does not exist") from None
    except (pa.ArrowInvalid, OSError) as exc:
        raise DataFileError(path, f"not a readable Parquet file: {exc}") from None
    names = set(pf.schema_arrow.names)
    for col in metadata.columns:
        if col not in names:
            raise DataFileError(path, "column listed in _metadata.json is missing", field=col)
    rows = pf.metadata.num_rows
    expected = metadata.file_stats.get(os.path.basename(path))
    if expected is not None and expected != rows:
        raise DataFileError(
            path,
            f"holds {rows} rows but _metadata.json file_stats says {expected}",
            field="num_rows",
        )
    first = 0
    try:
        batches = pf.iter_batches(batch_size=chunk_records, columns=metadata.columns)
        for batch in batches:
            yield first, _decode_batch(path, batch, metadata, first)
            first += batch.num_rows
    except (pa.ArrowInvalid, OSError) as exc:
        raise DataFileError(path, f"cannot decode: {exc}", record=first) from None


def parquet_num_rows(path: str) -> int:
    """The rows a Parquet file holds, from its footer (nothing decoded)."""
    pa, pq = _pa(), _pq()
    try:
        return int(pq.ParquetFile(path).metadata.num_rows)
    except FileNotFoundError:
        raise DataFileError(path, "data file does not exist") from None
    except (pa.ArrowInvalid, OSError) as exc:
        raise DataFileError(path, f"not a readable Parquet file: {exc}") from None


def _decode_batch(path: str, batch, metadata: ParquetMetadata, first: int) -> Records:
    pa = _pa()
    n, s = batch.num_rows, len(metadata.cats)

    def column(name: str):
        col = batch.column(name)
        if col.null_count:
            r = int(np.flatnonzero(~np.asarray(col.is_valid()))[0])
            raise DataFileError(path, "missing value", record=first + r, field=name)
        return col

    def floats(names: list[str]) -> np.ndarray:
        out = np.empty((n, len(names)), dtype=np.float32)
        for j, name in enumerate(names):
            out[:, j] = column(name).to_numpy(zero_copy_only=False)
        return out

    label, dense = floats(metadata.labels), floats(metadata.conts)
    counts = np.ones((n, s), dtype=np.int64)
    slot_keys = []
    for slot, name in enumerate(metadata.cats):
        col = column(name)
        if pa.types.is_list(col.type) or pa.types.is_large_list(col.type):
            offsets = np.asarray(col.offsets, dtype=np.int64)
            values = col.flatten()
            if values.null_count:
                raise DataFileError(path, "missing key inside a list", slot=slot, field=name)
            counts[:, slot] = np.diff(offsets)
            keys = values.to_numpy(zero_copy_only=False)
        elif pa.types.is_integer(col.type):
            keys = col.to_numpy(zero_copy_only=False)
        else:
            raise DataFileError(
                path,
                f"categorical column has type {col.type}, not integer or list of integer",
                field=name,
            )
        slot_keys.append(keys.astype(np.int64, copy=False))
    row_offsets = np.zeros(n * s + 1, dtype=np.int64)
    np.cumsum(counts.ravel(), out=row_offsets[1:])
    keys = np.empty(int(row_offsets[-1]), dtype=np.int64)
    starts = row_offsets[:-1].reshape(n, s) if s else np.zeros((n, 0), dtype=np.int64)
    for slot, values in enumerate(slot_keys):
        c = counts[:, slot]
        local = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(c, out=local[1:])
        dest = np.repeat(starts[:, slot] - local[:-1], c) + np.arange(local[-1], dtype=np.int64)
        keys[dest] = values
    return Records(label, dense, keys, row_offsets, s)
