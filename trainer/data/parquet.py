"""The Parquet format (NVTabular style), read and written with pyarrow (extra ``parquet``).

A dataset is a HugeCTR file list naming the data files, and ``_metadata.json`` in the folder
of the data files (HugeCTR's reader looks for it beside the first data file of the list)::

    {"file_stats": [{"file_name": "gen_0.parquet", "num_rows": 40960}, ...],
     "labels": [{"col_name": "label", "index": 0}],
     "conts":  [{"col_name": "I1", "index": 1}, ...],
     "cats":   [{"col_name": "C1", "index": 14}, ...]}

``file_stats`` entries are matched by the file's base name (a ``file_name`` with folders, as
HugeCTR's generator writes it, matches too).  Columns are read by ``index``, their position in
the file, as HugeCTR reads them, each role in ascending ``index`` order; ``col_name`` is a
label (HugeCTR's own generator writes unnamed columns, which cudf names ``_col0``, ``_col1``,
...).  An entry without ``index`` is found by ``col_name``.  Label and dense columns are
numeric (read as float32); categorical columns are integers, one key per row, or lists of
integers for multi-hot slots.  No value may be missing.  Keys are local to their slot; the
reader adds ``slot_size_array`` offsets.

``_metadata.json`` beside the file list only (where tierserve once looked) is still used, with
a warning, when the data files' folder has none: HugeCTR would not find it.
"""

from __future__ import annotations

import json
import os
import threading
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tierserve.core.errors import require_extra

from .errors import DataFileError
from .records import Records

METADATA_NAME = "_metadata.json"
FILE_LIST_NAME = "_file_list.txt"
ROLES = ("labels", "conts", "cats")

_warned: set[str] = set()
_warn_lock = threading.Lock()


def _warn_once(key: str, message: str) -> None:
    with _warn_lock:
        if key in _warned:
            return
        _warned.add(key)
    warnings.warn(message, UserWarning, stacklevel=3)


def _pa():
    return require_extra("pyarrow", "parquet", "the Parquet data format")


def _pq():
    _pa()
    return require_extra("pyarrow.parquet", "parquet", "the Parquet data format")


@dataclass(frozen=True)
class ParquetMetadata:
    """The contents of ``_metadata.json``: row counts per file and the column roles.

    ``index`` maps a ``col_name`` to its column position in the files (from the JSON); names
    it lacks are found by name.  Metadata built in code (the writers) has none: the writers
    put the columns in ``labels + conts + cats`` order, which :meth:`to_json` records.
    """

    file_stats: dict[str, int]
    cats: list[str]
    conts: list[str]
    labels: list[str]
    index: dict[str, int] = field(default_factory=dict)
    source: str = field(default="", compare=False)  # the JSON file it came from

    @property
    def columns(self) -> list[str]:
        return self.labels + self.conts + self.cats

    def rows(self, data_file: str) -> int | None:
        """``num_rows`` of ``data_file`` (by base name), or None when not listed."""
        return self.file_stats.get(os.path.basename(data_file))

    def to_json(self) -> dict:
        index = {name: i for i, name in enumerate(self.columns)}
        index.update(self.index)
        return {
            "file_stats": [{"file_name": f, "num_rows": n} for f, n in self.file_stats.items()],
            "labels": [{"col_name": c, "index": index[c]} for c in self.labels],
            "conts": [{"col_name": c, "index": index[c]} for c in self.conts],
            "cats": [{"col_name": c, "index": index[c]} for c in self.cats],
        }


def metadata_path(data_file: str | os.PathLike) -> Path:
    """Where HugeCTR looks for a data file's ``_metadata.json``: the data file's folder."""
    return Path(data_file).parent / METADATA_NAME


def find_parquet_metadata(
    data_file: str | os.PathLike, file_list: str | os.PathLike | None = None
) -> ParquetMetadata:
    """The ``_metadata.json`` of ``data_file``: in its folder, else (with a warning) beside
    ``file_list``."""
    path = metadata_path(data_file)
    if not path.is_file() and file_list is not None:
        beside = Path(file_list).parent / METADATA_NAME
        if beside.is_file():
            _warn_once(
                str(beside),
                f"{beside}: used for {data_file}, whose folder has no {METADATA_NAME}; HugeCTR "
                f"reads it from the data files' folder only: move it to {path.parent}",
            )
            path = beside
    return load_parquet_metadata(path)


def load_parquet_metadata(path: str | os.PathLike) -> ParquetMetadata:
    """A ``_metadata.json`` file (or the one in folder ``path``)."""
    path = Path(path)
    if path.is_dir():
        path = path / METADATA_NAME
    try:
        data = json.loads(path.read_text())
        stats = {
            os.path.basename(str(e["file_name"])): int(e["num_rows"])
            for e in data.get("file_stats", [])
        }
        roles, index = {}, {}
        for role in ROLES:
            entries = [(str(e["col_name"]), e.get("index")) for e in data[role]]
            # HugeCTR takes each role's columns in ascending index order
            entries.sort(key=lambda e: (e[1] is None, e[1] if e[1] is not None else 0))
            roles[role] = [name for name, _ in entries]
            index.update({name: int(i) for name, i in entries if i is not None})
    except FileNotFoundError:
        raise DataFileError(
            str(path),
            "missing (HugeCTR reads _metadata.json from the folder of the data files)",
        ) from None
    except (json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as exc:
        raise DataFileError(
            str(path), f"not a valid _metadata.json (file_stats, cats, conts, labels): {exc}"
        ) from None
    return ParquetMetadata(
        stats, roles["cats"], roles["conts"], roles["labels"], index, source=str(path)
    )


def write_parquet_metadata(folder: str | os.PathLike, metadata: ParquetMetadata) -> Path:
    """Write ``_metadata.json`` into ``folder`` (the data files' folder)."""
    path = Path(folder) / METADATA_NAME
    path.write_text(json.dumps(metadata.to_json(), indent=1) + "\n")
    return path


def _resolve_columns(path: str, file_names: list[str], metadata: ParquetMetadata) -> list[str]:
    """The file's column for each metadata column (labels, conts, cats), by index."""
    out = []
    for name in metadata.columns:
        i = metadata.index.get(name)
        if i is None:
            if name not in file_names:
                raise DataFileError(path, "column listed in _metadata.json is missing", field=name)
            out.append(name)
            continue
        if not 0 <= i < len(file_names):
            raise DataFileError(
                path,
                f"_metadata.json gives index {i}, but the file has {len(file_names)} columns",
                field=name,
            )
        if file_names[i] != name and name in file_names:
            _warn_once(  # once per _metadata.json
                f"{metadata.source}:index",
                f"{metadata.source or METADATA_NAME}: column {name!r} has index {i} but is "
                f"column {file_names.index(name)} of {path}; read by index ({file_names[i]!r}), "
                "as HugeCTR reads it",
            )
        out.append(file_names[i])
    return out


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
    # HugeCTR's generator: int64 keys, or unsigned int (uint32) without i64_input_key
    key_type = pa.int64() if i64_input_key else pa.uint32()
    kdt = np.int64 if i64_input_key else np.uint32
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
    columns = _resolve_columns(path, list(pf.schema_arrow.names), metadata)
    rows = pf.metadata.num_rows
    expected = metadata.rows(path)
    if expected is not None and expected != rows:
        raise DataFileError(
            path,
            f"holds {rows} rows but _metadata.json file_stats says {expected}",
            field="num_rows",
        )
    nl, nc = len(metadata.labels), len(metadata.conts)
    roles = (columns[:nl], columns[nl : nl + nc], columns[nl + nc :])
    first = 0
    try:
        batches = pf.iter_batches(batch_size=chunk_records, columns=list(dict.fromkeys(columns)))
        for batch in batches:
            yield first, _decode_batch(path, batch, roles, first)
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


def _decode_batch(path: str, batch, roles, first: int) -> Records:
    """``roles``: the file's column names of the labels, the dense values and the slots."""
    pa = _pa()
    labels, conts, cats = roles
    n, s = batch.num_rows, len(cats)

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

    label, dense = floats(labels), floats(conts)
    counts = np.ones((n, s), dtype=np.int64)
    slot_keys = []
    for slot, name in enumerate(cats):
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
