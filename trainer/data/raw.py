"""The Raw format: one headerless file of fixed-size, one-hot records.

Each record is ``label[label_dim]``, ``dense[dense_dim]``, ``key[slot_num]``, all 4-byte
little-endian.  Keys are int32 (read as uint32), one per slot, local to their slot (the reader
adds ``slot_size_array`` offsets).  Label and dense are int32 unless ``float_label_dense``, in
which case they are float32; int32 dense values are read as ``log(x + 1)`` (HugeCTR's Criteo
preprocessing), so they must not be negative.  ``float_label_dense`` defaults to False, as in
HugeCTR's binding and its data generator.

The file does not say which it holds, so the reader refuses values that cannot be what the
setting says: with ``float_label_dense=True`` a nonzero label or dense value below float32's
smallest normal number (1.18e-38) is the bit pattern of a small int32 (int32 1 reads as
1.4e-45); with ``float_label_dense=False`` a label whose bits are those of a float32 of
magnitude 1e-6 .. 1e6 (float32 1.0 reads as 1065353216) is refused.  Either error names the
setting to change.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from tierserve.core.errors import InvalidInputError

from .errors import DataFileError
from .records import Records


def raw_record_dtype(
    label_dim: int, dense_dim: int, slot_num: int, float_label_dense: bool
) -> np.dtype:
    """The structured dtype of one Raw record."""
    value = "<f4" if float_label_dense else "<i4"
    return np.dtype(
        [
            ("label", value, (label_dim,)),
            ("dense", value, (dense_dim,)),
            ("keys", "<u4", (slot_num,)),
        ]
    )


def raw_dense(values: np.ndarray, float_label_dense: bool) -> np.ndarray:
    """Dense features as the model sees them: float32, ``log(x + 1)`` of int32 values."""
    if float_label_dense:
        return np.ascontiguousarray(values, dtype=np.float32)
    return np.log1p(values.astype(np.float32))


def encode_raw_records(
    label: np.ndarray, dense: np.ndarray, keys: np.ndarray, float_label_dense: bool
) -> np.ndarray:
    """Raw records from ``label [n, L]``, ``dense [n, D]`` (int counts unless float) and
    ``keys [n, S]`` (slot-local)."""
    n = label.shape[0]
    keys = np.asarray(keys).reshape(n, -1)
    if keys.size and (keys.min() < 0 or keys.max() >= 2**31):
        raise InvalidInputError("Raw keys must lie in [0, 2**31)")
    if not float_label_dense and dense.size and (np.asarray(dense) < 0).any():
        raise InvalidInputError("Raw int32 dense values must not be negative (read as log(x+1))")
    out = np.empty(
        n, dtype=raw_record_dtype(label.shape[1], dense.shape[1], keys.shape[1], float_label_dense)
    )
    out["label"] = label.reshape(n, -1)
    out["dense"] = dense.reshape(n, -1)
    out["keys"] = keys
    return out


def write_raw_file(
    path: str | os.PathLike,
    label: np.ndarray,
    dense: np.ndarray,
    keys: np.ndarray,
    float_label_dense: bool = False,
    append: bool = False,
) -> Path:
    """Write (or append) Raw records; see :func:`encode_raw_records`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "ab" if append else "wb") as f:
        encode_raw_records(label, dense, keys, float_label_dense).tofile(f)
    return path


def raw_num_records(
    path: str | os.PathLike, label_dim: int, dense_dim: int, slot_num: int, num_samples: int = 0
) -> int:
    """Records to read from ``path``: ``num_samples``, or all when 0 (checked against the size)."""
    path = str(path)
    size_per = 4 * (label_dim + dense_dim + slot_num)
    try:
        size = os.path.getsize(path)
    except FileNotFoundError:
        raise DataFileError(path, "data file does not exist") from None
    whole, rest = divmod(size, size_per)
    if num_samples:
        if whole < num_samples:
            raise DataFileError(
                path,
                f"truncated: num_samples is {num_samples} but the file holds {whole} whole "
                f"records of {size_per} bytes ({size} bytes)",
                record=whole,
            )
        return num_samples
    if rest:
        raise DataFileError(
            path,
            f"truncated: the last record has {rest} of {size_per} bytes",
            record=whole,
        )
    return whole


_TINY = np.finfo(np.float32).tiny


def _check_value_kind(path: str, data: np.ndarray, float_label_dense: bool, start: int) -> None:
    """Refuse labels (and, as floats, dense values) that are the other type's bit pattern."""
    names = ("label", "dense") if float_label_dense else ("label",)
    for name in names:
        values = np.ascontiguousarray(data[name].reshape(len(data), -1))
        if float_label_dense:  # a small int32 read as float32 is a denormal
            bad = (values != 0) & (np.abs(values) < _TINY)
        else:  # a float32 read as int32: its bits are a float of a plausible magnitude
            as_float = np.abs(values.view("<f4"))
            bad = (as_float >= 1e-6) & (as_float <= 1e6)
        if not bad.any():
            continue
        r, d = np.argwhere(bad)[0]
        if float_label_dense:
            problem = (f"{name} {values[r, d]:.9g} is not a normal float32: it is the bit "
                       f"pattern of int32 {values[r:r + 1, d].view('<i4')[0]}; the file holds "
                       "int32 label and dense values: set float_label_dense=False")
        else:
            problem = (f"{name} {values[r, d]} read as int32 is the bit pattern of float32 "
                       f"{values[r:r + 1, d].view('<f4')[0]:.9g}; the file holds float32 label "
                       "and dense values: set float_label_dense=True")
        raise DataFileError(path, problem, record=start + int(r), field=f"{name}[{d}]")


def read_raw_records(
    path: str,
    start: int,
    stop: int,
    label_dim: int,
    dense_dim: int,
    slot_num: int,
    float_label_dense: bool,
) -> Records:
    """Records ``start:stop`` of a Raw file, decoded."""
    dt = raw_record_dtype(label_dim, dense_dim, slot_num, float_label_dense)
    n = stop - start
    with open(path, "rb") as f:
        f.seek(start * dt.itemsize)
        data = np.fromfile(f, dtype=dt, count=n)
    if len(data) < n:
        raise DataFileError(
            path, "truncated: the file ends inside this record", record=start + len(data)
        )
    _check_value_kind(path, data, float_label_dense, start)
    dense = data["dense"].reshape(n, dense_dim)
    if not float_label_dense and dense.size:
        negative = dense < 0
        if negative.any():
            r, d = np.argwhere(negative)[0]
            raise DataFileError(
                path,
                f"int32 dense value {dense[r, d]} is negative; log(x + 1) needs x >= 0 (if the "
                "file holds float32 values, set float_label_dense=True)",
                record=start + int(r),
                field=f"dense[{d}]",
            )
    offsets = np.arange(n * slot_num + 1, dtype=np.int64)
    return Records(
        np.ascontiguousarray(data["label"].reshape(n, label_dim), dtype=np.float32),
        raw_dense(dense, float_label_dense),
        data["keys"].astype(np.int64).ravel(),
        offsets,
        slot_num,
    )


def iter_raw_file(
    path: str,
    label_dim: int,
    dense_dim: int,
    slot_num: int,
    float_label_dense: bool,
    num_samples: int = 0,
    chunk_records: int = 16384,
) -> Iterator[tuple[int, Records]]:
    """Decode a Raw file in runs: yields (first record index, records)."""
    total = raw_num_records(path, label_dim, dense_dim, slot_num, num_samples)
    for start in range(0, total, chunk_records):
        stop = min(total, start + chunk_records)
        yield (
            start,
            read_raw_records(path, start, stop, label_dim, dense_dim, slot_num, float_label_dense),
        )
