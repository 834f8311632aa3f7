"""What flows between the Estimator and the code it calls: whether a function takes an
argument (``params``, ``config``, an input context), what an ``input_fn`` gives (a features
dict and labels; labels checked), and what a hook's ``SessionRunArgs`` fetch (tensors, names,
the loss, the global step), resolved against a step's result."""


from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import numpy as np

from tierserve.core.errors import InvalidInputError
from tierserve.trainer.graph.tensors import (
    Tensor,
)

from .program import StepResult


def _accepts(fn: Callable, name: str) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def _label_name(labels: Any) -> tuple[Any, str]:
    if isinstance(labels, dict):
        if len(labels) != 1:
            raise InvalidInputError(f"labels is a dict of {len(labels)} tensors "
                                    f"({sorted(labels)}); give one label tensor")
        (name, value), = labels.items()
        return value, str(name)
    return labels, "labels"


def check_labels(labels: Any) -> tuple[np.ndarray, str]:
    """Labels as a float32-convertible array, or an error naming the label column."""
    value, name = _label_name(labels)
    arr = np.asarray(value)
    if arr.dtype.kind not in "biuf":
        raise InvalidInputError(
            f"label {name!r} has dtype {arr.dtype} ({arr.reshape(-1)[:3].tolist()} ...); labels "
            "must be numbers (for class names, give the classifier a label_vocabulary)")
    if arr.dtype.kind == "f" and np.isnan(arr).any():
        raise InvalidInputError(f"label {name!r} has missing (NaN) values")
    return arr, name


def _sample(value: Any) -> np.ndarray:
    """A raw feature's batch as an array (ragged lists as an object array of rows)."""
    if isinstance(value, np.ndarray):
        return value
    try:
        return np.asarray(value)
    except ValueError:
        out = np.empty(len(value), dtype=object)
        out[:] = list(value)
        return out


def _as_batch(item: Any) -> tuple[dict, Any] | None:
    if isinstance(item, dict):
        return item, None
    if isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], dict):
        return item[0], item[1]
    return None


def _value(t: Any, result: StepResult) -> Any:
    if isinstance(t, Tensor):
        if t.name not in result.tensors:
            raise InvalidInputError(f"tensor {t.name!r} was not computed in this mode")
        return np.asarray(result.tensors[t.name])
    if callable(t):
        return t(result)
    raise InvalidInputError(f"not a tensor of the model: {t!r}")


def _fetch(fetches: Any, result: StepResult, step: int) -> Any:
    if fetches is None:
        return None
    if isinstance(fetches, dict):
        return {k: _fetch(v, result, step) for k, v in fetches.items()}
    if isinstance(fetches, (list, tuple)):
        return type(fetches)(_fetch(v, result, step) for v in fetches)
    if isinstance(fetches, str):
        if fetches in ("global_step", "global_step:0"):
            return step
        if fetches in ("loss", "loss:0"):
            return result.loss
        if fetches in result.tensors:
            return result.tensors[fetches]
        raise InvalidInputError(f"hook fetch {fetches!r} names no tensor of the model")
    if isinstance(fetches, Tensor):
        from tierserve.trainer.graph.losses import Loss

        if isinstance(fetches, Loss):
            return result.loss
        return _value(fetches, result)
    from .optimizers import GLOBAL_STEP

    if fetches is GLOBAL_STEP:
        return step
    raise InvalidInputError(f"hook fetch {fetches!r} is not a tensor or a tensor name")


def _progress(total: int | None):
    from ..progress import progress_bar

    return progress_bar(total=total, unit="step", desc="train")
