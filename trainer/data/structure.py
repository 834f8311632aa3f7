"""What a dataset's elements are, read the way TensorFlow reads them: shapes
(``output_shapes`` of ``from_generator``), dtypes, how a function is called on an element
(a tuple is spread into arguments) and where a bad text record came from."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from tierserve.core.errors import InvalidInputError

from .csv_decode import CSVRecordError, DecodeCSVError


def _as_shape(x: Any, where: str) -> tuple | None:
    """One component's shape as TensorFlow reads it: an int is a 1-D shape (``4`` ->
    ``(4,)``), None any shape, a tuple/list of ints and Nones the shape itself."""
    if x is None:
        return None
    if isinstance(x, (int, np.integer)) and not isinstance(x, bool):
        return (int(x),)
    if isinstance(x, (tuple, list)) and all(v is None or isinstance(v, (int, np.integer))
                                           for v in x):
        return tuple(None if v is None else int(v) for v in x)
    raise InvalidInputError(f"output_shapes{where}: {x!r} is not a shape")


def _shapes_up_to(types: Any, shapes: Any, where: str = "") -> list[tuple | None]:
    """``shapes`` read in the structure of ``types`` (TensorFlow's ``map_structure_up_to``):
    with ``output_types=(tf.float32, tf.int32)``, ``output_shapes=(4, 1)`` is two shapes,
    ``(4,)`` and ``(1,)``."""
    if isinstance(types, dict):
        if not isinstance(shapes, dict) or set(shapes) != set(types):
            raise InvalidInputError(f"output_shapes{where} must be a dict with the keys of "
                                    f"output_types {sorted(types)}, got {shapes!r}")
        return [s for k in types for s in _shapes_up_to(types[k], shapes[k], f"{where}[{k!r}]")]
    if isinstance(types, (tuple, list)):
        if not isinstance(shapes, (tuple, list)) or len(shapes) != len(types):
            raise InvalidInputError(f"output_shapes{where} must have {len(types)} components "
                                    f"as output_types does, got {shapes!r}")
        return [s for i, (t, sh) in enumerate(zip(types, shapes))
                for s in _shapes_up_to(t, sh, f"{where}[{i}]")]
    return [_as_shape(shapes, where)]


def _flatten_shapes(shapes: Any) -> list[tuple]:
    def is_shape(x: Any) -> bool:
        return isinstance(x, (tuple, list)) and all(v is None or isinstance(v, int) for v in x)

    out: list[tuple] = []

    def walk(x: Any) -> None:
        if is_shape(x):
            out.append(tuple(x))
        elif isinstance(x, dict):
            for v in x.values():
                walk(v)
        elif isinstance(x, (tuple, list)):
            for v in x:
                walk(v)
        else:
            raise InvalidInputError(f"output_shapes: {x!r} is not a shape")

    walk(shapes)
    return out


def _numpy_dtype(value: Any, what: str) -> np.dtype:
    if value in (str, "string"):
        return np.dtype(str)
    try:
        return np.dtype(getattr(value, "as_numpy_dtype", value))
    except TypeError:
        raise InvalidInputError(f"{what}: {value!r} is not a dtype") from None


def _call(fn: Callable[..., Any], element: Any) -> Any:
    if isinstance(element, tuple):
        return fn(*element)
    return fn(element)


def _located(exc: DecodeCSVError, prov) -> BaseException:
    """``exc`` with the file and line of the bad record, when the element came from text."""
    if prov is None:
        return exc
    files, lines = prov
    files, lines = np.asarray(files, dtype=object), np.asarray(lines)
    i = 0 if exc.record is None else exc.record
    if lines.ndim == 0:
        path, line = files.item(), int(lines)
    elif i < lines.size:
        path, line = files.reshape(-1)[i], int(lines.reshape(-1)[i])
    else:
        return exc
    return CSVRecordError(path, line, exc.problem, column=exc.column)
