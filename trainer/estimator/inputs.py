"""Input functions for Estimators (``tf.estimator.inputs``): in-memory numpy and pandas data.

An ``input_fn`` is a callable of no arguments returning either a
:class:`~tierserve.trainer.data.Dataset` whose elements are ``(features, labels)`` batches
(``features`` a dict of numpy arrays, or one array; ``labels`` an array, a dict of arrays, or
None), or one ``(features, labels)`` tuple, or features alone.  :func:`batches` turns any of
these into the batches an Estimator consumes.

:func:`numpy_input_fn` and :func:`pandas_input_fn` follow TensorFlow's semantics: ``shuffle``
must be given, ``num_epochs=None`` repeats forever (every batch full), otherwise the data is
read ``num_epochs`` times and the last, smaller batch is kept.  With ``shuffle=True`` each
epoch is drawn through a shuffle buffer of ``queue_capacity`` rows (TensorFlow's shuffle
queue), so rows never cross an epoch boundary.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from tierserve.core.errors import InvalidInputError

from ..data.dataset import Dataset
from ..data.iterator import OneShotIterator, stream_of

__all__ = ["batches", "numpy_input_fn", "pandas_input_fn"]


def _check_common(batch_size, num_epochs, shuffle, queue_capacity, num_threads, fn: str) -> None:
    if not isinstance(shuffle, bool):
        raise InvalidInputError(
            f"{fn}: shuffle must be provided and explicitly set as boolean (it is recommended to "
            f"set it as True for training); got {shuffle!r}"
        )
    for name, value in (("batch_size", batch_size), ("queue_capacity", queue_capacity)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
            raise InvalidInputError(f"{fn}: {name} must be a positive integer, got {value!r}")
    if num_epochs is not None and (
        isinstance(num_epochs, bool)
        or not isinstance(num_epochs, numbers.Integral)
        or num_epochs < 1
    ):
        raise InvalidInputError(
            f"{fn}: num_epochs must be a positive integer or None (forever), got {num_epochs!r}"
        )
    if num_threads != 1:
        raise InvalidInputError(
            f"{fn}: num_threads={num_threads!r} is not supported: batches are cut from the "
            "arrays by numpy in the training thread; use num_threads=1"
        )


def _pipeline(
    columns: dict[str, np.ndarray],
    feature_keys: list[str] | None,
    label_keys: list[str] | str | None,
    batch_size: int,
    num_epochs: int | None,
    shuffle: bool,
    queue_capacity: int,
) -> Dataset:
    """Batches of ``(features, labels)`` from equally long columns."""
    ds = Dataset.from_tensor_slices(columns)
    if shuffle:
        ds = ds.shuffle(queue_capacity)
    ds = ds.repeat(num_epochs)
    drop = num_epochs is None  # forever: every batch full, as TensorFlow's queue gave them
    return ds.batch(batch_size, drop_remainder=drop).map(
        lambda row: _split(row, feature_keys, label_keys)
    )


def _split(row: dict, feature_keys: list[str] | None, label_keys) -> tuple[Any, Any]:
    features = row["__x__"] if feature_keys is None else {k: row[k] for k in feature_keys}
    if label_keys is None:
        labels = None
    elif isinstance(label_keys, str):
        labels = row[label_keys]
    else:
        labels = {k: row[k] for k in label_keys}
    return features, labels


def _length_error(x: dict, y: Any) -> InvalidInputError:
    xs = {k: np.shape(v) for k, v in x.items()}
    ys = {k: np.shape(v) for k, v in y.items()} if isinstance(y, dict) else np.shape(y)
    return InvalidInputError(
        "numpy_input_fn: length of tensors in x and y is mismatched; all elements in x and y "
        f"must have the same length. Shapes in x: {xs}. Shapes in y: {ys}"
    )


def numpy_input_fn(
    x: np.ndarray | dict[str, Any],
    y: np.ndarray | dict[str, Any] | None = None,
    batch_size: int = 128,
    num_epochs: int | None = 1,
    shuffle: bool | None = None,
    queue_capacity: int = 1000,
    num_threads: int = 1,
    target_column: str = "target",
) -> Callable[[], Dataset]:
    """An input_fn over numpy arrays: features ``x`` (a dict of arrays, or one array given
    as the features themselves), labels ``y`` (an array, a dict of arrays, or None).

    ``target_column`` is the internal name the label is kept under next to the features
    (TensorFlow's meaning: it never shows in what comes out, and a clash with a feature name
    is resolved, not an error).
    """
    _check_common(batch_size, num_epochs, shuffle, queue_capacity, num_threads, "numpy_input_fn")
    if not isinstance(target_column, str):
        raise InvalidInputError(
            f"numpy_input_fn: target_column must be a str, got {target_column!r}"
        )
    if x is None:
        raise InvalidInputError("numpy_input_fn: x must be an array or a dict of arrays")
    if isinstance(x, dict):
        xs = {str(k): np.asarray(v) for k, v in x.items()}
        if not xs:
            raise InvalidInputError("numpy_input_fn: x is an empty dict")
        feature_keys: list[str] | None = sorted(xs)
    else:
        xs = {"__x__": np.asarray(x)}
        feature_keys = None
    columns = dict(xs)
    label_keys: list[str] | str | None = None
    if isinstance(y, dict):
        ys = {str(k): np.asarray(v) for k, v in y.items()}
        both = sorted(set(ys) & set(xs))
        if both:
            raise InvalidInputError(
                f"numpy_input_fn: {len(both)} duplicate keys are found in both x and y: {both}"
            )
        columns.update(ys)
        label_keys = sorted(ys)
    elif y is not None:
        label_keys = target_column
        while label_keys in columns:  # TensorFlow's _get_unique_target_key
            label_keys += "_n"
        columns[label_keys] = np.asarray(y)
    for k, v in columns.items():
        if v.ndim == 0:
            raise InvalidInputError(
                f"numpy_input_fn: {'x' if k in xs else 'y'}[{k!r}] is a scalar; "
                "arrays with a first (row) dimension are needed"
            )
    if len({len(v) for v in columns.values()}) > 1:
        raise _length_error(x if isinstance(x, dict) else {"x": x}, y)
    ds = _pipeline(
        columns, feature_keys, label_keys, batch_size, num_epochs, shuffle, queue_capacity
    )
    return lambda: ds


def pandas_input_fn(
    x: Any,
    y: Any = None,
    batch_size: int = 128,
    num_epochs: int | None = 1,
    shuffle: bool | None = None,
    queue_capacity: int = 1000,
    num_threads: int = 1,
    target_column: str = "target",
) -> Callable[[], Dataset]:
    """An input_fn over a pandas DataFrame ``x`` (features: its columns) and labels ``y``
    (a Series, a DataFrame for several labels, or None) with the same index.

    ``target_column`` names the label column added beside ``x``'s columns; a column of ``x``
    by that name is an error, as in TensorFlow.
    """
    try:
        import pandas as pd
    except ImportError:
        raise InvalidInputError(
            "pandas_input_fn needs pandas: pip install 'tierserve[pandas]'"
        ) from None
    _check_common(batch_size, num_epochs, shuffle, queue_capacity, num_threads, "pandas_input_fn")
    if not isinstance(x, pd.DataFrame):
        raise InvalidInputError(
            f"pandas_input_fn: x must be a pandas DataFrame, got {type(x).__name__}"
        )
    if y is not None and not isinstance(y, (pd.Series, pd.DataFrame)):
        raise InvalidInputError(
            f"pandas_input_fn: y must be a pandas Series or DataFrame, got {type(y).__name__}"
        )
    if y is not None and not np.array_equal(x.index, y.index):
        raise InvalidInputError(
            "pandas_input_fn: index for x and y are mismatched. "
            f"Index for x: {list(x.index)[:10]}. Index for y: {list(y.index)[:10]}"
        )
    columns = {str(k): x[k].to_numpy() for k in x.columns}
    if len(columns) != len(x.columns):
        raise InvalidInputError("pandas_input_fn: x has duplicate column names")
    feature_keys = list(columns)
    label_keys: list[str] | str | None = None
    if isinstance(y, pd.DataFrame):
        label_keys = [str(k) for k in y.columns]
        both = sorted(set(label_keys) & set(columns))
        if both:
            raise InvalidInputError(f"pandas_input_fn: columns {both} of y are also columns of x")
        columns.update({str(k): y[k].to_numpy() for k in y.columns})
    elif y is not None:
        if target_column in columns:
            raise InvalidInputError(
                f"pandas_input_fn: cannot use name {target_column!r} for target column: "
                f"DataFrame already has a column with that name: {list(x.columns)}"
            )
        label_keys = target_column
        columns[target_column] = y.to_numpy()
    ds = _pipeline(
        columns, feature_keys, label_keys, batch_size, num_epochs, shuffle, queue_capacity
    )
    return lambda: ds


def batches(result: Any) -> Iterator[tuple[Any, Any]]:
    """The ``(features, labels)`` batches an ``input_fn``'s return value stands for.

    A :class:`~tierserve.trainer.data.Dataset` (or any iterable of batches) gives its
    elements; what ``make_one_shot_iterator().get_next()`` gave, however the input_fn
    arranged it (``features, label = ...get_next(); return features, label``, or
    ``x, y = ...get_next(); return {"x": x}, y``), gives that batch and the rest of its pass
    arranged the same way (:func:`~tierserve.trainer.data.iterator.stream_of`); one
    ``(features, labels)`` tuple, or features alone (``labels`` None), gives that one batch
    (an Estimator trains on it again at every step, as TensorFlow did with constant input
    tensors).  A Dataset of features only gives ``(features, None)``.
    """
    stream = stream_of(result)
    if stream is not None:
        return _as_pairs(stream)
    if isinstance(result, OneShotIterator):
        return _as_pairs(result)
    if isinstance(result, Dataset):
        return _as_pairs(iter(result))
    if isinstance(result, tuple) and len(result) == 2:
        return iter([(_to_arrays(result[0]), _to_arrays(result[1]))])
    if isinstance(result, dict):
        return iter([(_to_arrays(result), None)])
    if hasattr(result, "__iter__") and not isinstance(result, (str, bytes, np.ndarray)):
        return _as_pairs(iter(result))
    raise InvalidInputError(
        "input_fn must return a Dataset, a (features, labels) tuple or a features dict, got "
        f"{type(result).__name__}"
    )


def _to_arrays(value: Any) -> Any:
    if value is None:
        return None
    if isinstance(value, dict):
        return {k: np.asarray(v) for k, v in value.items()}
    return np.asarray(value)


def _as_pairs(elements: Iterator[Any]) -> Iterator[tuple[Any, Any]]:
    for element in elements:
        if isinstance(element, tuple) and len(element) == 2:
            yield element
        elif isinstance(element, dict):
            yield element, None
        else:
            raise InvalidInputError(
                "an input_fn's dataset must give (features, labels) tuples or features dicts, "
                f"got {type(element).__name__}"
            )
