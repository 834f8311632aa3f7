"""HybridBackend's names (``import hybridbackend.tensorflow as hb``) over tierserve's
Estimator API: ``hb.estimator.Estimator`` (with ``train_and_evaluate(..., eval_every_n_iter)``),
``hb.wraps``, ``hb.function`` / ``hb.scope`` / ``hb.embedding_scope`` with embedding options,
``hb.keras.layers.DenseFeatures``, ``hb.dense_features``, ``hb.data.Dataset.from_parquet``
(:mod:`tierserve.trainer.data.tabular`), ``hb.metrics.auc`` / ``accuracy``, ``hb.context``
(rank, world size) and ``hb.enable_optimization`` (warns: nothing to rewrite here).

The embedding options, each by column (a dict from column name to value) or for all:

- ``emb_device``: ``'/cpu:*'`` keeps a table in host memory (the default); ``'/gpu:N'`` puts
  it on that GPU when cupy sees one (lookups come back to the host network), else warns once;
- ``emb_dtype``: the tables store float32; float32 is honoured, anything else refused;
- ``emb_unique``: accepted; the table's lookup deduplicates ids anyway (warns once that the
  hint changes nothing);
- ``emb_pad`` (True) and ``emb_segment_rank`` (non-zero) change output shapes in ways the
  trainer does not implement: refused;
- ``emb_num_groups``, ``emb_wire_dtype``, ``emb_buffer_size``, ``emb_backend`` and the
  ``HB_EMB_NUM_GROUPS`` / ``HB_EMB_WIRE_DTYPE`` / ``HB_EMB_BUFFER_SIZE`` environment
  variables configure the exchange of embeddings between workers; training here runs in one
  process, so a non-default value warns once by name.
"""

from __future__ import annotations

import contextlib
import functools
import types
from typing import Any

from tierserve.core.compat import warn_once
from tierserve.core.errors import ConfigError

from ..feature_column.options import (  # noqa: F401 - hb.scope and the option names
    OPTIONS,
    check_options,
    current_options,
    gpu_requested,
    resolve,
    scope,
)


def function(fn: Any = None, **options: Any):
    """Decorator: run ``fn`` (a ``model_fn``) with these embedding options
    (``@hb.function(emb_device='/cpu:0')``)."""
    check_options(options, "hb.function")

    def wrap(f):
        @functools.wraps(f)
        def inner(*args, **kwargs):
            with scope(**options):
                return f(*args, **kwargs)

        return inner

    return wrap(fn) if callable(fn) else wrap


def dense_features(features: dict, feature_columns: Any, **options: Any):
    """``hb.dense_features``: the dense tensor of ``feature_columns`` (one DenseFeatures)."""
    from ..feature_column import DenseFeatures

    return DenseFeatures(feature_columns, **options)(features)


def wraps(cls: Any = None, **_: Any):
    """``hb.wraps``: give an Estimator class (a subclass of this package's Estimator, or
    any class taking ``model_fn``) ``train_and_evaluate(train_spec, eval_spec,
    eval_every_n_iter=None)``; usable as ``@hb.wraps`` or ``hb.wraps(MyEstimator)(...)``."""
    from ..estimator import Estimator as _Estimator

    def wrap(c):
        if isinstance(c, type) and issubclass(c, _Estimator):
            return c
        if not isinstance(c, type):
            raise ConfigError(f"hb.wraps: expected an Estimator class, got {c!r}")
        return type(c.__name__, (c, _Estimator), {})

    return wrap(cls) if cls is not None else wrap


def _keras_namespace() -> types.SimpleNamespace:
    from ..feature_column import DenseFeatures

    return types.SimpleNamespace(layers=types.SimpleNamespace(DenseFeatures=DenseFeatures))


@contextlib.contextmanager
def embedding_scope(sharding: bool = True, **options: Any):
    """``hb.embedding_scope()``: embedding weights made inside are sharded across workers.
    Feature-column tables here are: under ``mpiexec -n N`` each id lives on one rank (model
    parallel), in one process on the one; ``sharding=False`` (replicated tables) is refused.
    ``options`` are the embedding options of :func:`scope`."""
    if not sharding:
        raise ConfigError("hb.embedding_scope(sharding=False): replicated embedding tables are "
                          "not supported; tables are sharded over the ranks")
    with scope(**options):
        yield


def enable_optimization(logging_level: Any = None, relocate_ops: bool = False) -> None:
    """``hb.enable_optimization``: HybridBackend rewrites TensorFlow's GPU operators
    (fusion, relocation); there is no TensorFlow graph here, and the trainer's layers are
    vectorised numpy / cupy already, so this warns once that it changes nothing."""
    warn_once("hb.enable_optimization", "HybridBackend's TensorFlow operator rewriting has "
              "nothing to rewrite here (the trainer's layers are vectorised already); "
              f"logging_level={logging_level!r}, relocate_ops={relocate_ops!r} change nothing",
              stacklevel=3)


def disable_optimization() -> None:
    """``hb.disable_optimization``: nothing to turn off (see :func:`enable_optimization`)."""


class _Context:
    """``hb.context``: this process's ``rank`` and the ``world_size`` (MPI ranks)."""

    @property
    def rank(self) -> int:
        from ..distributed.comm import launched_rank, launched_size

        return launched_rank() if launched_size() > 1 else 0

    @property
    def world_size(self) -> int:
        from ..distributed.comm import launched_size

        return launched_size()


context = _Context()


def auc(labels: Any, predictions: Any, weights: Any = None, num_thresholds: int = 200,
        metrics_collections: Any = None, updates_collections: Any = None, curve: str = "ROC",
        name: str | None = None, summation_method: str = "trapezoidal") -> Any:
    """``hb.metrics.auc``: the ROC AUC over every evaluated example of every rank (see
    :func:`tierserve.trainer.estimator.metrics.auc`)."""
    from ..estimator.metrics import auc as _auc

    return _auc(labels, predictions, weights=weights, num_thresholds=num_thresholds,
                metrics_collections=metrics_collections,
                updates_collections=updates_collections, curve=curve, name=name,
                summation_method=summation_method)


def _data_namespace() -> types.SimpleNamespace:
    from ..data import Dataset, make_one_shot_iterator
    from ..data.tabular import Field, from_parquet

    class HbDataset(Dataset):
        """``hb.data.Dataset``: ``tf.data.Dataset`` with ``from_parquet``."""

    HbDataset.from_parquet = staticmethod(from_parquet)  # type: ignore[attr-defined]
    return types.SimpleNamespace(Dataset=HbDataset,
                                 DataFrame=types.SimpleNamespace(Field=Field),
                                 make_one_shot_iterator=make_one_shot_iterator)


def __getattr__(name: str) -> Any:
    if name == "estimator":
        from .. import estimator

        return estimator
    if name == "keras":
        return _keras_namespace()
    if name == "feature_column":
        from .. import feature_column

        return feature_column
    if name == "data":
        return _data_namespace()
    if name == "metrics":
        from ..estimator.metrics import accuracy

        return types.SimpleNamespace(auc=auc, accuracy=accuracy)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["OPTIONS", "auc", "check_options", "context", "dense_features",
           "disable_optimization", "embedding_scope", "enable_optimization", "function",
           "resolve", "scope", "wraps"]
