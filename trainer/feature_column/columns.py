"""The feature column classes and constructors (``tf.feature_column``'s names).

Numeric, bucketized and indicator columns fill the dense input (the server's ``DES``);
categorical columns turn raw values into ids, vectorised with numpy (vocabulary lookup by
binary search, TensorFlow's FarmHash ``Fingerprint64`` hashing, bucketing in float32);
embedding columns look those ids up in the trainer's embedding tables
(:class:`~tierserve.trainer.embedding.EmbeddingTable`), so an exported model's tables go into the parameter server like any model's.  Columns of one
``DenseFeatures`` call with the same dimension and combiner share one table, a slot each
(HugeCTR's layout: ids offset per slot), which is what the server looks up as ``CATCOLUMN``.

Missing values: an empty string, ``None``, NaN or (integer columns) ``-1`` is no id, as
TensorFlow drops them; an empty row pools to zeros.  Ids are TensorFlow's: hash buckets and
vocabulary OOV buckets are ``Fingerprint64(str(value)) % buckets`` (integers hash as their
decimal string), crosses chain ``FingerprintCat64`` from the hash key (default
``0xDECAFCAFFE``) over the inputs' fingerprints, bucket boundaries compare in float32.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tierserve.core.errors import ConfigError, InvalidInputError

from .hashing import DEFAULT_HASH_KEY, cross_feature, fingerprint64, fingerprint_cat64


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


# -- column base classes ---------------------------------------------------------------------


class FeatureColumn:
    """Base of every column: ``name`` and the raw feature keys it reads."""

    name: str = ""

    @property
    def input_keys(self) -> list[str]:
        raise NotImplementedError

    def config(self) -> dict[str, Any]:
        """What a serving client needs to compute this column (exported beside a model)."""
        raise NotImplementedError

    def __lt__(self, other: FeatureColumn) -> bool:
        return self.name < other.name


class DenseColumn(FeatureColumn):
    """A column with values in the dense input: ``dense_width`` floats per example."""

    @property
    def dense_width(self) -> int:
        raise NotImplementedError

    def dense(self, features: dict) -> np.ndarray:
        """float32 ``[batch, dense_width]``."""
        raise NotImplementedError


class CategoricalColumn(FeatureColumn):
    """A column of ids in ``[0, num_buckets)``."""

    num_buckets: int = 0

    def ids(self, features: dict) -> Ids:
        raise NotImplementedError

    def cross_ids(self, features: dict) -> Ids:
        """The ids a crossed column combines (the ids, save where TensorFlow crosses ids
        the embedding lookup would drop)."""
        return self.ids(features)


# -- numeric and bucketized ------------------------------------------------------------------


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


# -- categorical -----------------------------------------------------------------------------


class IdentityCategoricalColumn(CategoricalColumn):
    def __init__(self, key: str, num_buckets: int, default_value: int | None = None) -> None:
        self.key = self.name = str(key)
        self.num_buckets = int(num_buckets)
        if self.num_buckets < 1:
            raise ConfigError(f"categorical_column_with_identity {key!r}: num_buckets must be "
                              f"positive, got {num_buckets}")
        self.default_value = default_value
        if default_value is not None and not 0 <= int(default_value) < self.num_buckets:
            raise ConfigError(f"categorical_column_with_identity {key!r}: default_value "
                              f"{default_value} is outside [0, {num_buckets})")

    @property
    def input_keys(self) -> list[str]:
        return [self.key]

    def ids(self, features: dict) -> Ids:
        values, offsets, b = raw_values(self.name, self.key,
                                        _feature(features, self.key, self.name))
        if values.dtype.kind not in "iu":
            if values.dtype.kind == "f" and np.all(values == np.round(values)):
                values = values.astype(np.int64)
            else:
                raise InvalidInputError(
                    f"categorical_column_with_identity {self.name!r}: feature {self.key!r} must "
                    f"hold integer ids, got dtype {values.dtype}")
        values = values.astype(np.int64)
        bad = (values < 0) | (values >= self.num_buckets)
        if bad.any():
            if self.default_value is None:
                v = int(values[bad][0])
                raise InvalidInputError(
                    f"categorical_column_with_identity {self.name!r}: id {v} is outside "
                    f"[0, {self.num_buckets}) and the column has no default_value")
            values = np.where(bad, int(self.default_value), values)
        return Ids(values, offsets, b)

    def config(self) -> dict[str, Any]:
        return {"type": "identity", "key": self.key, "num_buckets": self.num_buckets,
                "default_value": self.default_value}


class VocabularyListCategoricalColumn(CategoricalColumn):
    def __init__(self, key: str, vocabulary_list: Sequence[Any], dtype: Any = None,
                 default_value: int = -1, num_oov_buckets: int = 0,
                 what: str = "categorical_column_with_vocabulary_list") -> None:
        self.key = self.name = str(key)
        vocab = np.asarray(list(vocabulary_list))
        if vocab.size == 0:
            raise ConfigError(f"{what} {key!r}: the vocabulary is empty")
        if len(np.unique(vocab)) != len(vocab):
            raise ConfigError(f"{what} {key!r}: the vocabulary has duplicates")
        if vocab.dtype.kind not in "USiu":
            raise ConfigError(f"{what} {key!r}: vocabulary values must be strings or integers, "
                              f"got {vocab.dtype}")
        self.vocabulary = vocab
        self._order = np.argsort(vocab, kind="stable")
        self._sorted = vocab[self._order]
        self.num_oov_buckets = int(num_oov_buckets)
        if self.num_oov_buckets and default_value not in (-1, None):
            raise ConfigError(f"{what} {key!r}: give default_value or num_oov_buckets, not both")
        self.default_value = -1 if default_value is None else int(default_value)
        self.num_buckets = len(vocab) + self.num_oov_buckets

    @property
    def input_keys(self) -> list[str]:
        return [self.key]

    def _lookup(self, features: dict) -> Ids:
        """Ids with TensorFlow's default_value (-1 by default) for values out of vocabulary
        when there are no OOV buckets."""
        values, offsets, b = raw_values(self.name, self.key,
                                        _feature(features, self.key, self.name))
        if self.vocabulary.dtype.kind in "US":
            values = values.astype(str)
        elif values.dtype.kind not in "iu":
            raise InvalidInputError(
                f"vocabulary column {self.name!r}: feature {self.key!r} must hold integers like "
                f"its vocabulary, got dtype {values.dtype}")
        pos = np.searchsorted(self._sorted, values)
        pos = np.clip(pos, 0, len(self._sorted) - 1)
        found = self._sorted[pos] == values
        ids = self._order[pos].astype(np.int64)
        if not found.all():
            if self.num_oov_buckets:  # index_table_from_tensor: to_hash_bucket_fast(as_string)
                oov = len(self.vocabulary) + (fingerprint64(values) % np.uint64(
                    self.num_oov_buckets)).astype(np.int64)
                ids = np.where(found, ids, oov)
            else:
                ids = np.where(found, ids, self.default_value)
        return Ids(ids, offsets, b)

    def ids(self, features: dict) -> Ids:
        ids = self._lookup(features)
        missing = ids.values < 0
        if not missing.any():
            return ids
        # out of vocabulary with default_value -1: no id (the embedding lookup prunes it)
        offsets = ids.offsets if ids.offsets is not None else np.arange(ids.batch_size + 1)
        csum = np.concatenate([[0], np.cumsum(~missing)])
        return Ids(ids.values[~missing], csum[offsets], ids.batch_size)

    def cross_ids(self, features: dict) -> Ids:
        return self._lookup(features)  # a crossed column crosses the -1 ids too

    def config(self) -> dict[str, Any]:
        return {"type": "vocabulary", "key": self.key, "vocabulary": self.vocabulary.tolist(),
                "default_value": self.default_value, "num_oov_buckets": self.num_oov_buckets}


class HashedCategoricalColumn(CategoricalColumn):
    def __init__(self, key: str, hash_bucket_size: int, dtype: Any = str) -> None:
        self.key = self.name = str(key)
        self.num_buckets = int(hash_bucket_size)
        if self.num_buckets < 1:
            raise ConfigError(f"categorical_column_with_hash_bucket {key!r}: hash_bucket_size "
                              f"must be positive, got {hash_bucket_size}")

    @property
    def input_keys(self) -> list[str]:
        return [self.key]

    def ids(self, features: dict) -> Ids:
        values, offsets, b = raw_values(self.name, self.key,
                                        _feature(features, self.key, self.name))
        try:
            h = fingerprint64(values) % np.uint64(self.num_buckets)
        except InvalidInputError as exc:
            raise InvalidInputError(f"categorical_column_with_hash_bucket {self.name!r}: "
                                    f"feature {self.key!r}: {exc}") from None
        return Ids(h.astype(np.int64), offsets, b)

    def config(self) -> dict[str, Any]:
        return {"type": "hash_bucket", "key": self.key, "hash_bucket_size": self.num_buckets}


class CrossedColumn(CategoricalColumn):
    """TensorFlow's ``crossed_column``: ``tf.sparse.cross_hashed`` over the keys' values.

    Each example gets one id per combination of its inputs' values (the cartesian product;
    an input with no value gives no id): ``FingerprintCat64`` chained from ``hash_key`` over
    ``Fingerprint64`` of a raw string, the value of a raw integer, the id of a categorical
    column, then ``% hash_bucket_size``.  A raw feature's every value is crossed (``''`` and
    ``-1`` included, as TensorFlow's dense inputs are); nested crossed columns are flattened
    into their keys, as TensorFlow does."""

    def __init__(self, keys: Sequence[Any], hash_bucket_size: int, hash_key: int | None = None
                 ) -> None:
        if len(keys) < 2:
            raise ConfigError("crossed_column: needs at least two keys or columns")
        self.keys = list(keys)
        for k in self.keys:
            if not isinstance(k, (str, CategoricalColumn)) or isinstance(k, (
                    EmbeddingColumn, IndicatorColumn)):
                raise ConfigError(f"crossed_column: {k!r} is neither a feature key nor a "
                                  "categorical column")
            if isinstance(k, WeightedCategoricalColumn):
                raise ConfigError(f"crossed_column: {k.name!r} has weights; crossed_column does "
                                  "not support weighted columns (as in TensorFlow)")
            if isinstance(k, HashedCategoricalColumn):
                raise ConfigError(
                    f"crossed_column: categorical_column_with_hash_bucket {k.name!r} is not "
                    "supported for crossing (as in TensorFlow: hashing before crossing adds "
                    "collisions); give the feature name as a string instead")
        # TensorFlow's name: the leaf keys' names, sorted
        self.name = "_X_".join(sorted(k if isinstance(k, str) else k.name
                                      for k in self._leaf_keys()))
        self.num_buckets = int(hash_bucket_size)
        if self.num_buckets < 1:
            raise ConfigError(f"crossed_column {self.name!r}: hash_bucket_size must be positive")
        self.hash_key = DEFAULT_HASH_KEY if hash_key is None else int(hash_key)

    @property
    def input_keys(self) -> list[str]:
        out: list[str] = []
        for k in self.keys:
            out.extend([k] if isinstance(k, str) else k.input_keys)
        return out

    def _leaf_keys(self) -> list[Any]:
        out: list[Any] = []
        for k in self.keys:
            out.extend(k._leaf_keys() if isinstance(k, CrossedColumn) else [k])
        return out

    def _inputs(self, features: dict) -> list[tuple[np.ndarray, np.ndarray, int]]:
        """Per leaf key: (uint64 features to combine, CSR offsets, batch size)."""
        out = []
        for k in self._leaf_keys():
            what = k if isinstance(k, str) else k.name
            if isinstance(k, str):
                values, offsets, n = raw_values(self.name, k, _feature(features, k, self.name),
                                                drop_missing=False)
                try:
                    part = cross_feature(values)
                except InvalidInputError as exc:
                    raise InvalidInputError(f"crossed_column {self.name!r}: feature {k!r}: "
                                            f"{exc}") from None
            else:
                ids = k.cross_ids(features)
                offsets, n = ids.offsets, ids.batch_size
                part = ids.values.astype(np.int64).view(np.uint64)
            if out and n != out[0][2]:
                raise InvalidInputError(f"crossed_column {self.name!r}: {what!r} has {n} "
                                        f"examples, the others {out[0][2]}")
            if offsets is None:
                offsets = np.arange(n + 1, dtype=np.int64)
            out.append((part, np.asarray(offsets, np.int64), n))
        return out

    def ids(self, features: dict) -> Ids:
        inputs = self._inputs(features)
        b = inputs[0][2]
        counts = [np.diff(off) for _, off, _ in inputs]
        if all((c == 1).all() for c in counts):  # one value each: no product to expand
            h = np.full(b, self.hash_key, np.uint64)
            for part, off, _ in inputs:
                h = fingerprint_cat64(h, part[off[:-1]])
            return Ids((h % np.uint64(self.num_buckets)).astype(np.int64), None, b)
        per_row = np.ones(b, np.int64)
        for c in counts:
            per_row *= c
        offsets = np.concatenate([[0], np.cumsum(per_row)]).astype(np.int64)
        row = np.repeat(np.arange(b, dtype=np.int64), per_row)
        rest = np.arange(int(offsets[-1]), dtype=np.int64) - offsets[row]  # index in the product
        h = np.full(len(row), self.hash_key, np.uint64)
        picks = []
        for part, off, _ in reversed(inputs):  # the last input varies fastest
            c = np.diff(off)[row]
            picks.append(part[off[:-1][row] + rest % np.maximum(c, 1)])
            rest //= np.maximum(c, 1)
        for pick in reversed(picks):
            h = fingerprint_cat64(h, pick)
        return Ids((h % np.uint64(self.num_buckets)).astype(np.int64), offsets, b)

    def cross_ids(self, features: dict) -> Ids:
        return self.ids(features)

    def config(self) -> dict[str, Any]:
        return {"type": "crossed", "keys": [k if isinstance(k, str) else k.config()
                                            for k in self.keys],
                "hash_bucket_size": self.num_buckets, "hash_key": self.hash_key}


class WeightedCategoricalColumn(CategoricalColumn):
    def __init__(self, categorical_column: CategoricalColumn, weight_feature_key: str,
                 dtype: Any = np.float32) -> None:
        if not isinstance(categorical_column, CategoricalColumn):
            raise ConfigError("weighted_categorical_column: categorical_column must be a "
                              "categorical column")
        self.categorical_column = categorical_column
        self.weight_feature_key = str(weight_feature_key)
        self.name = f"{categorical_column.name}_weighted_by_{weight_feature_key}"
        self.num_buckets = categorical_column.num_buckets

    @property
    def input_keys(self) -> list[str]:
        return [*self.categorical_column.input_keys, self.weight_feature_key]

    def ids(self, features: dict) -> Ids:
        ids = self.categorical_column.ids(features)
        raw = _feature(features, self.weight_feature_key, self.name)
        w, w_off, b = raw_values(self.name, self.weight_feature_key, raw)
        if w.dtype.kind not in "iuf":
            raise InvalidInputError(f"weighted_categorical_column {self.name!r}: weights "
                                    f"{self.weight_feature_key!r} must be numeric, got {w.dtype}")
        if len(w) != len(ids.values) or b != ids.batch_size or (
                (w_off is None) != (ids.offsets is None)) or (
                w_off is not None and not np.array_equal(w_off, ids.offsets)):
            raise InvalidInputError(
                f"weighted_categorical_column {self.name!r}: weights "
                f"{self.weight_feature_key!r} must give one weight per id of "
                f"{self.categorical_column.name!r}")
        return Ids(ids.values, ids.offsets, b, w.astype(np.float32))

    def config(self) -> dict[str, Any]:
        return {"type": "weighted", "categorical": self.categorical_column.config(),
                "weight_feature_key": self.weight_feature_key}


# -- dense views of categorical columns ------------------------------------------------------


class IndicatorColumn(DenseColumn):
    """Multi-hot (count per id, or weight for a weighted column) in the dense input."""

    def __init__(self, categorical_column: CategoricalColumn) -> None:
        if not isinstance(categorical_column, CategoricalColumn):
            raise ConfigError("indicator_column: needs a categorical column")
        self.categorical_column = categorical_column
        self.name = f"{categorical_column.name}_indicator"

    @property
    def input_keys(self) -> list[str]:
        return self.categorical_column.input_keys

    @property
    def dense_width(self) -> int:
        return self.categorical_column.num_buckets

    def dense(self, features: dict) -> np.ndarray:
        ids = self.categorical_column.ids(features)
        n = self.dense_width
        out = np.zeros(ids.batch_size * n, np.float32)
        flat = ids.row_of_value() * n + ids.values
        w = np.ones(len(flat), np.float32) if ids.weights is None else ids.weights
        np.add.at(out, flat, w)
        return out.reshape(ids.batch_size, n)

    def config(self) -> dict[str, Any]:
        return {"type": "indicator", "categorical": self.categorical_column.config()}


_COMBINERS = ("sum", "mean")


class EmbeddingColumn(FeatureColumn):
    """Dense vectors of a categorical column's ids, from an embedding table."""

    def __init__(self, categorical_column: CategoricalColumn, dimension: int,
                 combiner: str = "mean", initializer: Callable | None = None,
                 ckpt_to_load_from: str | None = None, tensor_name_in_ckpt: str | None = None,
                 max_norm: float | None = None, trainable: bool = True,
                 shared_name: str | None = None, **options: Any) -> None:
        if not isinstance(categorical_column, CategoricalColumn):
            raise ConfigError("embedding_column: needs a categorical column, got "
                              f"{type(categorical_column).__name__}")
        self.categorical_column = categorical_column
        self.dimension = int(dimension)
        if self.dimension < 1:
            raise ConfigError(f"embedding_column {categorical_column.name!r}: dimension must be "
                              f"positive, got {dimension}")
        if combiner not in _COMBINERS:
            raise ConfigError(
                f"embedding_column {categorical_column.name!r}: combiner {combiner!r} is not "
                f"supported (the trainer's tables pool by {' or '.join(_COMBINERS)})")
        if ckpt_to_load_from is not None or tensor_name_in_ckpt is not None:
            raise ConfigError(
                f"embedding_column {categorical_column.name!r}: ckpt_to_load_from / "
                "tensor_name_in_ckpt are not supported; use Estimator(warm_start_from=...)")
        if initializer is not None and not callable(initializer):
            raise ConfigError(f"embedding_column {categorical_column.name!r}: initializer must "
                              "be a callable(shape) returning an array")
        if max_norm is not None and float(max_norm) <= 0:
            raise ConfigError(f"embedding_column {categorical_column.name!r}: max_norm must be "
                              "positive")
        self.combiner = combiner
        self.initializer = initializer
        self.max_norm = None if max_norm is None else float(max_norm)
        self.trainable = bool(trainable)
        self.shared_name = shared_name
        self.options = dict(options)  # HybridBackend's per-column emb_* options
        suffix = "_shared_embedding" if shared_name else "_embedding"
        self.name = f"{categorical_column.name}{suffix}"

    @property
    def input_keys(self) -> list[str]:
        return self.categorical_column.input_keys

    @property
    def weighted(self) -> bool:
        return isinstance(self.categorical_column, WeightedCategoricalColumn)

    def config(self) -> dict[str, Any]:
        return {"type": "embedding", "categorical": self.categorical_column.config(),
                "dimension": self.dimension, "combiner": self.combiner}


# -- constructors (tf.feature_column's names) ------------------------------------------------


def numeric_column(key: str, shape: Sequence[int] | int = (1,), default_value: Any = None,
                   dtype: Any = np.float32, normalizer_fn: Callable | None = None
                   ) -> NumericColumn:
    return NumericColumn(key, shape, default_value, dtype, normalizer_fn)


def bucketized_column(source_column: Any, boundaries: Sequence[float]) -> BucketizedColumn:
    from tierserve.trainer.graph.tensors import FeatureTensor

    if isinstance(source_column, (str, FeatureTensor)):  # DLRover's example passes the tensor
        source_column = numeric_column(getattr(source_column, "key", source_column))
    return BucketizedColumn(source_column, boundaries)


def categorical_column_with_identity(key: str, num_buckets: int,
                                     default_value: int | None = None
                                     ) -> IdentityCategoricalColumn:
    return IdentityCategoricalColumn(key, num_buckets, default_value)


def categorical_column_with_vocabulary_list(key: str, vocabulary_list: Sequence[Any],
                                            dtype: Any = None, default_value: int = -1,
                                            num_oov_buckets: int = 0
                                            ) -> VocabularyListCategoricalColumn:
    return VocabularyListCategoricalColumn(key, vocabulary_list, dtype, default_value,
                                           num_oov_buckets)


def categorical_column_with_vocabulary_file(key: str, vocabulary_file: str,
                                            vocabulary_size: int | None = None,
                                            num_oov_buckets: int = 0,
                                            default_value: int | None = None, dtype: Any = str
                                            ) -> VocabularyListCategoricalColumn:
    """A vocabulary read from ``vocabulary_file`` (one value per line; the first
    ``vocabulary_size`` lines)."""
    path = os.fspath(vocabulary_file)
    try:
        with open(path, encoding="utf-8") as f:
            words = [line.rstrip("\r\n") for line in f]
    except OSError as exc:
        raise ConfigError(f"categorical_column_with_vocabulary_file {key!r}: cannot read "
                          f"vocabulary_file {path!r}: {exc.strerror or exc}") from None
    words = [w for w in words if w != ""]
    if vocabulary_size is not None:
        if int(vocabulary_size) > len(words):
            raise ConfigError(f"categorical_column_with_vocabulary_file {key!r}: "
                              f"vocabulary_size {vocabulary_size} but {path!r} has "
                              f"{len(words)} entries")
        words = words[: int(vocabulary_size)]
    vocab: Any = words
    if np.dtype(getattr(dtype, "as_numpy_dtype", dtype)).kind in "iu":
        vocab = [int(w) for w in words]
    return VocabularyListCategoricalColumn(key, vocab, dtype, default_value, num_oov_buckets,
                                           what="categorical_column_with_vocabulary_file")


def categorical_column_with_hash_bucket(key: str, hash_bucket_size: int, dtype: Any = str
                                        ) -> HashedCategoricalColumn:
    return HashedCategoricalColumn(key, hash_bucket_size, dtype)


def crossed_column(keys: Sequence[Any], hash_bucket_size: int, hash_key: int | None = None
                   ) -> CrossedColumn:
    return CrossedColumn(keys, hash_bucket_size, hash_key)


def weighted_categorical_column(categorical_column: CategoricalColumn, weight_feature_key: str,
                                dtype: Any = np.float32) -> WeightedCategoricalColumn:
    return WeightedCategoricalColumn(categorical_column, weight_feature_key, dtype)


def indicator_column(categorical_column: CategoricalColumn) -> IndicatorColumn:
    return IndicatorColumn(categorical_column)


def embedding_column(categorical_column: CategoricalColumn, dimension: int,
                     combiner: str = "mean", initializer: Callable | None = None,
                     ckpt_to_load_from: str | None = None,
                     tensor_name_in_ckpt: str | None = None, max_norm: float | None = None,
                     trainable: bool = True, **options: Any) -> EmbeddingColumn:
    return EmbeddingColumn(categorical_column, dimension, combiner, initializer,
                           ckpt_to_load_from, tensor_name_in_ckpt, max_norm, trainable,
                           **options)


def shared_embeddings(categorical_columns: Sequence[CategoricalColumn], dimension: int,
                      combiner: str = "mean", initializer: Callable | None = None,
                      shared_embedding_collection_name: str | None = None,
                      ckpt_to_load_from: str | None = None,
                      tensor_name_in_ckpt: str | None = None, max_norm: float | None = None,
                      trainable: bool = True) -> list[EmbeddingColumn]:
    """Embedding columns that share one table (one slot each); their categorical columns
    must have the same number of buckets."""
    cols = list(categorical_columns)
    if not cols:
        raise ConfigError("shared_embeddings: no categorical columns")
    sizes = {c.num_buckets for c in cols}
    if len(sizes) != 1:
        raise ConfigError("shared_embeddings: the categorical columns must have the same "
                          f"number of buckets, got {sorted(sizes)}")
    name = shared_embedding_collection_name or "_".join(sorted(c.name for c in cols)) + \
        "_shared_embedding"
    return [EmbeddingColumn(c, dimension, combiner, initializer, ckpt_to_load_from,
                            tensor_name_in_ckpt, max_norm, trainable, shared_name=name)
            for c in cols]


shared_embedding_columns = shared_embeddings


def make_parse_example_spec(feature_columns: Iterable[FeatureColumn]) -> dict[str, Any]:
    """The raw features ``feature_columns`` read, by key (their dtype as far as known)."""
    spec: dict[str, Any] = {}
    for col in feature_columns:
        for key in col.input_keys:
            spec.setdefault(key, getattr(col, "dtype", None))
    return spec


__all__ = [
    "BucketizedColumn", "CategoricalColumn", "CrossedColumn", "DenseColumn",
    "EmbeddingColumn", "FeatureColumn", "HashedCategoricalColumn", "IdentityCategoricalColumn",
    "Ids", "IndicatorColumn", "NumericColumn",
    "VocabularyListCategoricalColumn", "WeightedCategoricalColumn", "bucketized_column",
    "categorical_column_with_hash_bucket", "categorical_column_with_identity",
    "categorical_column_with_vocabulary_file", "categorical_column_with_vocabulary_list",
    "crossed_column", "embedding_column", "fingerprint", "indicator_column",
    "make_parse_example_spec", "numeric_column", "shared_embedding_columns",
    "shared_embeddings", "weighted_categorical_column",
]
