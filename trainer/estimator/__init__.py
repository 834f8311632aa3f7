"""The Estimator API (as ``tf.estimator``) on tierserve's own trainer, no TensorFlow.

``from tierserve.trainer import estimator, feature_column`` reads like TensorFlow 1.x code:
``estimator.Estimator(model_fn, model_dir, config=estimator.RunConfig(...))``,
``estimator.EstimatorSpec``, ``estimator.ModeKeys``, the pre-made ``LinearRegressor`` ...
``DNNLinearCombinedClassifier``, ``train_and_evaluate`` with ``TrainSpec`` / ``EvalSpec``,
session hooks, ``export`` (serving input receivers and exporters); ``layers``, ``losses``,
``metrics`` and ``train`` hold the functional API a ``model_fn`` body is written in
(``tf.layers``, ``tf.losses``, ``tf.metrics``, ``tf.train``).  ``inputs`` holds
``numpy_input_fn`` / ``pandas_input_fn``.

Every layer is the trainer's own (:mod:`tierserve.model.layers`), run forward and backward
by :class:`~tierserve.model.network.DenseNetwork`; embedding columns are the trainer's
embedding tables; an export is a model-repository version the server loads as it is.
"""

from typing import Any

from ..graph import layers, losses  # estimator.layers, estimator.losses (tf.layers, tf.losses)
from . import (
    export,
    hooks,
    layer_types,  # noqa: F401 - registers Tanh, MeanSquaredErrorLoss, ...
    metrics,
)
from . import optimizers as train
from .estimator import Estimator, WarmStartSettings
from .hooks import (
    CheckpointSaverHook,
    CheckpointSaverListener,
    FinalOpsHook,
    LoggingTensorHook,
    SessionRunArgs,
    SessionRunContext,
    SessionRunHook,
    SessionRunValues,
    StopAtStepHook,
)
from .online import UpdatePublisherHook
from .premade import (
    DeepFMEstimator,
    DNNClassifier,
    DNNLinearCombinedClassifier,
    DNNLinearCombinedRegressor,
    DNNRegressor,
    LinearClassifier,
    LinearRegressor,
)
from .run_config import RunConfig
from .spec import EstimatorSpec, ModeKeys
from .training import EvalSpec, TrainSpec, train_and_evaluate
from .variables import StructureError

nn = layers  # tf.nn.relu & co.


def __getattr__(name: str) -> Any:
    if name == "inputs":  # numpy_input_fn / pandas_input_fn (pandas imported on use)
        import importlib

        return importlib.import_module(".inputs", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "CheckpointSaverHook", "CheckpointSaverListener", "DNNClassifier",
    "DNNLinearCombinedClassifier", "DNNLinearCombinedRegressor", "DNNRegressor",
    "DeepFMEstimator", "Estimator", "EstimatorSpec", "EvalSpec", "FinalOpsHook",
    "LinearClassifier", "LinearRegressor", "LoggingTensorHook", "ModeKeys", "RunConfig",
    "SessionRunArgs", "SessionRunContext", "SessionRunHook", "SessionRunValues",
    "StopAtStepHook", "StructureError", "TrainSpec", "UpdatePublisherHook", "WarmStartSettings",
    "export", "hooks",
    "layers", "losses", "metrics", "nn", "train", "train_and_evaluate",
]
