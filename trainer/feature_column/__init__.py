"""Feature columns (as ``tf.feature_column``): how raw features become a model's input.

Numeric, bucketized and indicator columns fill the dense input (the server's ``DES``);
categorical columns turn raw values into TensorFlow's ids, vectorised (vocabulary lookup by
binary search, FarmHash ``Fingerprint64`` hashing in numba, float32 bucketing); embedding
columns look those ids up in the trainer's embedding tables, so an exported model's tables
go into the parameter server like any other model's.  See :mod:`.columns` for the columns
and :mod:`.layers` for ``DenseFeatures``, ``input_layer`` and ``linear_model``.
"""

from ..graph.tensors import FeatureTensor, Tensor, register_feature_conversion
from .columns import (
    BucketizedColumn,
    CategoricalColumn,
    CrossedColumn,
    DenseColumn,
    EmbeddingColumn,
    FeatureColumn,
    HashedCategoricalColumn,
    IdentityCategoricalColumn,
    Ids,
    IndicatorColumn,
    NumericColumn,
    VocabularyListCategoricalColumn,
    WeightedCategoricalColumn,
    bucketized_column,
    categorical_column_with_hash_bucket,
    categorical_column_with_identity,
    categorical_column_with_vocabulary_file,
    categorical_column_with_vocabulary_list,
    crossed_column,
    embedding_column,
    fingerprint,
    indicator_column,
    make_parse_example_spec,
    numeric_column,
    shared_embedding_columns,
    shared_embeddings,
    weighted_categorical_column,
)
from .layers import DenseFeatures, LinearModel, input_layer, linear_model


def _numeric_input(feature: FeatureTensor) -> Tensor:
    """A raw feature used as a tensor in a ``model_fn``: a numeric column of its shape."""
    shape = () if feature.sample is None else tuple(feature.sample.shape[1:])
    return input_layer({feature.key: feature}, [numeric_column(feature.key, shape=shape or (1,))])


register_feature_conversion(_numeric_input)

__all__ = [
    "BucketizedColumn", "CategoricalColumn", "CrossedColumn", "DenseColumn", "DenseFeatures",
    "EmbeddingColumn", "FeatureColumn", "HashedCategoricalColumn", "IdentityCategoricalColumn",
    "Ids", "IndicatorColumn", "LinearModel", "NumericColumn",
    "VocabularyListCategoricalColumn", "WeightedCategoricalColumn", "bucketized_column",
    "categorical_column_with_hash_bucket", "categorical_column_with_identity",
    "categorical_column_with_vocabulary_file", "categorical_column_with_vocabulary_list",
    "crossed_column", "embedding_column", "fingerprint", "indicator_column", "input_layer",
    "linear_model", "make_parse_example_spec", "numeric_column", "shared_embedding_columns",
    "shared_embeddings", "weighted_categorical_column",
]
