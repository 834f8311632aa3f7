"""Optimizers for ``model_fn`` bodies (as ``tf.compat.v1.train``), over the trainer's
optimizers (:mod:`tierserve.trainer.optimizers`): ``opt.minimize(loss)`` returns the
``train_op`` an :class:`~.spec.EstimatorSpec` takes.

Pre-made estimators take an optimizer by name (``'Adagrad'``, ``'Adam'``, ``'Ftrl'``,
``'SGD'``, ``'Momentum'``) or object.  Embedding tables are updated by the optimizer of the
train op whose variables they belong to, touching only the rows a batch looked up
(``Update_t.Local``).
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
        update = Update_t.Local if for_table else Update_t.Global
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


class GradientDescentOptimizer(Optimizer):
    kind = Optimizer_t.SGD


class AdamOptimizer(Optimizer):
    kind = Optimizer_t.Adam

    def __init__(self, learning_rate=0.001, beta1: float = 0.9, beta2: float = 0.999,
                 epsilon: float = 1e-8) -> None:
        super().__init__(learning_rate, beta1=beta1, beta2=beta2, epsilon=epsilon)


class AdagradOptimizer(Optimizer):
    kind = Optimizer_t.AdaGrad

    def __init__(self, learning_rate=0.05, initial_accumulator_value: float = 0.1) -> None:
        # TensorFlow's Adagrad divides by sqrt(accum) with no epsilon: keep it tiny
        super().__init__(learning_rate, initial_accu_value=initial_accumulator_value,
                         epsilon=1e-7)


class FtrlOptimizer(Optimizer):
    kind = Optimizer_t.Ftrl

    def __init__(self, learning_rate=0.2, l1_regularization_strength: float = 0.0,
                 l2_regularization_strength: float = 0.0, beta: float = 0.0) -> None:
        super().__init__(learning_rate, lambda1=l1_regularization_strength,
                         lambda2=l2_regularization_strength, beta=beta)


class MomentumOptimizer(Optimizer):
    kind = Optimizer_t.MomentumSGD

    def __init__(self, learning_rate=0.01, momentum: float = 0.9,
                 use_nesterov: bool = False) -> None:
        super().__init__(learning_rate, momentum_factor=momentum)
        if use_nesterov:
            self.kind = Optimizer_t.Nesterov


_BY_NAME: dict[str, type[Optimizer]] = {
    "adagrad": AdagradOptimizer, "adam": AdamOptimizer, "ftrl": FtrlOptimizer,
    "sgd": GradientDescentOptimizer, "gradientdescent": GradientDescentOptimizer,
    "momentum": MomentumOptimizer,
}


def get_optimizer(value: Any, default_lr: float, what: str = "optimizer") -> Optimizer:
    """An :class:`Optimizer` from a name, an instance, a class or a no-argument factory."""
    if isinstance(value, Optimizer):
        return value
    if isinstance(value, str):
        cls = _BY_NAME.get(value.lower().replace("_", ""))
        if cls is None:
            raise ConfigError(f"{what}: unknown optimizer {value!r} (known: Adagrad, Adam, Ftrl, "
                              "SGD, Momentum; RMSProp is not implemented by the trainer)")
        return cls(learning_rate=default_lr)
    if isinstance(value, type) and issubclass(value, Optimizer):
        return value(learning_rate=default_lr)
    if callable(value):
        return get_optimizer(value(), default_lr, what)
    raise ConfigError(f"{what}: expected an optimizer name or object, got {value!r}")


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
    "AdagradOptimizer", "AdamOptimizer", "FtrlOptimizer", "GradientDescentOptimizer",
    "MomentumOptimizer", "Optimizer", "TrainOp", "get_global_step", "get_optimizer",
    "get_or_create_global_step", "group",
]
