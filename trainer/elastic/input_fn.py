"""The input_fn of a DLRover conf's data set: ``{"reader": ..., "columns": (...), ...}``.

Records come from the reader (an :class:`~.readers.ElasticReader` shard by shard, or any
reader's ``iterator()``), are batched, and each batch is decoded at once by
:func:`~tierserve.trainer.data.decode_csv` with one record default per column: features
are the non-label columns by name; labels the label column (a dict when several, None when
none).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from tierserve.core.errors import ConfigError, InvalidInputError

from ..data.csv_decode import DecodeCSVError, decode_csv
from ..data.dataset import Dataset
from .column import Column
from .readers import ElasticReader

DATA_SET_KEYS = ("reader", "columns", "epoch", "batch_size", "field_delim")
_CHUNK = 1024


def check_data_set(data_set: Any, what: str) -> dict[str, Any]:
    """``data_set`` checked: a dict of :data:`DATA_SET_KEYS` with a reader and columns."""
    if not isinstance(data_set, dict):
        raise ConfigError(
            f"{what} must be a dict with 'reader' and 'columns', got {type(data_set).__name__}"
        )
    unknown = sorted(set(data_set) - set(DATA_SET_KEYS))
    if unknown:
        raise ConfigError(
            f"{what}: unknown key(s) {unknown}; a data set takes {list(DATA_SET_KEYS)}"
        )
    for key in ("reader", "columns"):
        if data_set.get(key) is None:
            raise ConfigError(f"{what} has no {key!r}")
    reader = data_set["reader"]
    if not isinstance(reader, ElasticReader) and not callable(getattr(reader, "iterator", None)):
        raise ConfigError(
            f"{what}['reader'] ({type(reader).__name__}) is neither an ElasticReader nor has an "
            "iterator() method"
        )
    columns = data_set["columns"]
    if not isinstance(columns, (list, tuple)) or not columns:
        raise ConfigError(f"{what}['columns'] must be a non-empty list of Column")
    for c in columns:
        if not isinstance(c, Column):
            raise ConfigError(f"{what}['columns'] holds {c!r}, not a Column (Column.create(...))")
    names = [c.name for c in columns]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ConfigError(f"{what}['columns']: duplicate column names {dupes}")
    delim = data_set.get("field_delim", ",")
    if not isinstance(delim, str) or len(delim) != 1:
        raise ConfigError(f"{what}['field_delim'] must be one character, got {delim!r}")
    for key in ("epoch", "batch_size"):
        value = data_set.get(key)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 1
        ):
            raise ConfigError(f"{what}[{key!r}] must be a positive int, got {value!r}")
    return data_set


def build_input_fn(
    data_set: dict[str, Any],
    batch_size: int = 64,
    epoch: int | None = 1,
    restart_each_call: bool = False,
    what: str = "data set",
) -> Callable[[], Dataset]:
    """An input_fn over ``data_set``; its own ``batch_size`` and ``epoch`` win over these.

    An elastic reader is configured for them at once; each call of the input_fn goes on with
    the shards not yet handed out, or with ``restart_each_call`` (evaluation) reads from the
    first again.
    """
    check_data_set(data_set, what)
    reader = data_set["reader"]
    columns: Sequence[Column] = data_set["columns"]
    batch_size = data_set.get("batch_size") or batch_size
    epoch = data_set.get("epoch", epoch)
    delim = data_set.get("field_delim", ",")
    names = [c.name for c in columns]
    defaults = [c.record_default() for c in columns]
    labels = [c.name for c in columns if c.is_label]
    elastic = isinstance(reader, ElasticReader)
    if elastic:
        reader.configure(num_epochs=epoch, batch_size=batch_size)
    state = {"calls": 0}

    def records() -> Iterator[dict[str, np.ndarray]]:
        if elastic:
            for start, end in reader.ranges():
                values = np.empty(end - start, dtype=object)
                values[:] = reader.read_checked(start, end)
                yield {"record": values, "index": np.arange(start, end, dtype=np.int64)}
        else:
            it, first = iter(reader.iterator()), 0
            while True:
                chunk = list(itertools.islice(it, _CHUNK))
                if not chunk:
                    return
                values = np.empty(len(chunk), dtype=object)
                values[:] = chunk
                yield {"record": values, "index": np.arange(first, first + len(chunk))}
                first += len(chunk)

    def parse(batch: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], Any]:
        try:
            cols = decode_csv(batch["record"], defaults, field_delim=delim)
        except DecodeCSVError as exc:
            index = int(batch["index"][exc.record or 0])
            line = reader.line_of(index) if elastic else None
            where = f"line {line}" if line is not None else f"record {index}"
            column = f", column {names[exc.column]!r}" if exc.column is not None else ""
            raise InvalidInputError(f"{reader_name}, {where}{column}: {exc.problem}") from None
        features = dict(zip(names, cols))
        if not labels:
            return features, None
        if len(labels) == 1:
            return features, features.pop(labels[0])
        return features, {name: features.pop(name) for name in labels}

    reader_name = getattr(reader, "name", None) or type(reader).__name__

    def input_fn() -> Dataset:
        if elastic and restart_each_call and state["calls"]:
            reader.build_sharding_client()
        state["calls"] += 1
        ds = Dataset.from_batches(records)
        if not elastic and epoch is not None and epoch > 1:
            ds = ds.repeat(epoch)
        return ds.batch(batch_size).map(parse)

    input_fn.reader = reader  # type: ignore[attr-defined]
    input_fn.batch_size = batch_size  # type: ignore[attr-defined]
    return input_fn
