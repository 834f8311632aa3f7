"""Convert the Criteo Kaggle click log (CSV or TSV) into Norm or Parquet datasets.

Input rows are ``label, I1..I13, C1..C26`` (a header line is optional and detected; fields may
be empty; categorical values are hex hashes such as ``68fd1e64``).  Categorical values become
slot keys by per-slot hashing (``hash_buckets``) or by per-slot vocabularies built from the
training rows (values seen at least ``min_frequency`` times).  Either way key 0 of a slot is
"missing"; with vocabularies key 1 is "rare or unseen".  Dense values become ``log(1 + x)``
with negatives clipped to 0 (``dense_transform="log"``) or stay as they are (``"none"``);
missing ones are 0.  The first ``train_rows`` rows form the training split, the rest (up to
``eval_rows``) the evaluation split.

Output folder: Norm writes ``file_list.txt`` / ``file_list_test.txt`` with data in ``train/`` and
``val/`` (global keys: read with an empty ``slot_size_array``); Parquet writes ``train/`` and
``val/`` folders each with ``_file_list.txt`` and ``_metadata.json`` (slot-local keys: read with
``slot_size_array``).  ``slot_size_array.json`` beside them records the slot sizes, row counts
and sources.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from tierserve.core.errors import ConfigError

from .errors import DataFileError
from .filelist import write_file_list
from .norm import NormWriter
from .params import Check_t, DataReaderType_t
from .parquet import (
    ParquetMetadata,
    default_column_names,
    write_parquet_file,
    write_parquet_metadata,
)
from .planted import mix64
from .records import Records, fixed_records

DENSE_DIM = 13
SLOT_NUM = 26
NUM_FIELDS = 1 + DENSE_DIM + SLOT_NUM
MISSING_KEY = 0
RARE_KEY = 1
SLOT_SIZE_FILE = "slot_size_array.json"
_LINES_PER_CHUNK = 65536

_HEX = np.full(256, -1, dtype=np.int64)
for _i, _c in enumerate(b"0123456789abcdef"):
    _HEX[_c] = _i
for _i, _c in enumerate(b"ABCDEF"):
    _HEX[_c] = 10 + _i


@dataclass
class CriteoConversion:
    """What :func:`convert_criteo` wrote."""

    format: str
    train_source: str
    eval_source: str | None
    train_rows: int
    eval_rows: int
    slot_size_array: list[int]
    #: what to pass as ``DataReaderParams.slot_size_array`` ([] for Norm: keys are global)
    reader_slot_size_array: list[int]
    label_dim: int = 1
    dense_dim: int = DENSE_DIM
    slot_num: int = SLOT_NUM
    check_type: str = Check_t.Sum.value
    i64_input_key: bool = True
    slot_size_file: str = ""


@dataclass
class _Chunk:
    label: np.ndarray  # float32 [n]
    dense: np.ndarray  # float64 [n, 13], NaN where missing
    cats: np.ndarray  # int64 [n, 26], -1 where missing
    first_row: int


def _read_chunks(path: str, progress: bool, what: str) -> Iterator[_Chunk]:
    """Parsed rows of the CSV/TSV at ``path`` in chunks (header and blank lines skipped)."""
    from ..progress import progress_bar

    size = os.path.getsize(path)
    row = 0
    with (
        open(path, encoding="utf-8", errors="strict") as f,
        progress_bar(
            total=size, unit="B", desc=what, disable=not progress, unit_scale=True, leave=False
        ) as bar,
    ):
        first = f.readline()
        bar.update(len(first.encode()))
        delim = "\t" if "\t" in first else ","
        head = first.rstrip("\r\n").split(delim)
        pending = [] if _is_header(head) else [first]
        while True:
            lines = pending + f.readlines(_LINES_PER_CHUNK * 200)
            pending = []
            if not lines:
                return
            bar.update(sum(len(ln) for ln in lines))
            rows = [ln.rstrip("\r\n").split(delim) for ln in lines if ln.strip()]
            if rows:
                yield _parse(path, rows, row)
                row += len(rows)


def _is_header(fields: list[str]) -> bool:
    try:
        float(fields[0])
        return False
    except ValueError:
        return True


def _parse(path: str, rows: list[list[str]], first_row: int) -> _Chunk:
    bad = [i for i, r in enumerate(rows) if len(r) != NUM_FIELDS]
    if bad:
        i = bad[0]
        raise DataFileError(
            path, f"{len(rows[i])} fields, expected {NUM_FIELDS}", record=first_row + i
        )
    table = np.array(rows, dtype=str)
    label = _numbers(path, table[:, 0], first_row, "label")
    if np.isnan(label).any():
        raise DataFileError(
            path,
            "missing label",
            record=first_row + int(np.argmax(np.isnan(label))),
            field="label",
        )
    dense = np.stack(
        [_numbers(path, table[:, 1 + j], first_row, f"I{j + 1}") for j in range(DENSE_DIM)], 1
    )
    cats = np.stack(
        [
            _hex_values(path, table[:, 1 + DENSE_DIM + s], first_row, f"C{s + 1}")
            for s in range(SLOT_NUM)
        ],
        1,
    )
    return _Chunk(label.astype(np.float32), dense, cats, first_row)


def _numbers(path: str, col: np.ndarray, first_row: int, name: str) -> np.ndarray:
    col = np.char.strip(col)
    empty = col == ""
    try:
        values = np.where(empty, "nan", col).astype(np.float64)
    except ValueError:
        for i, text in enumerate(col):
            try:
                float(text or "nan")
            except ValueError:
                raise DataFileError(
                    path, f"{text!r} is not a number", record=first_row + i, field=name
                ) from None
        raise
    return values


def _hex_values(path: str, col: np.ndarray, first_row: int, name: str) -> np.ndarray:
    """Hex strings as int64 (-1 where empty), vectorised over the column."""
    col = np.char.strip(col)
    lengths = np.char.str_len(col)
    width = int(lengths.max(initial=0))
    if width == 0:
        return np.full(len(col), -1, dtype=np.int64)
    if width > 15:
        i = int(np.argmax(lengths > 15))
        raise DataFileError(
            path, f"{col[i]!r} has more than 15 hex digits", record=first_row + i, field=name
        )
    raw = np.char.encode(col, "ascii").astype(f"S{width}")
    digits = _HEX[np.frombuffer(raw.tobytes(), dtype=np.uint8).reshape(len(col), width)]
    inside = np.arange(width) < lengths[:, None]
    bad = ((digits < 0) & inside).any(axis=1)
    if bad.any():
        i = int(np.argmax(bad))
        raise DataFileError(path, f"{col[i]!r} is not a hex hash", record=first_row + i, field=name)
    power = lengths[:, None] - 1 - np.arange(width)
    values = (np.where(inside, digits, 0) << (4 * np.maximum(power, 0))).sum(axis=1)
    return np.where(lengths == 0, -1, values)


class _Hasher:
    def __init__(self, buckets: int, seed: int = 0) -> None:
        if buckets < 2:
            raise ConfigError("hash_buckets must be at least 2 (key 0 is 'missing')")
        self.buckets = buckets
        self.salts = mix64(np.arange(SLOT_NUM, dtype=np.uint64) + np.uint64(seed) * 1000)

    def slot_sizes(self) -> list[int]:
        return [self.buckets] * SLOT_NUM

    def keys(self, cats: np.ndarray) -> np.ndarray:
        h = mix64(cats.astype(np.uint64) ^ self.salts)
        keys = 1 + (h % np.uint64(self.buckets - 1)).astype(np.int64)
        return np.where(cats < 0, MISSING_KEY, keys)


class _Vocabulary:
    def __init__(self, min_frequency: int) -> None:
        if min_frequency < 1:
            raise ConfigError("min_frequency must be at least 1")
        self.min_frequency = min_frequency
        self.values = [np.zeros(0, dtype=np.int64) for _ in range(SLOT_NUM)]
        self.counts = [np.zeros(0, dtype=np.int64) for _ in range(SLOT_NUM)]
        self._pending: list[list[tuple[np.ndarray, np.ndarray]]] = [[] for _ in range(SLOT_NUM)]

    def add(self, cats: np.ndarray) -> None:
        for s in range(SLOT_NUM):
            col = cats[:, s]
            pending = self._pending[s]
            pending.append(np.unique(col[col >= 0], return_counts=True))
            # merge geometrically: each value is re-sorted O(log n) times, not once per chunk
            if sum(len(v) for v, _ in pending) > max(len(self.values[s]), 1 << 20):
                self._merge(s)

    def _merge(self, s: int) -> None:
        parts = [(self.values[s], self.counts[s])] + self._pending[s]
        values, inverse = np.unique(np.concatenate([v for v, _ in parts]), return_inverse=True)
        counts = np.bincount(inverse, weights=np.concatenate([c for _, c in parts]))
        self.values[s], self.counts[s] = values, counts.astype(np.int64)
        self._pending[s] = []

    def freeze(self) -> None:
        for s in range(SLOT_NUM):
            self._merge(s)
            self.values[s] = self.values[s][self.counts[s] >= self.min_frequency]

    def slot_sizes(self) -> list[int]:
        return [2 + len(v) for v in self.values]

    def keys(self, cats: np.ndarray) -> np.ndarray:
        out = np.empty(cats.shape, dtype=np.int64)
        for s in range(SLOT_NUM):
            vocab, col = self.values[s], cats[:, s]
            pos = np.searchsorted(vocab, col)
            found = pos < len(vocab)
            found[found] = vocab[pos[found]] == col[found]
            out[:, s] = np.where(col < 0, MISSING_KEY, np.where(found, 2 + pos, RARE_KEY))
        return out


class _SplitWriter:
    """Writes one split (train or val) as Norm or Parquet files of ``rows_per_file`` rows."""

    def __init__(self, kind, folder, list_path, rows_per_file, check_type, i64):
        self.kind, self.folder, self.list_path = kind, Path(folder), Path(list_path)
        self.rows_per_file, self.check_type, self.i64 = rows_per_file, check_type, i64
        self.files: list[str] = []
        self.stats: dict[str, int] = {}
        self.rows = 0
        self._current = None  # NormWriter or list of Records
        self._in_file = 0
        names = default_column_names(1, DENSE_DIM, SLOT_NUM)
        self.meta = ParquetMetadata({}, names[2], names[1], names[0])

    def write(self, records: Records) -> None:
        start = 0
        while start < len(records):
            if self._current is None:
                self._open()
            take = min(len(records) - start, self.rows_per_file - self._in_file)
            part = records.slice(start, start + take)
            if self.kind is DataReaderType_t.Norm:
                self._current.write(part)
            else:
                self._current.append(part)
            self._in_file += take
            self.rows += take
            start += take
            if self._in_file == self.rows_per_file:
                self._close_file()

    def _open(self) -> None:
        i = len(self.files)
        self.folder.mkdir(parents=True, exist_ok=True)
        if self.kind is DataReaderType_t.Norm:
            path = self.folder / f"part_{i}.data"
            self._current = NormWriter(path, 1, DENSE_DIM, SLOT_NUM, self.check_type, self.i64)
        else:
            path = self.folder / f"part_{i}.parquet"
            self._current = []
        self.files.append(str(path))
        self._in_file = 0

    def _close_file(self) -> None:
        if self.kind is DataReaderType_t.Norm:
            self._current.close()
        else:
            path = self.files[-1]
            write_parquet_file(path, Records.concat(self._current), self.meta, None, self.i64)
            self.stats[os.path.basename(path)] = self._in_file
        self._current = None

    def finish(self) -> str | None:
        if self._current is not None:
            self._close_file()
        if not self.files:
            return None
        if self.kind is DataReaderType_t.Parquet:
            write_parquet_metadata(
                self.folder,
                ParquetMetadata(self.stats, self.meta.cats, self.meta.conts, self.meta.labels),
            )
        write_file_list(self.list_path, self.files)
        return str(self.list_path)


def convert_criteo(
    input_path: str | os.PathLike,
    output_dir: str | os.PathLike,
    *,
    format: DataReaderType_t | str = DataReaderType_t.Norm,
    train_rows: int | None = None,
    eval_rows: int | None = None,
    hash_buckets: int | None = None,
    min_frequency: int = 1,
    dense_transform: str = "log",
    check_type: Check_t | str = Check_t.Sum,
    i64_input_key: bool = True,
    rows_per_file: int = 262144,
    progress: bool = False,
) -> CriteoConversion:
    """Convert a Criteo Kaggle CSV/TSV file into a Norm or Parquet train/eval dataset.

    ``train_rows``: the first that many rows are training data, the rest evaluation data
    (at most ``eval_rows``); ``None`` puts every row in the training split.  ``hash_buckets``
    selects hashing into that many keys per slot; otherwise vocabularies with
    ``min_frequency`` are built from the training rows.
    """
    kind = DataReaderType_t(format)
    _check_settings(kind, dense_transform, rows_per_file, train_rows)
    input_path, out = str(input_path), Path(output_dir)
    if not os.path.isfile(input_path):
        raise DataFileError(input_path, "input file does not exist")
    split_at = train_rows if train_rows is not None else float("inf")
    stop_at = split_at + eval_rows if eval_rows is not None else float("inf")
    mapper = _key_mapper(input_path, hash_buckets, min_frequency, split_at, progress)
    sizes = mapper.slot_sizes()
    norm = kind is DataReaderType_t.Norm
    if norm and not i64_input_key and sum(sizes) > 2**32:
        raise ConfigError("the slots hold more than 2**32 keys: use i64_input_key=True")
    writers = _SplitWriters(kind, out, rows_per_file, Check_t(check_type), i64_input_key)
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]) if norm else np.zeros(SLOT_NUM)
    for chunk in _read_chunks(input_path, progress, "convert"):
        records = _chunk_records(chunk, mapper, offsets, dense_transform)
        writers.write(records, chunk.first_row, split_at, stop_at)
        if chunk.first_row + len(chunk.label) >= stop_at:
            break
    train_source, eval_source = writers.train.finish(), writers.eval.finish()
    if train_source is None:
        raise DataFileError(input_path, "no training rows (train_rows is 0 or the file is empty)")
    result = CriteoConversion(
        kind.value,
        train_source,
        eval_source,
        writers.train.rows,
        writers.eval.rows,
        sizes,
        [] if norm else sizes,
        check_type=Check_t(check_type).value,
        i64_input_key=i64_input_key,
        slot_size_file=str(out / SLOT_SIZE_FILE),
    )
    info = asdict(result)
    info.update(
        mapping=f"hash {hash_buckets}"
        if hash_buckets
        else f"vocabulary (min_frequency {min_frequency})",
        dense_transform=dense_transform,
        input=os.path.abspath(input_path),
    )
    (out / SLOT_SIZE_FILE).write_text(json.dumps(info, indent=1) + "\n")
    return result


def _check_settings(kind: DataReaderType_t, dense_transform: str, rows_per_file: int,
                    train_rows: int | None) -> None:
    if kind not in (DataReaderType_t.Norm, DataReaderType_t.Parquet):
        raise ConfigError(f"convert writes Norm or Parquet, not {kind.value}")
    if dense_transform not in ("log", "none"):
        raise ConfigError(f"dense_transform must be 'log' or 'none', got {dense_transform!r}")
    if rows_per_file < 1 or (train_rows is not None and train_rows < 0):
        raise ConfigError("rows_per_file must be >= 1 and train_rows >= 0")


def _key_mapper(input_path: str, hash_buckets: int | None, min_frequency: int,
                split_at: float, progress: bool) -> _Hasher | _Vocabulary:
    """Hashing into ``hash_buckets`` keys per slot, else the vocabularies of the training
    rows (a first pass over them)."""
    if hash_buckets is not None:
        return _Hasher(hash_buckets)
    mapper = _Vocabulary(min_frequency)
    for chunk in _read_chunks(input_path, progress, "vocabulary"):
        rows = int(max(0, min(len(chunk.label), split_at - chunk.first_row)))
        mapper.add(chunk.cats[:rows])
        if chunk.first_row + len(chunk.label) >= split_at:
            break
    mapper.freeze()
    return mapper


def _chunk_records(chunk: _Chunk, mapper: _Hasher | _Vocabulary, offsets: np.ndarray,
                   dense_transform: str) -> Records:
    """A chunk's rows as records: dense NaN as 0 (then ``log1p`` of the non-negative part
    with ``dense_transform="log"``), each slot's key plus its offset."""
    dense = np.nan_to_num(chunk.dense, nan=0.0)
    if dense_transform == "log":
        dense = np.log1p(np.maximum(dense, 0.0))
    keys = mapper.keys(chunk.cats) + offsets.astype(np.int64)
    return fixed_records(chunk.label[:, None], dense, keys, [1] * SLOT_NUM)


class _SplitWriters:
    """The training and evaluation splits' writers, with their file lists where HugeCTR's
    readers look for them."""

    def __init__(self, kind: DataReaderType_t, out: Path, rows_per_file: int,
                 check_type: Check_t, i64_input_key: bool) -> None:
        if kind is DataReaderType_t.Norm:
            train_list, eval_list = out / "file_list.txt", out / "file_list_test.txt"
        else:
            train_list, eval_list = out / "train" / "_file_list.txt", out / "val" / "_file_list.txt"
        self.train, self.eval = (
            _SplitWriter(kind, out / name, lst, rows_per_file, check_type, i64_input_key)
            for name, lst in (("train", train_list), ("val", eval_list))
        )

    def write(self, records: Records, first_row: int, split_at: float, stop_at: float
              ) -> None:
        """Rows before ``split_at`` to training, from there up to ``stop_at`` to evaluation."""
        n = len(records)
        cut = int(np.clip(split_at - first_row, 0, n))
        end = int(np.clip(stop_at - first_row, 0, n))
        self.train.write(records.slice(0, cut))
        self.eval.write(records.slice(cut, end))


def load_conversion(output_dir: str | os.PathLike) -> CriteoConversion:
    """The :class:`CriteoConversion` recorded in ``output_dir/slot_size_array.json``."""
    path = Path(output_dir) / SLOT_SIZE_FILE
    data = json.loads(path.read_text())
    fields = CriteoConversion.__dataclass_fields__
    return CriteoConversion(**{k: v for k, v in data.items() if k in fields})
