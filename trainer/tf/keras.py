"""``tf.keras``: refused by name (tierserve's trainer runs ``model_fn`` graphs, not Keras),
except ``tf.keras.layers.DenseFeatures``, the feature-column layer.  Importing anything else
from here (``from tierserve.trainer.tf.keras import backend``) raises the reason and what to
use instead."""

from __future__ import annotations

from typing import Any

from ..feature_column import DenseFeatures
from ._namespace import Namespace, RefusedError
from .refusals import KERAS, KERAS_INSTEAD

_UTILS = "tf.keras.utils (get_file downloads, ...) is not supported; use a local file path"


class _Layers(Namespace):
    """``tf.keras.layers``: DenseFeatures; every other layer refused as Keras."""

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        if attr == "DenseFeatures":
            return DenseFeatures
        raise RefusedError(f"tf.keras.layers.{attr}: {KERAS}; use {KERAS_INSTEAD}")


layers = _Layers("tf.keras.layers", {"DenseFeatures": DenseFeatures})


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    if name == "utils":
        raise RefusedError(_UTILS)
    raise RefusedError(f"tf.keras.{name}: {KERAS}; use {KERAS_INSTEAD}")


__all__ = ["layers"]
