"""Numeric and bucketized columns (``tf.feature_column.numeric_column``,
``bucketized_column``): floats in the dense input, and buckets as ids or one-hot, boundaries
compared in float32."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from tierserve.core.errors import ConfigError, InvalidInputError

from .column_base import CategoricalColumn, DenseColumn
from .feature_values import Ids, _feature


class NumericColumn(DenseColumn):
    def __init__(self, key: str, shape: Sequence[int] | int = (1,), default_value: Any = None,
                 dtype: Any = np.float32, normalizer_fn: Callable | None = None) -> None:
        self.key = self.name = str(key)
        self.shape = (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(
            int(d) for d in shape)
        if not self.shape or any(d < 1 for d in self.shape):
            raise ConfigError(f"numeric_column {key!r}: shape must be positive, got {shape}")
        self.default_value = default_value
        self.dtype = np.dtype(getattr(dtype, "as_numpy_dtype", dtype))
        if self.dtype.kind not in "iuf":
            raise ConfigError(f"numeric_column {key!r}: dtype must be numeric, got {dtype}")
        if normalizer_fn is not None and not callable(normalizer_fn):
            raise ConfigError(f"numeric_column {key!r}: normalizer_fn must be callable")
        self.normalizer_fn = normalizer_fn

    @property
    def input_keys(self) -> list[str]:
        return [self.key]

    @property
    def dense_width(self) -> int:
        return int(np.prod(self.shape))

    def values(self, features: dict) -> np.ndarray:
        raw = _feature(features, self.key, self.name)
        arr = np.asarray(raw)
        if arr.dtype.kind not in "iufb":
            try:
                arr = arr.astype(np.float64)
            except (TypeError, ValueError):
                raise InvalidInputError(
                    f"numeric_column {self.name!r}: feature {self.key!r} must be numeric, got "
                    f"dtype {arr.dtype}") from None
        arr = arr.astype(np.float32).reshape(arr.shape[0] if arr.ndim else 1, -1)
        if arr.shape[1] != self.dense_width:
            raise InvalidInputError(
                f"numeric_column {self.name!r}: feature {self.key!r} has {arr.shape[1]} values "
                f"per example; the column's shape {list(self.shape)} needs {self.dense_width}")
        if self.default_value is not None:
            arr = np.where(np.isnan(arr), np.float32(self.default_value), arr)
        if self.normalizer_fn is not None:
            arr = np.asarray(self.normalizer_fn(arr), dtype=np.float32).reshape(arr.shape)
        return arr

    def dense(self, features: dict) -> np.ndarray:
        return self.values(features)

    def config(self) -> dict[str, Any]:
        return {"type": "numeric", "key": self.key, "shape": list(self.shape),
                "default_value": self.default_value,
                "normalizer_fn": None if self.normalizer_fn is None else getattr(
                    self.normalizer_fn, "__name__", repr(self.normalizer_fn))}


class BucketizedColumn(DenseColumn, CategoricalColumn):
    def __init__(self, source_column: NumericColumn, boundaries: Sequence[float]) -> None:
        if not isinstance(source_column, NumericColumn):
            raise ConfigError("bucketized_column: source_column must be a numeric_column, got "
                              f"{type(source_column).__name__}")
        b = [float(x) for x in boundaries]
        if not b or any(x >= y for x, y in zip(b, b[1:])):
            raise ConfigError(f"bucketized_column {source_column.name!r}: boundaries must be a "
                              f"non-empty increasing list, got {list(boundaries)}")
        self.source_column = source_column
        self.boundaries = np.asarray(b, np.float64)
        # TensorFlow's Bucketize op holds the boundaries as float32 and compares float32 values
        self._boundaries32 = self.boundaries.astype(np.float32)
        self.name = f"{source_column.name}_bucketized"
        self.num_buckets = (len(b) + 1) * source_column.dense_width

    @property
    def input_keys(self) -> list[str]:
        return self.source_column.input_keys

    @property
    def dense_width(self) -> int:
        return self.num_buckets

    def _buckets(self, features: dict) -> np.ndarray:
        x = self.source_column.values(features)  # float32
        idx = np.searchsorted(self._boundaries32, x, side="right")  # [B, w]: boundaries <= x
        return idx + (len(self.boundaries) + 1) * np.arange(x.shape[1])[None, :]

    def ids(self, features: dict) -> Ids:
        idx = self._buckets(features)
        b, w = idx.shape
        if w == 1:
            return Ids(idx[:, 0].astype(np.int64), None, b)
        return Ids(idx.reshape(-1).astype(np.int64), np.arange(0, b * w + 1, w), b)

    def dense(self, features: dict) -> np.ndarray:
        idx = self._buckets(features)
        out = np.zeros((idx.shape[0], self.num_buckets), np.float32)
        np.put_along_axis(out, idx, 1.0, axis=1)
        return out

    def config(self) -> dict[str, Any]:
        return {"type": "bucketized", "source": self.source_column.config(),
                "boundaries": self.boundaries.tolist()}
