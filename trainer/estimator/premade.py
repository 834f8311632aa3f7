"""Pre-made estimators (as ``tf.estimator``'s canned ones, and DeepCTR's DeepFM), each an
:class:`~.estimator.Estimator` whose ``model_fn`` is built from the functional layer API.

Heads: a regressor predicts ``predictions`` (mean squared error); a binary classifier
``logits``, ``logistic``, ``probabilities``, ``class_ids``, ``classes`` (sigmoid cross
entropy; metrics accuracy, auc, precision, recall, label/mean, prediction/mean); a
multi-class one ``logits``, ``probabilities``, ``class_ids``, ``classes`` (softmax cross
entropy; accuracy).  ``weight_column`` weights each example's loss (training and evaluation;
serving does not read it).

Defaults are TensorFlow 2.15's ``tf.estimator`` (the V2 canned estimators of
``tensorflow_estimator/python/estimator/canned/``):

* optimizers by name are ``tf.keras.optimizers.legacy``'s (:mod:`.optimizers`); a DNN
  estimator's named optimizer keeps its own default learning rate (Adagrad, Adam, Ftrl 0.001,
  SGD 0.01: ``dnn.py`` calls ``get_optimizer_instance_v2(optimizer)``), a linear
  estimator's gets 0.2 (``linear.py`` ``_LEARNING_RATE``; ``optimizer=None`` gives Ftrl at
  ``min(0.2, 1/sqrt(#columns))``), a combined estimator's DNN part 0.001 and linear part
  ``min(0.005, 1/sqrt(#linear columns))`` (``dnn_linear_combined.py``
  ``_DNN_LEARNING_RATE``, ``_LINEAR_LEARNING_RATE``, ``_linear_learning_rate``);
* hidden and logits layers: Glorot-uniform kernels, zero biases; each hidden layer is
  ``activation(dense)`` then dropout (training only) then batch normalization
  (momentum 0.999), as ``_DNNModelV2.call``;
* the training loss is ``SUM_OVER_BATCH_SIZE`` (``loss_reduction=SUM`` also honoured):
  the per-example (weighted) losses summed and divided by the batch size.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from tierserve.core.compat import warn_once
from tierserve.core.errors import ConfigError, InvalidInputError
from tierserve.trainer.graph.tensors import Tensor, current_graph

from .. import feature_column as fc
from ..graph import layers as L
from ..graph import losses
from . import metrics
from .estimator import Estimator
from .fetches import check_labels
from .optimizers import Ftrl, get_optimizer, get_optimizer_v1, group
from .spec import EstimatorSpec, ModeKeys


def _activation(fn: Any) -> Callable:
    if fn is None:
        return L.relu
    if isinstance(fn, str):
        if fn not in L.ACTIVATIONS:
            raise ConfigError(f"activation_fn {fn!r}: one of {sorted(L.ACTIVATIONS)}")
        return L.ACTIVATIONS[fn]
    name = getattr(fn, "__name__", "")
    if fn in L.ACTIVATIONS.values():
        return fn
    if name in L.ACTIVATIONS:  # tf.nn.relu and friends, by name
        return L.ACTIVATIONS[name]
    raise ConfigError(f"activation_fn {fn!r}: use one of {sorted(L.ACTIVATIONS)} (or "
                      "the functions of tierserve.trainer.graph.layers)")


class Head:
    """Loss, predictions and metrics of a pre-made estimator (see the module docstring)."""

    def __init__(self, kind: str, n_classes: int = 2, label_dimension: int = 1,
                 weight_column: Any = None, label_vocabulary: Sequence[str] | None = None,
                 loss_reduction: Any = None) -> None:
        self.kind = kind
        self.loss_reduction = _loss_reduction(loss_reduction)
        self.n_classes = int(n_classes)
        if kind == "classification" and self.n_classes < 2:
            raise ConfigError(f"n_classes must be >= 2, got {n_classes}")
        self.label_dimension = int(label_dimension)
        if isinstance(weight_column, str):
            weight_column = fc.numeric_column(weight_column)
        self.weight_column = weight_column
        if label_vocabulary is not None:
            if kind != "classification":
                raise ConfigError("label_vocabulary is for classifiers")
            if len(label_vocabulary) != self.n_classes:
                raise ConfigError(f"label_vocabulary has {len(label_vocabulary)} entries for "
                                  f"n_classes={self.n_classes}")
        self.label_vocabulary = None if label_vocabulary is None else list(label_vocabulary)

    @property
    def logits_dimension(self) -> int:
        if self.kind == "regression":
            return self.label_dimension
        return 1 if self.n_classes == 2 else self.n_classes

    def prepare_labels(self, labels: Any) -> Any:
        """Raw labels as numbers the loss takes (class ids for a label_vocabulary), checked;
        errors name the label column."""
        value, name = labels, "labels"
        if isinstance(labels, dict) and len(labels) == 1:
            (name, value), = labels.items()
        if self.label_vocabulary is not None:
            arr = np.asarray(value).astype(str).reshape(-1)
            vocab = np.asarray(self.label_vocabulary)
            order = np.argsort(vocab)
            pos = np.clip(np.searchsorted(vocab[order], arr), 0, len(vocab) - 1)
            ok = vocab[order][pos] == arr
            if not ok.all():
                raise InvalidInputError(f"label {name!r}: {str(arr[~ok][0])!r} is not in the "
                                        f"label_vocabulary {self.label_vocabulary}")
            return order[pos].astype(np.float32).reshape(np.shape(value))
        arr, name = check_labels({name: value})
        if self.kind == "classification":
            flat = arr.reshape(-1)
            bad = (flat < 0) | (flat >= self.n_classes) | (flat != np.round(flat))
            if bad.any():
                raise InvalidInputError(
                    f"label {name!r}: {flat[bad][0].item()!r} is not a class id in [0, "
                    f"{self.n_classes}) (n_classes={self.n_classes})")
        return arr

    def _weights(self, features: dict, mode: str) -> Tensor | None:
        if self.weight_column is None or mode == ModeKeys.PREDICT:
            return None
        return fc.input_layer(features, [self.weight_column])

    def spec(self, features: dict, labels: Any, mode: str, logits: Tensor,
             train_op_fn: Callable[[Any], Any]) -> EstimatorSpec:
        g = current_graph("head")
        preds: dict[str, Any] = {}
        derived: dict[str, Callable] = {}
        vocab = self.label_vocabulary
        if self.kind == "regression":
            preds["predictions"] = logits
            served = logits
        elif self.n_classes == 2:
            p = L.sigmoid(logits, name="head/predictions/logistic")
            preds.update(logits=logits, logistic=p)
            derived["probabilities"] = lambda v: np.concatenate(
                [1 - v["logistic"], v["logistic"]], axis=1)
            derived["class_ids"] = lambda v: (v["logistic"] > 0.5).astype(np.int64)
            served = p
        else:
            p = L.softmax(logits, name="head/predictions/probabilities")
            preds.update(logits=logits, probabilities=p)
            derived["class_ids"] = lambda v: v["probabilities"].argmax(axis=1)[:, None]
            served = p
        if self.kind == "classification":
            if vocab is not None:
                derived["classes"] = lambda v: np.asarray(vocab, dtype=object)[
                    derived["class_ids"](v)]
            else:
                derived["classes"] = lambda v: np.char.encode(
                    derived["class_ids"](v).astype(str), "ascii")
        from .export import PredictOutput

        if mode == ModeKeys.PREDICT:
            spec = EstimatorSpec(mode, predictions=preds,
                                 export_outputs={"serving_default": PredictOutput(served)})
            spec.derived_predictions = derived
            return spec
        weights = self._weights(features, mode)
        how = (losses.Reduction.SUM if self.loss_reduction == "sum"
               else losses.Reduction.SUM_OVER_BATCH_SIZE)
        if self.kind == "regression":
            loss = losses.mean_squared_error(labels, logits, weights=weights, reduction=how)
        elif self.n_classes == 2:
            loss = losses.sigmoid_cross_entropy(labels, logits, weights=weights, reduction=how)
        else:
            loss = losses.sparse_softmax_cross_entropy(labels, logits, weights=weights,
                                                       reduction=how)
        ops: dict[str, Any] = {"label/mean": metrics.mean(labels),
                               "prediction/mean": metrics.mean(served)}
        if self.kind == "classification":
            ops["accuracy"] = metrics.accuracy(labels, served)
        if self.kind == "classification" and self.n_classes == 2:
            ops.update(auc=metrics.auc(labels, served),
                       precision=metrics.precision(labels, served),
                       recall=metrics.recall(labels, served))
        train_op = train_op_fn(loss) if mode == ModeKeys.TRAIN else None
        spec = EstimatorSpec(mode, predictions=preds, loss=loss, train_op=train_op,
                             eval_metric_ops=ops,
                             export_outputs={"serving_default": PredictOutput(served)})
        spec.derived_predictions = derived
        g.head = self  # type: ignore[attr-defined]
        return spec


def _dnn_logits(features, columns, hidden_units, units, activation_fn, dropout, batch_norm,
                mode) -> Tensor:
    """TensorFlow's ``_DNNModelV2``: per hidden layer ``activation(dense)``, dropout while
    training, batch normalization (momentum 0.999); then the logits layer."""
    g = current_graph("dnn")
    act = _activation(activation_fn)
    if not hidden_units:
        raise ConfigError("hidden_units must list at least one layer size")
    with g.scope("dnn"):
        with g.scope("input_from_feature_columns"):
            net = fc.input_layer(features, columns)
        for i, n in enumerate(hidden_units):
            net = act(L.dense(net, int(n), name=f"hiddenlayer_{i}"))
            if dropout:
                net = L.dropout(net, rate=float(dropout), training=mode == ModeKeys.TRAIN)
            if batch_norm:
                net = L.batch_normalization(net, momentum=0.999,
                                            training=mode == ModeKeys.TRAIN,
                                            name=f"hiddenlayer_{i}/batchnorm_{i}")
        return L.dense(net, units, name="logits")


def _linear_logits(features, columns, units, sparse_combiner) -> Tensor:
    g = current_graph("linear")
    with g.scope("linear"):
        return fc.linear_model(features, columns, units=units, sparse_combiner=sparse_combiner)


def _columns(cols: Any, what: str) -> list:
    if cols is None:
        return []
    return list(cols)


def _dnn_positional(args: tuple, kwargs: dict) -> tuple:
    """Positional arguments in TensorFlow's order (hidden_units, feature_columns, model_dir),
    except that a first positional list of feature columns with hidden_units given by
    keyword (the course notes' ``DNNRegressor(featcols, hidden_units=[3, 2])``) is the
    feature_columns."""
    args = list(args)
    if args and "hidden_units" in kwargs and any(
            isinstance(c, fc.FeatureColumn) for c in args[0]):
        kwargs["feature_columns"] = args.pop(0)
        return tuple(args)
    return tuple(args)


def _dnn_args(hidden_units: Any, feature_columns: Any) -> tuple[Any, Any]:
    """TensorFlow's order is (hidden_units, feature_columns); code that passes the columns
    first with hidden_units by keyword (the course notes do) works too."""
    if feature_columns is None and hidden_units is not None and any(
            isinstance(c, fc.FeatureColumn) for c in hidden_units):
        raise ConfigError("DNN estimator: hidden_units is missing")
    if hidden_units is None or feature_columns is None:
        raise ConfigError("DNN estimator: give hidden_units and feature_columns")
    if any(isinstance(c, fc.FeatureColumn) for c in hidden_units):
        hidden_units, feature_columns = feature_columns, hidden_units
    return hidden_units, feature_columns


#: ``linear.py`` ``_LEARNING_RATE``: a linear estimator's named optimizer's learning rate.
LINEAR_LEARNING_RATE = 0.2
#: ``dnn_linear_combined.py`` ``_DNN_LEARNING_RATE`` / ``_LINEAR_LEARNING_RATE``.
COMBINED_DNN_LEARNING_RATE = 0.001
COMBINED_LINEAR_LEARNING_RATE = 0.005


def _inverse_sqrt(columns: list) -> float:
    return 1.0 / math.sqrt(max(len(columns), 1))


def _linear_optimizer(optimizer: Any, columns: list, what: str):
    """``_linear_model_fn_v2``: a given optimizer (a name at learning rate 0.2); none: Ftrl at
    ``min(0.2, 1/sqrt(#columns))`` (``_get_default_optimizer_v2``)."""
    if not optimizer:
        return Ftrl(learning_rate=min(LINEAR_LEARNING_RATE, _inverse_sqrt(columns)))
    return get_optimizer(optimizer, LINEAR_LEARNING_RATE, what)


def _combined_optimizers(linear_optimizer: Any, dnn_optimizer: Any, linear_columns: list):
    """``_dnn_linear_combined_model_fn_v2``'s two optimizers."""
    lr = min(COMBINED_LINEAR_LEARNING_RATE, _inverse_sqrt(linear_columns))
    return (get_optimizer(linear_optimizer, lr, "linear_optimizer"),
            get_optimizer(dnn_optimizer, COMBINED_DNN_LEARNING_RATE, "dnn_optimizer"))


def _loss_reduction(value: Any) -> str:
    """``'mean'`` (``SUM_OVER_BATCH_SIZE``, the V2 estimators' default; ``AUTO``) or
    ``'sum'`` (``SUM``, the V1 estimators')."""
    if value is None:
        return "mean"
    name = str(getattr(value, "value", getattr(value, "name", value))).lower()
    how = losses.reduction_of(value, "loss_reduction") if name != "none" else None
    if how not in ("mean", "sum"):
        raise ConfigError(f"loss_reduction {value!r} is not supported: SUM_OVER_BATCH_SIZE "
                          "(the default) or SUM")
    return how


class _Canned(Estimator):
    head: Head

    def _prepare_labels(self, labels: Any) -> Any:
        return self.head.prepare_labels(labels)

    def _dnn(self, hidden_units, feature_columns, optimizer, activation_fn, dropout, batch_norm,
             model_dir, config, warm_start_from) -> None:
        """Build a DNN over ``self.head`` (the two DNN estimators' one body)."""
        hidden_units, feature_columns = _dnn_args(hidden_units, feature_columns)
        cols = _columns(feature_columns, "feature_columns")
        opt = get_optimizer(optimizer, None, f"{type(self).__name__} optimizer")
        hidden = list(hidden_units)

        def model_fn(features, labels, mode, config):
            logits = _dnn_logits(features, cols, hidden, self.head.logits_dimension,
                                 activation_fn, dropout, batch_norm, mode)
            return self.head.spec(features, labels, mode, logits,
                                  lambda loss: opt.minimize(loss, var_list=["dnn/"]))

        Estimator.__init__(self, model_fn, model_dir, config, warm_start_from=warm_start_from)

    def _linear(self, feature_columns, optimizer, model_dir, config, warm_start_from,
                sparse_combiner: str) -> None:
        """Build a linear model over ``self.head`` (the two linear estimators' one body)."""
        cols = _columns(feature_columns, "feature_columns")
        opt = _linear_optimizer(optimizer, cols, f"{type(self).__name__} optimizer")

        def model_fn(features, labels, mode, config):
            logits = _linear_logits(features, cols, self.head.logits_dimension, sparse_combiner)
            return self.head.spec(features, labels, mode, logits,
                                  lambda loss: opt.minimize(loss, var_list=["linear/"]))

        Estimator.__init__(self, model_fn, model_dir, config, warm_start_from=warm_start_from)


class LinearRegressor(_Canned):
    def __init__(self, feature_columns, model_dir=None, label_dimension: int = 1,
                 weight_column=None, optimizer: Any = "Ftrl", config=None,
                 warm_start_from=None, loss_reduction: Any = None,
                 sparse_combiner: str = "sum") -> None:
        self.head = Head("regression", label_dimension=label_dimension,
                         weight_column=weight_column, loss_reduction=loss_reduction)
        self._linear(feature_columns, optimizer, model_dir, config, warm_start_from,
                     sparse_combiner)


class LinearClassifier(_Canned):
    def __init__(self, feature_columns, model_dir=None, n_classes: int = 2, weight_column=None,
                 label_vocabulary=None, optimizer: Any = "Ftrl", config=None,
                 warm_start_from=None, loss_reduction: Any = None,
                 sparse_combiner: str = "sum") -> None:
        self.head = Head("classification", n_classes=n_classes, weight_column=weight_column,
                         label_vocabulary=label_vocabulary, loss_reduction=loss_reduction)
        self._linear(feature_columns, optimizer, model_dir, config, warm_start_from,
                     sparse_combiner)


class DNNRegressor(_Canned):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._setup(*_dnn_positional(args, kwargs), **kwargs)

    def _setup(self, hidden_units=None, feature_columns=None, model_dir=None,
               label_dimension: int = 1, weight_column=None, optimizer: Any = "Adagrad",
               activation_fn: Any = None, dropout: float | None = None, config=None,
               warm_start_from=None, loss_reduction: Any = None,
               batch_norm: bool = False) -> None:
        self.head = Head("regression", label_dimension=label_dimension,
                         weight_column=weight_column, loss_reduction=loss_reduction)
        self._dnn(hidden_units, feature_columns, optimizer, activation_fn, dropout, batch_norm,
                  model_dir, config, warm_start_from)


class DNNClassifier(_Canned):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._setup(*_dnn_positional(args, kwargs), **kwargs)

    def _setup(self, hidden_units=None, feature_columns=None, model_dir=None, n_classes: int = 2,
                 weight_column=None, label_vocabulary=None, optimizer: Any = "Adagrad",
                 activation_fn: Any = None, dropout: float | None = None, config=None,
                 warm_start_from=None, loss_reduction: Any = None,
                 batch_norm: bool = False) -> None:
        self.head = Head("classification", n_classes=n_classes, weight_column=weight_column,
                         label_vocabulary=label_vocabulary, loss_reduction=loss_reduction)
        self._dnn(hidden_units, feature_columns, optimizer, activation_fn, dropout, batch_norm,
                  model_dir, config, warm_start_from)


def _combined_fn(head: Head, linear_cols, dnn_cols, hidden, linear_opt, dnn_opt, activation_fn,
                 dropout, batch_norm, sparse_combiner):
    if not linear_cols and not dnn_cols:
        raise ConfigError("linear_feature_columns and dnn_feature_columns are both empty")

    def model_fn(features, labels, mode, config):
        parts, ops = [], []
        units = head.logits_dimension
        if dnn_cols:
            parts.append(_dnn_logits(features, dnn_cols, hidden, units, activation_fn,
                                     dropout, batch_norm, mode))
        if linear_cols:
            parts.append(_linear_logits(features, linear_cols, units, sparse_combiner))
        logits = parts[0] if len(parts) == 1 else L.add(parts, name="add_logits")

        def train_op_fn(loss):
            if dnn_cols:
                ops.append(dnn_opt.minimize(loss, var_list=["dnn/"]))
            if linear_cols:
                ops.append(linear_opt.minimize(loss, var_list=["linear/"]))
            return group(*ops)

        return head.spec(features, labels, mode, logits, train_op_fn)

    return model_fn


class DNNLinearCombinedRegressor(_Canned):
    def __init__(self, model_dir=None, linear_feature_columns=None,
                 linear_optimizer: Any = "Ftrl", dnn_feature_columns=None,
                 dnn_optimizer: Any = "Adagrad", dnn_hidden_units=None,
                 dnn_activation_fn: Any = None, dnn_dropout: float | None = None,
                 label_dimension: int = 1, weight_column=None, config=None,
                 warm_start_from=None, loss_reduction: Any = None, batch_norm: bool = False,
                 linear_sparse_combiner: str = "sum") -> None:
        self.head = Head("regression", label_dimension=label_dimension,
                         weight_column=weight_column, loss_reduction=loss_reduction)
        lin, dnn = _columns(linear_feature_columns, "l"), _columns(dnn_feature_columns, "d")
        if dnn and not dnn_hidden_units:
            raise ConfigError("dnn_hidden_units must be given with dnn_feature_columns")
        fn = _combined_fn(self.head, lin, dnn, list(dnn_hidden_units or []),
                          *_combined_optimizers(linear_optimizer, dnn_optimizer, lin),
                          dnn_activation_fn, dnn_dropout, batch_norm, linear_sparse_combiner)
        super().__init__(fn, model_dir, config, warm_start_from=warm_start_from)


class DNNLinearCombinedClassifier(_Canned):
    def __init__(self, model_dir=None, linear_feature_columns=None,
                 linear_optimizer: Any = "Ftrl", dnn_feature_columns=None,
                 dnn_optimizer: Any = "Adagrad", dnn_hidden_units=None,
                 dnn_activation_fn: Any = None, dnn_dropout: float | None = None,
                 n_classes: int = 2, weight_column=None, label_vocabulary=None, config=None,
                 warm_start_from=None, loss_reduction: Any = None, batch_norm: bool = False,
                 linear_sparse_combiner: str = "sum") -> None:
        self.head = Head("classification", n_classes=n_classes, weight_column=weight_column,
                         label_vocabulary=label_vocabulary, loss_reduction=loss_reduction)
        lin, dnn = _columns(linear_feature_columns, "l"), _columns(dnn_feature_columns, "d")
        if dnn and not dnn_hidden_units:
            raise ConfigError("dnn_hidden_units must be given with dnn_feature_columns")
        fn = _combined_fn(self.head, lin, dnn, list(dnn_hidden_units or []),
                          *_combined_optimizers(linear_optimizer, dnn_optimizer, lin),
                          dnn_activation_fn, dnn_dropout, batch_norm, linear_sparse_combiner)
        super().__init__(fn, model_dir, config, warm_start_from=warm_start_from)


def _deepctr_dnn(net: Tensor, hidden_units, activation_fn, dropout, use_bn, mode) -> Tensor:
    """DeepCTR's ``DNN`` layer and logit: per layer ``dense`` (Glorot-normal kernel, zero
    bias), batch normalization (keras' momentum 0.99) before the activation, dropout after it
    (training only); the logit a bias-free ``Dense(1)``."""
    act = _activation(activation_fn)
    for i, n in enumerate(hidden_units):
        net = L.dense(net, int(n), kernel_initializer="glorot_normal", name=f"dnn_{i}")
        if use_bn:
            net = L.batch_normalization(net, momentum=0.99, training=mode == ModeKeys.TRAIN,
                                        name=f"dnn_{i}/batch_normalization")
        net = act(net)
        if dropout:
            net = L.dropout(net, rate=float(dropout), training=mode == ModeKeys.TRAIN)
    return L.dense(net, 1, use_bias=False, kernel_initializer="glorot_normal", name="logits")


class DeepFMEstimator(_Canned):
    """DeepCTR's ``DeepFMEstimator`` (``deepctr/estimator/models/deepfm.py``): linear part +
    second-order FM over the embedding columns of ``dnn_feature_columns`` (all of one
    dimension) + a DNN over the embeddings then the other columns, summed into one logit;
    ``task`` ``'binary'`` or ``'regression'``.  As DeepCTR: the loss is summed over the batch
    (``Reduction.SUM``), optimizers by name are ``tf.compat.v1.train``'s at learning rate 0.005
    (linear) and 0.01 (DNN) (``deepctr_model_fn``).  ``_model_fn(features, labels, mode,
    config)`` is the model function (DLRover's adaptor pattern calls it).  The L2
    regularisation settings are not applied (warned once when non-zero)."""

    def __init__(self, linear_feature_columns, dnn_feature_columns,
                 dnn_hidden_units=(256, 128, 64), l2_reg_linear: float = 1e-5,
                 l2_reg_embedding: float = 1e-5, l2_reg_dnn: float = 0, seed: int = 1024,
                 dnn_dropout: float = 0, dnn_activation: Any = "relu",
                 dnn_use_bn: bool = False, task: str = "binary", model_dir=None, config=None,
                 linear_optimizer: Any = "Ftrl", dnn_optimizer: Any = "Adagrad",
                 training_chief_hooks: Any = None) -> None:
        if task not in ("binary", "regression"):
            raise ConfigError(f"DeepFMEstimator: task must be 'binary' or 'regression', "
                              f"got {task!r}")
        for name, value in (("l2_reg_linear", l2_reg_linear),
                            ("l2_reg_embedding", l2_reg_embedding), ("l2_reg_dnn", l2_reg_dnn)):
            if value:
                warn_once(f"DeepFMEstimator.{name}", "L2 regularisation is not applied")
        self.head = Head("classification" if task == "binary" else "regression",
                         loss_reduction="sum")
        lin = list(linear_feature_columns)
        dnn = list(dnn_feature_columns)
        linear_opt = get_optimizer_v1(linear_optimizer, 0.005, "linear_optimizer")
        dnn_opt = get_optimizer_v1(dnn_optimizer, 0.01, "dnn_optimizer")
        hidden = list(dnn_hidden_units)

        def model_fn(features, labels, mode, config=None):
            g = current_graph("DeepFM")
            cols = [c for c in dnn if not isinstance(c, fc.EmbeddingColumn)]
            embs = [c for c in dnn if isinstance(c, fc.EmbeddingColumn)]
            parts = []
            if lin:
                parts.append(_linear_logits(features, lin, 1, "sum"))
            with g.scope("dnn"):
                inputs = []
                if embs:
                    dims = {c.dimension for c in embs}
                    if len(dims) != 1:
                        raise ConfigError(f"DeepFM: the embedding columns must share one "
                                          f"dimension, got {sorted(dims)}")
                    dim = dims.pop()
                    emb = fc.input_layer(features, embs)
                    inputs.append(emb)
                    fm = L._unary("FmOrder2", emb, "fm", {"out_dim": dim})
                    g.shapes[fm.name] = (dim,)
                    fm = Tensor(g, fm.name, (dim,))
                    parts.append(L.reduce_sum(fm, axis=1, name="fm_sum"))
                if cols:
                    inputs.append(fc.input_layer(features, cols))
                if inputs:
                    net = inputs[0] if len(inputs) == 1 else L.concat(inputs, name="dnn_input")
                    parts.append(_deepctr_dnn(net, hidden, dnn_activation, dnn_dropout,
                                              dnn_use_bn, mode))
            logits = parts[0] if len(parts) == 1 else L.add(parts, name="deepfm_logits")

            def train_op_fn(loss):
                ops = [dnn_opt.minimize(loss, var_list=["dnn/"])]
                if lin:
                    ops.append(linear_opt.minimize(loss, var_list=["linear/"]))
                return group(*ops)

            return self.head.spec(features, labels, mode, logits, train_op_fn)

        chief_hooks = list(training_chief_hooks or [])

        def with_hooks(features, labels, mode, config=None):
            spec = model_fn(features, labels, mode, config)
            spec.training_chief_hooks = [*spec.training_chief_hooks, *chief_hooks]
            return spec

        self._model_fn = with_hooks
        cfg = config
        if cfg is not None and not hasattr(cfg, "replace"):
            cfg = None  # DLRover passes its run config positionally to _model_fn instead
        if cfg is None:
            from .run_config import RunConfig

            cfg = RunConfig(tf_random_seed=seed)  # DeepCTR's seed: the initial weights
        super().__init__(with_hooks, model_dir, cfg)


__all__ = [
    "DNNClassifier", "DNNLinearCombinedClassifier", "DNNLinearCombinedRegressor",
    "DNNRegressor", "DeepFMEstimator", "Head", "LinearClassifier", "LinearRegressor",
]
