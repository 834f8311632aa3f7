"""Optimizers: HugeCTR's ``CreateOptimizer`` / ``OptParamsPy`` and their update rules on ``xp``.

The formulas are HugeCTR's (``src/optimizers/*.cu`` for dense weights,
``src/optimizers/sparse_optimizer.cu`` for embedding tables), in float32:

* Adam: ``m = b1*m + (1-b1)*g``, ``v = b2*v + (1-b2)*g^2``,
  ``w -= lr*sqrt(1-b2^t)/(1-b1^t) * m / (sqrt(v) + epsilon)`` (epsilon outside the bias
  correction, as HugeCTR and the Adam paper's efficient form have it).
* AdaGrad: ``a += g^2``, ``w -= lr*g / (sqrt(a) + epsilon)``; ``a`` starts at
  ``initial_accu_value``.
* MomentumSGD: ``u = momentum_factor*u - lr*g``, ``w += u``.
* Nesterov: ``u' = mu*u - lr*g``, ``w += -mu*u + (1+mu)*u'``.
* SGD: ``w -= lr*g``.  ``atomic_update`` selects HugeCTR's atomicAdd kernel on a GPU; here
  gradients are always summed per row first, which is the same result, so it has no effect.
* Ftrl (FTRL-proximal, HugeCTR's dense kernel): ``n' = n + g^2``,
  ``z += g + (sqrt(n) - sqrt(n'))*w/lr``, ``w = (sign(z)*lambda1 - z) / (sqrt(n')/lr + lambda2
  + beta/lr)`` where ``|z| > lambda1``, else 0; ``n`` starts at ``initial_accu_value`` (0 in
  HugeCTR; TensorFlow's Ftrl starts it at 0.1).

``step`` (``t`` above) is the 1-based number of the update being applied.

Embedding tables (``update_sparse``) follow ``update_type``:

* ``Local``: only the rows hit in this batch change, values and optimizer state alike.
* ``Global``: every row is updated as the dense optimizer would update it with a zero gradient
  for the rows not hit, so Adam, MomentumSGD and Nesterov keep moving untouched rows with their
  momentum (and decay their state).  It costs O(rows x dim) per step.  SGD, AdaGrad and Ftrl do
  nothing to a row with a zero gradient in HugeCTR's kernels, so for them it equals ``Local``.
* ``LazyGlobal`` (Adam only, as in HugeCTR): only the rows hit change, but each keeps the step
  it was last updated (``prev_time``, 1 before its first update).  When hit again after
  ``s = t - prev_time`` steps, it first applies the catch-up weight step
  ``w -= lr/(1-b1) * sqrt(1-b2^prev)/(1-b1^prev) * (1-b1^s) * m / (sqrt(v) + epsilon)``
  with its stored moments, then decays the moments for the skipped steps and adds this
  step's gradient: ``m = b1^s*m + (1-b1)*g``, ``v = b2^s*v + (1-b2)*g^2``.  (So a gradient
  reaches the weight at the row's next hit, exactly like HugeCTR's ``opt_adam_kernel_lazy``.)
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from tierserve.core.errors import InvalidInputError
from tierserve.model.cpu_kernels import adagrad_flat, adagrad_rows, flat_views, use_kernels


class Optimizer_t(enum.Enum):  # noqa: N801 - HugeCTR's name
    """The optimizer types of ``hugectr.Optimizer_t``."""

    Adam = "Adam"
    AdaGrad = "AdaGrad"
    Adagrad = "AdaGrad"  # the spelling some HugeCTR docs use
    MomentumSGD = "MomentumSGD"
    Nesterov = "Nesterov"
    SGD = "SGD"
    Ftrl = "Ftrl"


class Update_t(enum.Enum):  # noqa: N801 - HugeCTR's name
    """How embedding tables are updated (``hugectr.Update_t``); see the module docstring."""

    Local = "Local"
    Global = "Global"
    LazyGlobal = "LazyGlobal"


@dataclass(frozen=True)
class OptParamsPy:
    """The optimizer configuration ``CreateOptimizer`` returns (HugeCTR's ``OptParamsPy``)."""

    optimizer: Optimizer_t = Optimizer_t.Adam
    update_type: Update_t = Update_t.Global
    beta1: float = 0.9
    beta2: float = 0.999
    epsilon: float = 1e-7
    initial_accu_value: float = 0.0
    momentum_factor: float = 0.0
    atomic_update: bool = True
    lambda1: float = 0.0
    lambda2: float = 0.0
    beta: float = 0.0

    # HugeCTR spells the type ``optimizer_type`` in CreateOptimizer; both read the same.
    @property
    def optimizer_type(self) -> Optimizer_t:
        return self.optimizer

    def to_dict(self) -> dict[str, Any]:
        """The graph JSON's ``"optimizer"`` object (HugeCTR's field names)."""
        hyper: dict[str, Any]
        if self.optimizer is Optimizer_t.Adam:
            hyper = {"beta1": self.beta1, "beta2": self.beta2, "epsilon": self.epsilon}
        elif self.optimizer is Optimizer_t.AdaGrad:
            hyper = {"initial_accu_value": self.initial_accu_value, "epsilon": self.epsilon}
        elif self.optimizer in (Optimizer_t.MomentumSGD, Optimizer_t.Nesterov):
            hyper = {"momentum_factor": self.momentum_factor}
        elif self.optimizer is Optimizer_t.SGD:
            hyper = {"atomic_update": self.atomic_update}
        else:
            hyper = {"beta": self.beta, "lambda1": self.lambda1, "lambda2": self.lambda2}
            if self.initial_accu_value:  # not HugeCTR's: written only when set
                hyper["initial_accu_value"] = self.initial_accu_value
        return {
            "type": self.optimizer.value,
            "update_type": self.update_type.value,
            _HPARAM_KEYS[self.optimizer]: hyper,
        }

    @classmethod
    def from_dict(cls, obj: dict[str, Any]) -> OptParamsPy:
        """Read :meth:`to_dict`'s object back (a ``learning_rate`` in it is ignored here)."""
        opt = _enum(obj.get("type", "Adam"), Optimizer_t, "optimizer type")
        hyper = dict(obj.get(_HPARAM_KEYS[opt], {}))
        hyper.pop("learning_rate", None)
        try:
            return CreateOptimizer(
                optimizer_type=opt, update_type=obj.get("update_type", "Global"), **hyper
            )
        except TypeError as exc:
            raise InvalidInputError(f"bad optimizer hyperparameters {hyper}: {exc}") from None


_HPARAM_KEYS = {
    Optimizer_t.Adam: "adam_hparam",
    Optimizer_t.AdaGrad: "adagrad_hparam",
    Optimizer_t.MomentumSGD: "momentum_sgd_hparam",
    Optimizer_t.Nesterov: "nesterov_hparam",
    Optimizer_t.SGD: "sgd_hparam",
    Optimizer_t.Ftrl: "ftrl_hparam",
}


def _enum(value: Any, enum_type: type[enum.Enum], what: str) -> Any:
    if isinstance(value, enum_type):
        return value
    if isinstance(value, str):
        for member_name, member in enum_type.__members__.items():
            if value.lower() in (member_name.lower(), str(member.value).lower()):
                return member
    names = ", ".join(enum_type.__members__)
    raise InvalidInputError(f"{what} must be one of {names}, got {value!r}")


def CreateOptimizer(  # noqa: N802 - HugeCTR's name
    optimizer_type: Optimizer_t | str = Optimizer_t.Adam,
    update_type: Update_t | str = Update_t.Global,
    beta1: float = 0.9,
    beta2: float = 0.999,
    epsilon: float = 0.0000001,
    initial_accu_value: float = 0.0,
    momentum_factor: float = 0.0,
    atomic_update: bool = True,
    lambda1: float = 0.0,
    lambda2: float = 0.0,
    beta: float = 0.0,
) -> OptParamsPy:
    """HugeCTR's ``CreateOptimizer``: the optimizer for dense layers and, by default, embeddings.

    Arguments and defaults are HugeCTR's; ``lambda1``, ``lambda2`` and ``beta`` configure
    ``Optimizer_t.Ftrl`` (and ``initial_accu_value`` its ``n``, 0 as in HugeCTR).  Bad values
    raise :class:`InvalidInputError`.  ``atomic_update=False`` warns once: the SGD update is
    applied exactly, as with atomic updates (HugeCTR's non-atomic GPU kernel may drop
    concurrent updates of one row).
    """
    opt = _enum(optimizer_type, Optimizer_t, "optimizer_type")
    upd = _enum(update_type, Update_t, "update_type")
    if upd is Update_t.LazyGlobal and opt is not Optimizer_t.Adam:
        raise InvalidInputError(
            f"update_type LazyGlobal is only implemented for Adam (as in HugeCTR), "
            f"not {opt.value}"
        )
    if not (0.0 <= beta1 < 1.0 and 0.0 <= beta2 < 1.0):
        raise InvalidInputError(f"beta1 and beta2 must lie in [0, 1), got {beta1}, {beta2}")
    if epsilon < 0 or initial_accu_value < 0 or lambda1 < 0 or lambda2 < 0 or beta < 0:
        raise InvalidInputError(
            "epsilon, initial_accu_value, lambda1, lambda2 and beta must not be negative"
        )
    if not atomic_update:
        from tierserve.core.compat import warn_once

        warn_once("CreateOptimizer.atomic_update", "the SGD update of a row is applied "
                  "exactly, as HugeCTR's atomic update does", stacklevel=3)
    return OptParamsPy(
        optimizer=opt,
        update_type=upd,
        beta1=float(beta1),
        beta2=float(beta2),
        epsilon=float(epsilon),
        initial_accu_value=float(initial_accu_value),
        momentum_factor=float(momentum_factor),
        atomic_update=bool(atomic_update),
        lambda1=float(lambda1),
        lambda2=float(lambda2),
        beta=float(beta),
    )


def _xp_of(array: Any) -> Any:
    """numpy, or cupy for a cupy array (without importing cupy here)."""
    if isinstance(array, np.ndarray):
        return np
    import cupy  # only reached with cupy arrays

    return cupy.get_array_module(array)


_GLOBAL_CHUNK = 1 << 14  # rows per chunk of a Global sparse update


class Optimizer:
    """One optimizer's update rule, for dense parameters and embedding tables.

    ``state_names`` are the float32 state arrays, each shaped like the parameter (for a table:
    ``[rows, dim]``), in the order the optimizer-state files hold them.  ``row_state_names``
    are per-row int64 arrays (``[rows]``; only LazyGlobal Adam's ``prev_time``).
    """

    state_names: tuple[str, ...] = ()
    row_state_names: tuple[str, ...] = ()
    #: Whether a zero gradient still changes a row (so ``Global`` differs from ``Local``).
    decays_without_gradient: bool = False

    def __init__(self, params: OptParamsPy) -> None:
        self.params = params

    @property
    def update_type(self) -> Update_t:
        return self.params.update_type

    @property
    def num_state_copies(self) -> int:
        """State arrays of the parameter's size per weight, as HugeCTR counts them for
        ``workspace_size_per_gpu_in_mb`` (LazyGlobal's ``prev_time`` counts as one)."""
        return len(self.state_names) + len(self.row_state_names)

    @property
    def moves_untouched_rows(self) -> bool:
        """Whether a sparse update changes rows that got no gradient (``Global`` + momentum)."""
        return self.update_type is Update_t.Global and self.decays_without_gradient

    def init_state(self, shape: tuple[int, ...], xp: Any = np) -> dict[str, Any]:
        """Fresh state for a parameter of ``shape`` (a table: ``(rows, dim)``)."""
        state = {name: xp.full(shape, self._initial(name), dtype=xp.float32)
                 for name in self.state_names}
        for name in self.row_state_names:
            state[name] = xp.ones(shape[:1], dtype=xp.int64)
        return state

    def _initial(self, name: str) -> float:
        return 0.0

    def update_dense(self, param: Any, grad: Any, state: dict[str, Any], lr: float,
                     step: int) -> None:
        """Update ``param`` (and ``state``) in place with ``grad`` at update number ``step``."""
        self._apply(param, grad, state, float(lr), int(step))

    def update_sparse(
        self,
        values: Any,
        rows: Any,
        grads: Any,
        state: dict[str, Any],
        lr: float,
        step: int,
        num_rows: int | None = None,
    ) -> None:
        """Update an embedding table in place.

        ``values`` is the table's ``[capacity, dim]`` array, ``rows`` the *unique* row indices
        hit in this batch and ``grads`` their summed gradients ``[len(rows), dim]``.  Rows from
        ``num_rows`` on (default: all of ``values``) are unused and never touched, which keeps
        ``Global`` updates to the live part of a growable table.
        """
        lr = float(lr)
        step = int(step)
        xp = _xp_of(values)
        if self.moves_untouched_rows:
            n = values.shape[0] if num_rows is None else int(num_rows)
            self._apply_global(xp, values, rows, grads, state, lr, step, n)
            return
        if len(rows) == 0:
            return
        p = xp.take(values, rows, axis=0)
        st = {k: xp.take(a, rows, axis=0) for k, a in state.items()}
        if self.update_type is Update_t.LazyGlobal:
            self._apply_lazy(p, grads, st, lr, step)
        else:
            self._apply(p, grads, st, lr, step)
        values[rows] = p
        for k, a in state.items():
            a[rows] = st[k]

    def _apply_global(self, xp, values, rows, grads, state, lr, step, n):
        """The dense rule over rows ``[0, n)``, zero gradient where not hit.  On the CPU in
        chunks of rows so temporaries stay small (cache-resident) whatever the table's size;
        on a GPU in one piece (fewer kernel launches)."""
        chunk = _GLOBAL_CHUNK if xp is np else max(n, 1)
        order = xp.argsort(rows)
        rows_sorted = rows[order]
        bounds = xp.searchsorted(rows_sorted, xp.arange(0, n + chunk, chunk))
        bounds = [int(b) for b in (bounds.get() if hasattr(bounds, "get") else bounds)]
        for c, lo in enumerate(range(0, n, chunk)):
            hi = min(n, lo + chunk)
            g = xp.zeros((hi - lo,) + tuple(values.shape[1:]), dtype=values.dtype)
            sel = order[bounds[c] : bounds[c + 1]]
            if sel.shape[0]:
                g[rows_sorted[bounds[c] : bounds[c + 1]] - lo] = grads[sel]
            self._apply(values[lo:hi], g, {k: a[lo:hi] for k, a in state.items()}, lr, step)

    # Subclasses: update p and every array of st in place (they may be gathered copies).
    def _apply(self, p: Any, g: Any, st: dict[str, Any], lr: float, t: int) -> None:
        raise NotImplementedError

    def _apply_lazy(self, p: Any, g: Any, st: dict[str, Any], lr: float, t: int) -> None:
        raise InvalidInputError(
            f"update_type LazyGlobal is only implemented for Adam, not {type(self).__name__}"
        )


class Adam(Optimizer):
    decays_without_gradient = True

    def __init__(self, params: OptParamsPy) -> None:
        super().__init__(params)
        self.state_names = ("m", "v")
        if params.update_type is Update_t.LazyGlobal:
            self.row_state_names = ("prev_time",)

    def _apply(self, p, g, st, lr, t):
        xp = _xp_of(p)
        b1, b2, eps = self.params.beta1, self.params.beta2, self.params.epsilon
        m, v = st["m"], st["v"]
        tmp = xp.multiply(g, 1.0 - b1, out=xp.empty_like(m))  # one scratch array throughout
        m *= b1
        m += tmp
        xp.multiply(g, g, out=tmp)
        tmp *= 1.0 - b2
        v *= b2
        v += tmp
        alpha_t = lr * math.sqrt(1.0 - b2**t) / (1.0 - b1**t)
        xp.sqrt(v, out=tmp)
        tmp += eps
        xp.divide(m, tmp, out=tmp)
        tmp *= alpha_t
        p -= tmp

    def _apply_lazy(self, p, g, st, lr, t):
        b1, b2, eps = self.params.beta1, self.params.beta2, self.params.epsilon
        xp = _xp_of(p)
        m, v, prev = st["m"], st["v"], st["prev_time"]
        prev_f = xp.maximum(prev, 1).astype(xp.float64)  # 1 before a row's first update
        skipped = t - prev_f
        b1_skip = _scalar_pow(xp, b1, skipped)
        alpha = (lr / (1.0 - b1)) * xp.sqrt(1.0 - _scalar_pow(xp, b2, prev_f)) / (
            1.0 - _scalar_pow(xp, b1, prev_f)) * (1.0 - b1_skip)
        # catch-up step with the stored moments, then decay them and add this gradient
        tmp = xp.sqrt(v, out=xp.empty_like(v))
        tmp += eps
        xp.divide(m, tmp, out=tmp)
        tmp *= alpha.astype(p.dtype)[:, None]
        p -= tmp
        m *= b1_skip.astype(m.dtype)[:, None]
        xp.multiply(g, 1.0 - b1, out=tmp)
        m += tmp
        v *= _scalar_pow(xp, b2, skipped).astype(v.dtype)[:, None]
        xp.multiply(g, g, out=tmp)
        tmp *= 1.0 - b2
        v += tmp
        prev[...] = t


class AdaGrad(Optimizer):
    state_names = ("accum",)

    def _initial(self, name):
        return self.params.initial_accu_value

    def update_sparse(self, values, rows, grads, state, lr, step, num_rows=None):
        a = state["accum"]
        if use_kernels(_xp_of(values), values, grads, a) and isinstance(rows, np.ndarray) \
                and values.flags.c_contiguous and a.flags.c_contiguous:
            eps, lr = values.dtype.type(self.params.epsilon), values.dtype.type(lr)
            adagrad_rows(values, rows, grads, a, lr, eps)  # in place, no gathered copies
            return
        super().update_sparse(values, rows, grads, state, lr, step, num_rows)

    def _apply(self, p, g, st, lr, t):
        xp = _xp_of(p)
        a = st["accum"]
        flat = flat_views(p, g, a) if use_kernels(xp, p, g, a) else None
        if flat is not None:
            eps, lr = p.dtype.type(self.params.epsilon), p.dtype.type(lr)
            adagrad_flat(*flat, lr, eps)
            return
        tmp = xp.multiply(g, g, out=xp.empty_like(a))
        a += tmp
        xp.sqrt(a, out=tmp)
        tmp += self.params.epsilon
        xp.divide(g, tmp, out=tmp)
        tmp *= lr
        p -= tmp


class MomentumSGD(Optimizer):
    state_names = ("momentum",)
    decays_without_gradient = True

    def _apply(self, p, g, st, lr, t):
        u = st["momentum"]
        u *= self.params.momentum_factor
        u -= _xp_of(p).multiply(g, lr, out=_xp_of(p).empty_like(u))
        p += u


class Nesterov(Optimizer):
    state_names = ("accum",)
    decays_without_gradient = True

    def _apply(self, p, g, st, lr, t):
        xp = _xp_of(p)
        mu = self.params.momentum_factor
        u = st["accum"]
        step = xp.multiply(u, -mu)  # -mu * old accumulator
        u *= mu
        tmp = xp.multiply(g, lr, out=xp.empty_like(u))
        u -= tmp
        xp.multiply(u, 1.0 + mu, out=tmp)
        step += tmp
        p += step


class SGD(Optimizer):
    def _apply(self, p, g, st, lr, t):
        p -= _xp_of(p).multiply(g, lr, out=_xp_of(p).empty_like(p))


class Ftrl(Optimizer):
    state_names = ("z", "n")

    def _initial(self, name):
        return self.params.initial_accu_value if name == "n" else 0.0

    def _apply(self, p, g, st, lr, t):
        xp = _xp_of(p)
        l1, l2, beta = self.params.lambda1, self.params.lambda2, self.params.beta
        z, n = st["z"], st["n"]
        n_new = n + g * g
        z += g + (_sqrt(n) - _sqrt(n_new)) * p / lr
        x = xp.where(z < 0, -l1, l1).astype(p.dtype) - z
        y = _sqrt(n_new) / lr + (l2 + beta / lr)
        p[...] = xp.where(xp.abs(z) > l1, x / y, 0.0).astype(p.dtype)
        n[...] = n_new


def _scalar_pow(xp: Any, base: float, exponents: Any) -> Any:
    """``base ** exponents`` for float64 exponents: ``exp`` vectorises where ``pow`` does not."""
    if base > 0:
        return xp.exp(exponents * math.log(base))
    return xp.power(base, exponents)


def _sqrt(a: Any) -> Any:
    return _xp_of(a).sqrt(a)


_CLASSES: dict[Optimizer_t, type[Optimizer]] = {
    Optimizer_t.Adam: Adam,
    Optimizer_t.AdaGrad: AdaGrad,
    Optimizer_t.MomentumSGD: MomentumSGD,
    Optimizer_t.Nesterov: Nesterov,
    Optimizer_t.SGD: SGD,
    Optimizer_t.Ftrl: Ftrl,
}


def make_optimizer(params: OptParamsPy) -> Optimizer:
    """The :class:`Optimizer` that ``params`` describes."""
    if params.update_type is Update_t.LazyGlobal and params.optimizer is not Optimizer_t.Adam:
        raise InvalidInputError(
            f"update_type LazyGlobal is only implemented for Adam, not {params.optimizer.value}"
        )
    return _CLASSES[params.optimizer](params)
