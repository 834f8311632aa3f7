"""The feature columns' base classes: :class:`FeatureColumn`, :class:`DenseColumn` (values
in the dense input) and :class:`CategoricalColumn` (ids)."""

from __future__ import annotations

from typing import Any

import numpy as np

from .feature_values import Ids


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
