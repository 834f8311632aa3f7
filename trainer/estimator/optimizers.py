"""Optimizers for ``model_fn`` bodies and pre-made estimators, with TensorFlow's update rules
and defaults, over the trainer's optimizers (:mod:`tierserve.trainer.optimizers`):
``opt.minimize(loss)`` returns the ``train_op`` an :class:`~.spec.EstimatorSpec` takes.

Two families, as TensorFlow 2.15 has them:

* ``tf.compat.v1.train``'s: :class:`GradientDescentOptimizer`, :class:`AdamOptimizer`
  (epsilon 1e-8), :class:`AdagradOptimizer` (initial accumulator 0.1, no epsilon),
  :class:`FtrlOptimizer` (initial accumulator 0.1), :class:`MomentumOptimizer`;
* ``tf.keras.optimizers.legacy``'s, which the canned estimators build from a name
  (``tensorflow_estimator/python/estimator/canned/optimizers.py``, ``_OPTIMIZER_CLS_NAMES_V2``):
  :class:`Adagrad` (lr 0.001, initial accumulator 0.1, epsilon 1e-7), :class:`Adam` (lr 0.001,
  epsilon 1e-7), :class:`Ftrl` (lr 0.001, initial accumulator 0.1), :class:`SGD` (lr 0.01).

Embedding tables are updated as TensorFlow updates an embedding variable from its sparse
gradient: Adam decays the moments of, and moves, every row the table holds (its sparse apply
assigns ``m * beta1`` to the whole slot: ``Update_t.Global``); Adagrad, Ftrl, SGD and
momentum touch only the rows a batch looked up (``Update_t.Local``).  Ftrl's
``l2_regularization_strength`` enters the kernel doubled (``training_ops.cc``: ``2 * l2``),
``beta`` as ``beta / lr``.  RMSProp is not implemented (refused by name).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tierserve.core.errors import ConfigError

from ..optimizers import CreateOptimizer, Optimizer_t, OptParamsPy, Update_t, make_optimizer


class Optimizer:
    """An optimizer of the trainer with its learning rate (a number, or a function of the
    global step)."""

    kind: Optimizer_t = Optimizer_t.SGD
    #: How its embedding tables are updated (TensorFlow's sparse apply of this optimizer).
    table_update: Update_t = Update_t.Local

    def __init__(self, learning_rate: float | Callable[[int], float] = 0.01,
                 **hyper: Any) -> None:
        if not callable(learning_rate) and float(learning_rate) <= 0:
            raise ConfigError(f"{type(self).__name__}: learning_rate must be positive, got "
                              f"{learning_rate}")
        self.learning_rate = learning_rate
        self.hyper = hyper

    def lr(self, step: int) -> float:
        lr = self.learning_rate
        return float(lr(step) if callable(lr) else lr)

    @property
    def impl(self):
        """The trainer's optimizer object (dense update rule and state layout)."""
        if getattr(self, "_impl", None) is None:
            self._impl = make_optimizer(self.params())
        return self._impl

    def params(self, for_table: bool = False) -> OptParamsPy:
        update = self.table_update if for_table else Update_t.Global
        return CreateOptimizer(self.kind, update, **self.hyper)

    def minimize(self, loss: Any, global_step: Any = None, var_list: Any = None,
                 name: str | None = None) -> TrainOp:
        """The train op that updates ``var_list`` (variable names, or a name prefix such as
        ``'dnn/'``; default every variable) to lower ``loss``."""
        from tierserve.trainer.graph.losses import Loss

        if not isinstance(loss, Loss):
            raise ConfigError("minimize: loss must be a loss made by the losses module "
                              "(sigmoid_cross_entropy, mean_squared_error, ...)")
        if isinstance(var_list, str):
            var_list = [var_list]
        return TrainOp(self, loss, None if var_list is None else list(var_list))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(learning_rate={self.learning_rate!r})"


def _refuse(what: str, **settings: Any) -> None:
    """Refuse, by name, settings whose non-default values are not implemented."""
    for name, (value, default) in settings.items():
        if value != default:
            raise ConfigError(f"{what}: {name}={value!r} is not supported (only {default!r})")


# -- tf.compat.v1.train --------------------------------------------------------------------


class GradientDescentOptimizer(Optimizer):
    kind = Optimizer_t.SGD

    def __init__(self, learning_rate=0.01, use_locking: bool = False,
                 name: str = "GradientDescent") -> None:
        super().__init__(learning_rate)


class AdamOptimizer(Optimizer):
    """``tf.compat.v1.train.AdamOptimizer`` (epsilon 1e-8)."""

    kind = Optimizer_t.Adam
    table_update = Update_t.Global

    def __init__(self, learning_rate=0.001, beta1: float = 0.9, beta2: float = 0.999,
                 epsilon: float = 1e-8, use_locking: bool = False, name: str = "Adam") -> None:
        super().__init__(learning_rate, beta1=beta1, beta2=beta2, epsilon=epsilon)


class AdagradOptimizer(Optimizer):
    """``tf.compat.v1.train.AdagradOptimizer``: ``w -= lr * g / sqrt(accum)`` with no
    epsilon (an initial accumulator of 0, which TensorFlow refuses, gets keras' 1e-7)."""

    kind = Optimizer_t.AdaGrad

    def __init__(self, learning_rate=0.05, initial_accumulator_value: float = 0.1,
                 use_locking: bool = False, name: str = "Adagrad") -> None:
        if initial_accumulator_value < 0:
            raise ConfigError(f"AdagradOptimizer: initial_accumulator_value must not be "
                              f"negative, got {initial_accumulator_value}")
        super().__init__(learning_rate, initial_accu_value=initial_accumulator_value,
                         epsilon=0.0 if initial_accumulator_value > 0 else 1e-7)


def _ftrl_hyper(what: str, learning_rate: Any, learning_rate_power: float,
                initial_accumulator_value: float, l1: float, l2: float, l2_shrinkage: float,
                beta: float | None) -> dict[str, Any]:
    _refuse(what, learning_rate_power=(learning_rate_power, -0.5),
            l2_shrinkage_regularization_strength=(l2_shrinkage, 0.0))
    if initial_accumulator_value < 0:
        raise ConfigError(f"{what}: initial_accumulator_value must not be negative, got "
                          f"{initial_accumulator_value}")
    # TensorFlow passes l2 + beta / (2 lr) to a kernel that adds 2 * l2 to sqrt(n) / lr;
    # the trainer's kernel adds lambda2 + beta / lr.
    return {"initial_accu_value": initial_accumulator_value, "lambda1": l1,
            "lambda2": 2.0 * l2, "beta": float(beta or 0.0)}


class FtrlOptimizer(Optimizer):
    """``tf.compat.v1.train.FtrlOptimizer`` (``learning_rate_power`` -0.5 only)."""

    kind = Optimizer_t.Ftrl

    def __init__(self, learning_rate=0.2, learning_rate_power: float = -0.5,
                 initial_accumulator_value: float = 0.1,
                 l1_regularization_strength: float = 0.0,
                 l2_regularization_strength: float = 0.0, use_locking: bool = False,
                 name: str = "Ftrl", accum_name: str | None = None,
                 linear_name: str | None = None,
                 l2_shrinkage_regularization_strength: float = 0.0,
                 beta: float | None = None) -> None:
        super().__init__(learning_rate, **_ftrl_hyper(
            "FtrlOptimizer", learning_rate, learning_rate_power, initial_accumulator_value,
            l1_regularization_strength, l2_regularization_strength,
            l2_shrinkage_regularization_strength, beta))


class MomentumOptimizer(Optimizer):
    """``tf.compat.v1.train.MomentumOptimizer`` (``accum = mu * accum + g``,
    ``w -= lr * accum``: the trainer's MomentumSGD / Nesterov with a constant rate)."""

    kind = Optimizer_t.MomentumSGD

    def __init__(self, learning_rate=0.01, momentum: float = 0.9, use_locking: bool = False,
                 name: str = "Momentum", use_nesterov: bool = False) -> None:
        super().__init__(learning_rate, momentum_factor=momentum)
        if use_nesterov:
            self.kind = Optimizer_t.Nesterov


# -- tf.keras.optimizers.legacy ------------------------------------------------------------


def _keras_lr(what: str, learning_rate: Any, kwargs: dict) -> Any:
    """The learning rate (keras' ``lr`` alias included); other keras options (``decay``,
    ``clipnorm``, ...) are refused by name unless left at zero."""
    kwargs = dict(kwargs)
    lr = kwargs.pop("lr", learning_rate)
    kwargs.pop("name", None)
    for key, value in kwargs.items():
        if value not in (None, 0, 0.0):
            raise ConfigError(f"{what}: {key}={value!r} is not supported")
    return lr


class Adam(Optimizer):
    """``tf.keras.optimizers.legacy.Adam`` (lr 0.001, epsilon 1e-7; ``amsgrad`` refused)."""

    kind = Optimizer_t.Adam
    table_update = Update_t.Global

    def __init__(self, learning_rate=0.001, beta_1: float = 0.9, beta_2: float = 0.999,
                 epsilon: float = 1e-7, amsgrad: bool = False, **kwargs: Any) -> None:
        _refuse("Adam", amsgrad=(amsgrad, False))
        super().__init__(_keras_lr("Adam", learning_rate, kwargs), beta1=beta_1, beta2=beta_2,
                         epsilon=epsilon)


class Adagrad(Optimizer):
    """``tf.keras.optimizers.legacy.Adagrad``: ``w -= lr * g / (sqrt(accum) + epsilon)``."""

    kind = Optimizer_t.AdaGrad

    def __init__(self, learning_rate=0.001, initial_accumulator_value: float = 0.1,
                 epsilon: float = 1e-7, **kwargs: Any) -> None:
        if initial_accumulator_value < 0:
            raise ConfigError(f"Adagrad: initial_accumulator_value must not be negative, got "
                              f"{initial_accumulator_value}")
        super().__init__(_keras_lr("Adagrad", learning_rate, kwargs),
                         initial_accu_value=initial_accumulator_value, epsilon=epsilon)


class Ftrl(Optimizer):
    """``tf.keras.optimizers.legacy.Ftrl`` (lr 0.001, initial accumulator 0.1)."""

    kind = Optimizer_t.Ftrl

    def __init__(self, learning_rate=0.001, learning_rate_power: float = -0.5,
                 initial_accumulator_value: float = 0.1,
                 l1_regularization_strength: float = 0.0,
                 l2_regularization_strength: float = 0.0, name: str = "Ftrl",
                 l2_shrinkage_regularization_strength: float = 0.0, beta: float = 0.0,
                 **kwargs: Any) -> None:
        learning_rate = _keras_lr("Ftrl", learning_rate, kwargs)
        super().__init__(learning_rate, **_ftrl_hyper(
            "Ftrl", learning_rate, learning_rate_power, initial_accumulator_value,
            l1_regularization_strength, l2_regularization_strength,
            l2_shrinkage_regularization_strength, beta))


class SGD(Optimizer):
    """``tf.keras.optimizers.legacy.SGD`` (lr 0.01; ``momentum``, ``nesterov``)."""

    kind = Optimizer_t.SGD

    def __init__(self, learning_rate=0.01, momentum: float = 0.0, nesterov: bool = False,
                 **kwargs: Any) -> None:
        learning_rate = _keras_lr("SGD", learning_rate, kwargs)
        if momentum < 0 or momentum > 1:
            raise ConfigError(f"SGD: momentum must lie in [0, 1], got {momentum}")
        if momentum or nesterov:
            self.kind = Optimizer_t.Nesterov if nesterov else Optimizer_t.MomentumSGD
            super().__init__(learning_rate, momentum_factor=momentum)
        else:
            super().__init__(learning_rate)


#: The names the canned estimators take (``_OPTIMIZER_CLS_NAMES_V2``), matched case- and
#: underscore-insensitively; 'GradientDescent' and 'Momentum' are this module's additions.
_BY_NAME: dict[str, Callable[..., Optimizer]] = {
    "adagrad": Adagrad, "adam": Adam, "ftrl": Ftrl, "sgd": SGD, "gradientdescent": SGD,
    "momentum": lambda learning_rate=0.01: SGD(learning_rate, momentum=0.9),
}


def _default_lr(cls: Callable) -> float:
    import inspect

    return float(inspect.signature(cls).parameters["learning_rate"].default)


def get_optimizer(value: Any, learning_rate: float | None = None,
                  what: str = "optimizer") -> Optimizer:
    """TensorFlow's ``get_optimizer_instance_v2``: an instance as it is; a name builds the
    keras optimizer of that name with ``learning_rate``, or with its own default learning rate
    when ``learning_rate`` is None; a class or factory is called with no argument."""
    if isinstance(value, Optimizer):
        return value
    if isinstance(value, str):
        cls = _BY_NAME.get(value.lower().replace("_", ""))
        if cls is None:
            raise ConfigError(f"{what}: unknown optimizer {value!r} (known: Adagrad, Adam, Ftrl, "
                              "SGD, Momentum; RMSProp is not implemented by the trainer)")
        return cls(learning_rate=_default_lr(cls) if learning_rate is None else learning_rate)
    if callable(value):
        return get_optimizer(value(), learning_rate, what)
    raise ConfigError(f"{what}: expected an optimizer name or object, got {value!r}")


_BY_NAME_V1: dict[str, Callable[..., Optimizer]] = {
    "adagrad": AdagradOptimizer, "adam": AdamOptimizer, "ftrl": FtrlOptimizer,
    "sgd": GradientDescentOptimizer, "gradientdescent": GradientDescentOptimizer,
}


def get_optimizer_v1(value: Any, learning_rate: float, what: str = "optimizer") -> Optimizer:
    """TensorFlow's ``get_optimizer_instance`` (the V1 canned estimators', DeepCTR's): a name
    builds the ``tf.compat.v1.train`` optimizer of that name at ``learning_rate``."""
    if isinstance(value, str):
        cls = _BY_NAME_V1.get(value.lower().replace("_", ""))
        if cls is None:
            raise ConfigError(f"{what}: unknown optimizer {value!r} (known: Adagrad, Adam, Ftrl, "
                              "SGD; RMSProp is not implemented by the trainer)")
        return cls(learning_rate=learning_rate)
    return get_optimizer(value, learning_rate, what)


@dataclass
class TrainOp:
    """What ``minimize`` returns: the optimizer, the loss and the variables it updates."""

    optimizer: Optimizer
    loss: Any
    var_list: list[str] | None

    def owns(self, variable: str) -> bool:
        if self.var_list is None:
            return True
        return any(variable == v or (v.endswith("/") and variable.startswith(v))
                   for v in self.var_list)


def group(*ops: Any) -> list[TrainOp]:
    """Several train ops run as one (``tf.group``)."""
    out: list[TrainOp] = []
    for op in ops:
        if isinstance(op, TrainOp):
            out.append(op)
        elif isinstance(op, Sequence):
            out.extend(group(*op))
        elif op is not None:
            raise ConfigError(f"group: not a train op: {op!r}")
    return out


class _GlobalStep:
    def __repr__(self) -> str:
        return "global_step"


GLOBAL_STEP = _GlobalStep()


def get_global_step() -> _GlobalStep:
    """The global step (for ``minimize(global_step=...)``; the Estimator counts it)."""
    return GLOBAL_STEP


get_or_create_global_step = get_global_step

__all__ = [
    "SGD", "Adagrad", "AdagradOptimizer", "Adam", "AdamOptimizer", "Ftrl", "FtrlOptimizer",
    "GradientDescentOptimizer", "MomentumOptimizer", "Optimizer", "TrainOp", "get_global_step",
    "get_optimizer", "get_optimizer_v1", "get_or_create_global_step", "group",
]
