"""Dense views of categorical columns: :class:`IndicatorColumn` (multi-hot in the dense
input) and :class:`EmbeddingColumn` (ids looked up in an embedding table and pooled)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from tierserve.core.errors import ConfigError

from .categorical import WeightedCategoricalColumn
from .column_base import CategoricalColumn, DenseColumn, FeatureColumn


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
