"""``decode_csv`` (``tf.io.decode_csv``): CSV records to typed numpy columns, and its errors."""

from __future__ import annotations

import csv
from collections.abc import Sequence
from typing import Any

import numpy as np

from tierserve.core.errors import InvalidInputError

from .dataset_blocks import _as_array
from .errors import DataFileError

# -- CSV decoding --------------------------------------------------------------------------


class DecodeCSVError(InvalidInputError):
    """A record that :func:`decode_csv` cannot decode; ``record`` is its flat index in the
    records given (None for a single record), ``column`` the CSV column (0-based)."""

    def __init__(self, problem: str, *, record: int | None = None, column: int | None = None):
        where = []
        if record is not None:
            where.append(f"record {record}")
        if column is not None:
            where.append(f"column {column}")
        super().__init__(f"decode_csv: {', '.join(where) + ': ' if where else ''}{problem}")
        self.problem, self.record, self.column = problem, record, column


class CSVRecordError(DataFileError):
    """A CSV line that cannot be decoded, named by file and line (1-based)."""

    def __init__(self, file: str, line: int, problem: str, *, column: int | None = None):
        InvalidInputError.__init__(
            self,
            f"{file}, line {line}{f', column {column}' if column is not None else ''}: {problem}",
        )
        self.file, self.line, self.column, self.problem = str(file), line, column, problem
        self.record, self.slot, self.field = line - 1, None, None if column is None else str(column)


_CSV_DTYPES = {
    np.dtype(np.float32),
    np.dtype(np.float64),
    np.dtype(np.int32),
    np.dtype(np.int64),
}


def _record_default(default: Any, column: int) -> tuple[np.dtype, Any]:
    """(dtype, default value or None when required) of one record default."""
    where = f"record_defaults for column {column}"
    if isinstance(default, np.dtype) or (
        isinstance(default, type)
        and default in (int, float, str, bytes, np.int32, np.int64, np.float32, np.float64, np.str_)
    ):
        return _check_dtype(
            np.dtype(str) if default in (str, bytes, np.str_) else np.dtype(default), where
        ), None
    if isinstance(default, (list, tuple, np.ndarray)):
        values = default if not isinstance(default, np.ndarray) else list(default.reshape(-1))
        if len(values) == 0:
            dtype = default.dtype if isinstance(default, np.ndarray) else np.dtype(np.float32)
            return _check_dtype(np.dtype(str) if dtype.kind in "SUO" else dtype, where), None
        if len(values) != 1:
            raise InvalidInputError(
                f"decode_csv: {where} must hold at most one value, got {len(values)}"
            )
        if isinstance(default, np.ndarray):
            value = default.reshape(-1)[0]
            dtype = np.dtype(str) if default.dtype.kind in "SUO" else default.dtype
            return _check_dtype(dtype, where), value
        default = values[0]
    if isinstance(default, bool) or default is None:
        raise InvalidInputError(
            f"decode_csv: {where} is {default!r}; a default is an int, float or str value "
            "(or an empty list for a required column)"
        )
    if isinstance(default, np.generic):
        dtype = np.dtype(str) if default.dtype.kind in "SU" else default.dtype
        return _check_dtype(dtype, where), default.item() if dtype.kind != "U" else str(default)
    if isinstance(default, int):
        return np.dtype(np.int32), default
    if isinstance(default, float):
        return np.dtype(np.float32), default
    if isinstance(default, (str, bytes)):
        return np.dtype(str), default.decode() if isinstance(default, bytes) else default
    raise InvalidInputError(
        f"decode_csv: {where} has type {type(default).__name__}; a default is an int, float "
        "or str value (or an empty list for a required column)"
    )


def _check_dtype(dtype: np.dtype, where: str) -> np.dtype:
    if dtype.kind == "U" or dtype in _CSV_DTYPES:
        return np.dtype(str) if dtype.kind == "U" else dtype
    raise InvalidInputError(
        f"decode_csv: {where} has dtype {dtype}; supported: float32, float64, int32, int64, string"
    )


def decode_csv(
    records: Any,
    record_defaults: Sequence[Any],
    field_delim: str = ",",
    use_quote_delim: bool = True,
    na_value: str = "",
    select_cols: Sequence[int] | None = None,
    name: str | None = None,
) -> list[Any]:
    """The columns of CSV ``records`` (``tf.io.decode_csv``): one array per record default.

    ``records``: one str (columns come back as numpy scalars) or an array of them (columns
    have its shape).  Each of ``record_defaults`` gives a column's type and the value of an
    empty field: ``[0]`` int32, ``[0.0]`` float32, ``["x"]`` str, a numpy value its dtype, and
    an empty list (float32) or empty typed array a required column.  ``select_cols`` picks the
    columns (sorted indices) the defaults are for.  A record with the wrong number of fields,
    an empty required field or a field of the wrong type raises :class:`DecodeCSVError`
    (inside :meth:`Dataset.map` over text lines: :class:`CSVRecordError` naming file and line).
    """
    del name
    cols = _selected_columns(len(record_defaults), field_delim, select_cols)
    specs = _specs(record_defaults, cols)
    if isinstance(records, (str, bytes)):  # one record (np.str_ is a str): no arrays
        record = records.decode() if isinstance(records, bytes) else records
        return _decode_one(record, specs, cols, field_delim, use_quote_delim, na_value, select_cols)
    scalar = isinstance(records, np.ndarray) and records.ndim == 0
    array = _as_array(records)
    shape = array.shape
    flat, rows = _split_records(array, field_delim, use_quote_delim, scalar)
    columns = _columns(flat, rows, len(record_defaults), cols, select_cols, scalar)
    out = []
    for (dtype, default), c in zip(specs, cols):
        values = _column_values(columns[c], dtype, default, na_value, c, scalar)
        values = values.reshape(shape)
        out.append(values[()] if scalar else values)
    return out


def _selected_columns(n_defaults: int, field_delim: str,
                      select_cols: Sequence[int] | None) -> list[int]:
    """The indices of the columns the record defaults are for, checked."""
    if len(field_delim) != 1:
        raise InvalidInputError(
            f"decode_csv: field_delim must be one character, got {field_delim!r}"
        )
    if select_cols is None:
        return list(range(n_defaults))
    cols = [int(c) for c in select_cols]
    if len(cols) != n_defaults:
        raise InvalidInputError(
            f"decode_csv: select_cols has {len(cols)} columns, record_defaults {n_defaults}"
        )
    if any(c < 0 for c in cols) or any(b <= a for a, b in zip(cols, cols[1:])):
        raise InvalidInputError(
            f"decode_csv: select_cols must be increasing non-negative indices, got {cols}"
        )
    return cols


def _split_records(array: np.ndarray, field_delim: str, use_quote_delim: bool,
                   scalar: bool) -> tuple[list[str], list[list[str]]]:
    """The records as strings and each one's fields (Python's csv reader, strict quoting)."""
    flat = array.reshape(-1).tolist()
    if flat and not all(isinstance(r, str) for r in (flat[0], flat[-1])):
        flat = [r.decode() if isinstance(r, bytes) else str(r) for r in flat]
    quoting = csv.QUOTE_MINIMAL if use_quote_delim else csv.QUOTE_NONE
    reader = csv.reader(flat, delimiter=field_delim, quoting=quoting, strict=True)
    try:
        rows = list(reader)
    except csv.Error as exc:
        raise DecodeCSVError(
            f"malformed quoting: {exc}", record=None if scalar else reader.line_num - 1
        ) from None
    return flat, rows


def _columns(flat: list[str], rows: list[list[str]], n_defaults: int, cols: list[int],
             select_cols: Sequence[int] | None, scalar: bool) -> list[tuple[str, ...]]:
    """The fields by column, after checking every record has the fields the columns need."""
    # csv gives [] for an empty line: one empty field as TensorFlow counts it
    lengths = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
    counts = np.maximum(lengths, 1)
    if select_cols is None:
        bad = np.flatnonzero(counts != n_defaults)
        expect = f"{n_defaults} fields"
    else:
        bad = np.flatnonzero(counts <= cols[-1])
        expect = f"at least {cols[-1] + 1} fields (select_cols {cols})"
    if len(bad):
        i = int(bad[0])
        raise DecodeCSVError(
            f"expected {expect}, got {int(counts[i])}: {flat[i]!r}", record=None if scalar else i
        )
    width = max(cols[-1] + 1, 1) if cols else 1
    padded = rows
    if (lengths < width).any():  # empty lines of a one-column CSV
        padded = [r if len(r) >= width else r + [""] * (width - len(r)) for r in rows]
    return list(zip(*padded)) if padded else [()] * width


def _column_values(fields: tuple[str, ...], dtype: np.dtype, default: Any, na_value: str,
                   c: int, scalar: bool) -> np.ndarray:
    """One column's fields as ``dtype`` (1-D), empty and ``na_value`` fields the default."""
    raw = np.array(fields, dtype=str) if fields else np.empty(0, dtype=str)
    empty = raw == ""
    if na_value:
        empty |= raw == na_value
    if empty.any() and default is None:
        i = int(np.flatnonzero(empty)[0])
        raise DecodeCSVError(
            "the field is empty and the column has no default (required)",
            record=None if scalar else i,
            column=c,
        )
    if dtype.kind == "U":
        return np.where(empty, str(default), raw) if empty.any() else raw
    filled = np.where(empty, "0", raw) if empty.any() else raw
    try:
        values = filled.astype(np.float64 if dtype.kind == "f" else np.int64)
    except (ValueError, OverflowError):
        i = _first_bad(filled, dtype)
        raise DecodeCSVError(
            f"field {str(raw[i])!r} is not a valid {dtype.name} (the column's record default "
            f"is {dtype.name})",
            record=None if scalar else i,
            column=c,
        ) from None
    if dtype.kind == "i":
        info = np.iinfo(dtype)
        outside = (values < info.min) | (values > info.max)
        if outside.any():
            i = int(np.flatnonzero(outside)[0])
            raise DecodeCSVError(
                f"field {str(raw[i])!r} is out of range for {dtype.name}",
                record=None if scalar else i,
                column=c,
            )
    values = values.astype(dtype)
    if empty.any():
        values[empty] = default
    return values


_SPEC_CACHE: dict[str, list[tuple[np.dtype, Any]]] = {}


def _specs(record_defaults: Sequence[Any], cols: list[int]) -> list[tuple[np.dtype, Any]]:
    """Parsed record defaults, remembered: a map calls decode_csv once per record."""
    try:
        key = repr((record_defaults, cols))
    except Exception:  # an object without a usable repr: parse every time
        key = None
    specs = _SPEC_CACHE.get(key) if key is not None else None
    if specs is None:
        specs = [_record_default(d, c) for d, c in zip(record_defaults, cols)]
        if key is not None and len(_SPEC_CACHE) < 256:
            _SPEC_CACHE[key] = specs
    return specs


_PARSE = {"i": int, "f": float}


def _decode_one(record, specs, cols, delim, use_quote_delim, na_value, select_cols) -> list[Any]:
    """:func:`decode_csv` of one str record, with Python's own parsing (no arrays)."""
    if use_quote_delim and '"' in record:
        quoting = csv.QUOTE_MINIMAL
        try:
            fields = next(csv.reader([record], delimiter=delim, quoting=quoting, strict=True), [])
        except csv.Error as exc:
            raise DecodeCSVError(f"malformed quoting: {exc}") from None
    else:
        fields = record.split(delim)
    n = max(len(fields), 1)
    if select_cols is None and n != len(specs):
        raise DecodeCSVError(f"expected {len(specs)} fields, got {n}: {record!r}")
    if select_cols is not None and n <= cols[-1]:
        raise DecodeCSVError(
            f"expected at least {cols[-1] + 1} fields (select_cols {cols}), got {n}: {record!r}"
        )
    out = []
    for (dtype, default), c in zip(specs, cols):
        field = fields[c] if c < len(fields) else ""
        if field == "" or (na_value and field == na_value):
            if default is None:
                raise DecodeCSVError(
                    "the field is empty and the column has no default (required)", column=c
                )
            out.append(np.str_(default) if dtype.kind == "U" else dtype.type(default))
            continue
        kind = dtype.kind
        if kind == "U":
            out.append(np.str_(field))
            continue
        try:
            value = _PARSE[kind](field)
        except ValueError:
            raise DecodeCSVError(
                f"field {field!r} is not a valid {dtype.name} (the column's record default "
                f"is {dtype.name})",
                column=c,
            ) from None
        if kind == "i":
            info = np.iinfo(dtype)
            if not info.min <= value <= info.max:
                raise DecodeCSVError(f"field {field!r} is out of range for {dtype.name}", column=c)
        out.append(dtype.type(value))
    return out


def _first_bad(values: np.ndarray, dtype: np.dtype) -> int:
    kind = float if dtype.kind == "f" else int
    for i, v in enumerate(values.tolist()):  # the error path only
        try:
            kind(v)
        except ValueError:
            return i
    return 0
