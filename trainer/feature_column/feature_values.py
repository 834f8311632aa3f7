"""A batch's raw feature values as a column reads them, and categorical ids as CSR
(:class:`Ids`): ragged lists, 1-D and 2-D arrays, pandas' object arrays; missing values
(``''``, ``None``, NaN, ``-1``) dropped as TensorFlow drops them; ``fingerprint`` is
TensorFlow's ``Fingerprint64`` (:mod:`.hashing`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from tierserve.core.errors import InvalidInputError

from .hashing import fingerprint64


def fingerprint(values: np.ndarray) -> np.ndarray:
    """TensorFlow's ``Fingerprint64`` of each value (uint64): FarmHash of a string's UTF-8
    bytes, of an integer's decimal string (see :mod:`.hashing`)."""
    return fingerprint64(values)


@dataclass
class Ids:
    """Categorical ids of a batch as CSR: row ``i`` owns ``values[offsets[i]:offsets[i+1]]``;
    ``offsets`` None: exactly one id per row.  ``weights`` per id (weighted columns)."""

    values: np.ndarray  # int64
    offsets: np.ndarray | None
    batch_size: int
    weights: np.ndarray | None = None

    def csr(self) -> tuple[np.ndarray, np.ndarray]:
        if self.offsets is None:
            return self.values, np.arange(self.batch_size + 1, dtype=np.int64)
        return self.values, self.offsets

    def counts(self) -> np.ndarray:
        if self.offsets is None:
            return np.ones(self.batch_size, np.int64)
        return np.diff(self.offsets)

    def row_of_value(self) -> np.ndarray:
        if self.offsets is None:
            return np.arange(self.batch_size, dtype=np.int64)
        return np.repeat(np.arange(self.batch_size, dtype=np.int64), self.counts())


def _missing_mask(flat: np.ndarray) -> np.ndarray:
    if flat.dtype.kind in "US":
        return flat == flat.dtype.type("")
    if flat.dtype.kind == "f":
        return np.isnan(flat)
    if flat.dtype.kind in "iu":
        return flat == -1
    if flat.dtype.kind == "O":  # mixed values: None, "" and NaN (NaN != NaN) are missing
        return (flat == None) | (flat == "") | (flat != flat)  # noqa: E711
    return np.zeros(flat.shape, bool)


def _typed(arr: np.ndarray) -> np.ndarray:
    """An object array (pandas' strings, lists' values) as a typed array: strings, integers
    or floats; None becomes the missing value of the type ('' or NaN)."""
    missing = arr == None  # noqa: E711
    if missing.any():
        filled = arr.copy()
        rest = arr[~missing]
        filled[missing] = "" if any(isinstance(v, str) for v in rest[:1]) else np.nan
        arr = filled
    try:
        typed = np.asarray(arr.tolist())
    except ValueError:
        return arr
    return typed if typed.dtype != object else arr


def raw_values(column_name: str, key: str, value: Any, drop_missing: bool = True
               ) -> tuple[np.ndarray, np.ndarray | None, int]:
    """``(values, offsets or None, batch_size)`` of a raw categorical feature: a 1-D array (one
    value per row), a 2-D array (values per row) or a list of lists (ragged); missing values
    are dropped unless ``drop_missing`` is False (a crossed column's raw keys: TensorFlow
    crosses every value of a dense feature, ``''`` and ``-1`` included)."""
    arr = value if isinstance(value, np.ndarray) else None
    if arr is None:
        try:
            arr = np.asarray(value)
        except ValueError:
            arr = None
        if arr is None or (arr.dtype == object and arr.ndim == 1 and len(arr)
                           and isinstance(arr[0], (list, tuple, np.ndarray))):
            rows = list(value)
            counts = np.fromiter((len(r) for r in rows), np.int64, len(rows))
            flat = np.asarray([v for r in rows for v in r])  # ragged lists: one pass
            if flat.dtype == object:
                flat = _typed(flat)
            offsets = np.concatenate([[0], np.cumsum(counts)])
            if not drop_missing:
                return flat, offsets, len(rows)
            return _drop_missing(flat, offsets, len(rows))
    if arr.ndim == 0:
        arr = arr.reshape(1)
    if arr.ndim > 2:
        raise InvalidInputError(f"feature column {column_name!r}: feature {key!r} has shape "
                                f"{list(arr.shape)}; expected [batch] or [batch, values]")
    if arr.dtype == object:
        arr = _typed(arr)
    if arr.ndim == 2 and arr.shape[1] == 1:
        arr = arr[:, 0]
    if not drop_missing:
        if arr.ndim == 1:
            return arr, None, len(arr)
        return arr.reshape(-1), np.arange(0, arr.size + 1, arr.shape[1], dtype=np.int64), len(arr)
    if arr.ndim == 1:
        missing = _missing_mask(arr)
        if not missing.any():
            return arr, None, len(arr)
        counts = (~missing).astype(np.int64)
        return arr[~missing], np.concatenate([[0], np.cumsum(counts)]), len(arr)
    b, k = arr.shape
    offsets = np.arange(0, b * k + 1, k, dtype=np.int64)
    return _drop_missing(arr.reshape(-1), offsets, b)


def _drop_missing(flat, offsets, batch_size):
    missing = _missing_mask(flat)
    if not missing.any():
        return flat, offsets, batch_size
    keep = (~missing).astype(np.int64)
    csum = np.concatenate([[0], np.cumsum(keep)])
    return flat[~missing], csum[offsets], batch_size


def _feature(features: dict, key: str, column_name: str) -> Any:
    if key not in features:
        raise InvalidInputError(
            f"feature column {column_name!r} needs feature {key!r}, which the input_fn does "
            f"not provide (it gives: {', '.join(sorted(map(str, features))) or 'nothing'})")
    return features[key]
