"""The categorical columns: identity, vocabulary (list or file; binary search), hashed
(``Fingerprint64 % buckets``), crossed (``FingerprintCat64`` chains from the hash key) and
weighted, each turning a batch's raw values into :class:`~.feature_values.Ids`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from tierserve.core.errors import ConfigError, InvalidInputError

from .column_base import CategoricalColumn
from .feature_values import Ids, _feature, raw_values
from .hashing import DEFAULT_HASH_KEY, cross_feature, fingerprint64, fingerprint_cat64


class _OneFeatureColumn(CategoricalColumn):
    """A categorical column of the ids of one raw feature, ``key``."""

    key: str

    @property
    def input_keys(self) -> list[str]:
        return [self.key]

    def _raw_values(self, features: dict) -> tuple[np.ndarray, np.ndarray | None, int]:
        """The feature's values, row offsets and batch size (:func:`.raw_values`)."""
        return raw_values(self.name, self.key, _feature(features, self.key, self.name))


class IdentityCategoricalColumn(_OneFeatureColumn):
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

    def ids(self, features: dict) -> Ids:
        values, offsets, b = self._raw_values(features)
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


class VocabularyListCategoricalColumn(_OneFeatureColumn):
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

    def _lookup(self, features: dict) -> Ids:
        """Ids with TensorFlow's default_value (-1 by default) for values out of vocabulary
        when there are no OOV buckets."""
        values, offsets, b = self._raw_values(features)
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


class HashedCategoricalColumn(_OneFeatureColumn):
    def __init__(self, key: str, hash_bucket_size: int, dtype: Any = str) -> None:
        self.key = self.name = str(key)
        self.num_buckets = int(hash_bucket_size)
        if self.num_buckets < 1:
            raise ConfigError(f"categorical_column_with_hash_bucket {key!r}: hash_bucket_size "
                              f"must be positive, got {hash_bucket_size}")

    def ids(self, features: dict) -> Ids:
        values, offsets, b = self._raw_values(features)
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
            if not isinstance(k, (str, CategoricalColumn)):  # embedding, indicator columns
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
