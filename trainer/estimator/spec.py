"""``ModeKeys`` and ``EstimatorSpec``: what a ``model_fn`` returns."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tierserve.core.errors import ConfigError


class ModeKeys:
    """The three modes a ``model_fn`` is called in (``tf.estimator.ModeKeys``)."""

    TRAIN = "train"
    EVAL = "eval"
    PREDICT = "infer"


@dataclass
class EstimatorSpec:
    """What ``model_fn`` returns for ``mode``: ``predictions`` (a tensor or a dict of
    tensors), ``loss``, ``train_op`` (TRAIN), ``eval_metric_ops`` (EVAL; name -> metric of
    :mod:`.metrics`), ``export_outputs`` (name -> :class:`~.export.PredictOutput` and
    friends; the first, or ``'serving_default'``, is what an export serves) and
    ``training_hooks`` / ``evaluation_hooks`` / ``prediction_hooks``."""

    mode: str
    predictions: Any = None
    loss: Any = None
    train_op: Any = None
    eval_metric_ops: dict[str, Any] | None = None
    export_outputs: dict[str, Any] | None = None
    training_chief_hooks: list = field(default_factory=list)
    training_hooks: list = field(default_factory=list)
    scaffold: Any = None
    evaluation_hooks: list = field(default_factory=list)
    prediction_hooks: list = field(default_factory=list)
    #: tierserve: per-key functions of the host prediction arrays (class ids, ...)
    derived_predictions: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.mode not in (ModeKeys.TRAIN, ModeKeys.EVAL, ModeKeys.PREDICT):
            raise ConfigError(f"EstimatorSpec: unknown mode {self.mode!r}")
        if self.mode == ModeKeys.TRAIN and (self.loss is None or self.train_op is None):
            raise ConfigError("EstimatorSpec in TRAIN mode needs loss and train_op")
        if self.mode == ModeKeys.EVAL and self.loss is None:
            raise ConfigError("EstimatorSpec in EVAL mode needs loss")
        if self.mode == ModeKeys.PREDICT and self.predictions is None:
            raise ConfigError("EstimatorSpec in PREDICT mode needs predictions")
