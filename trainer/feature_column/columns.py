"""The feature column constructors (``tf.feature_column``'s names), and their classes re-exported.

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
from typing import Any

import numpy as np

from tierserve.core.errors import ConfigError

from .categorical import (
    CrossedColumn,
    HashedCategoricalColumn,
    IdentityCategoricalColumn,
    VocabularyListCategoricalColumn,
    WeightedCategoricalColumn,
)
from .column_base import CategoricalColumn, DenseColumn, FeatureColumn
from .dense_views import EmbeddingColumn, IndicatorColumn
from .feature_values import Ids, fingerprint
from .numeric import BucketizedColumn, NumericColumn

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
