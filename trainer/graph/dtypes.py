"""TensorFlow's dtypes (``tf.float32``, ``tf.int64``, ``tf.string``, ...) as small objects
that numpy and tierserve's APIs read (``as_numpy_dtype``), compare equal to their names, and
``as_dtype`` to go from a name, a numpy dtype or a Python type to one."""

from __future__ import annotations

from typing import Any

import numpy as np

from tierserve.core.errors import ConfigError


class DType:
    """One dtype: ``name`` (``"float32"``), ``as_numpy_dtype``, ``is_integer``,
    ``is_floating``, ``is_bool``."""

    def __init__(self, name: str, numpy_type: Any) -> None:
        self.name = name
        self.as_numpy_dtype = numpy_type
        kind = np.dtype(numpy_type).kind
        self.is_integer = kind in "iu"
        self.is_floating = kind == "f"
        self.is_bool = kind == "b"

    @property
    def base_dtype(self) -> DType:
        return self

    def __eq__(self, other: Any) -> bool:
        if isinstance(other, DType):
            return other.name == self.name
        if isinstance(other, str):
            return other == self.name
        try:
            return as_dtype(other).name == self.name
        except ConfigError:
            return False

    def __hash__(self) -> int:
        return hash(self.name)

    def __repr__(self) -> str:
        return f"tf.{self.name}"


_ALL = {name: DType(name, t) for name, t in (
    ("float16", np.float16), ("float32", np.float32), ("float64", np.float64),
    ("int8", np.int8), ("int16", np.int16), ("int32", np.int32), ("int64", np.int64),
    ("uint8", np.uint8), ("uint16", np.uint16), ("uint32", np.uint32), ("uint64", np.uint64),
    ("bool", np.bool_), ("string", np.str_))}
_ALIASES = {"half": "float16", "float": "float32", "double": "float64", "str": "string",
            "bytes": "string", "object": "string"}

float16, float32, float64 = _ALL["float16"], _ALL["float32"], _ALL["float64"]
half, double = float16, float64
int8, int16, int32, int64 = _ALL["int8"], _ALL["int16"], _ALL["int32"], _ALL["int64"]
uint8, uint16, uint32, uint64 = _ALL["uint8"], _ALL["uint16"], _ALL["uint32"], _ALL["uint64"]
string = _ALL["string"]
bool = _ALL["bool"]  # noqa: A001 - TensorFlow's name


def as_dtype(value: Any) -> DType:
    """The DType of ``value``: a DType, a name (``"float32"``), a numpy dtype or type, or a
    Python type (``float``, ``int``, ``str``, ``bool``)."""
    if isinstance(value, DType):
        return value
    if isinstance(value, str):
        name = _ALIASES.get(value, value)
        if name in _ALL:
            return _ALL[name]
    elif value in (str, bytes, object):
        return string
    elif value is float:  # TensorFlow reads Python floats as float32
        return float32
    else:
        try:
            kind = np.dtype(value)
        except TypeError:
            kind = None
        if kind is not None:
            if kind.kind in "USO":
                return string
            if kind.name in _ALL:
                return _ALL[kind.name]
    raise ConfigError(f"{value!r} is not a dtype (one of {', '.join(sorted(_ALL))})")


__all__ = ["DType", "as_dtype", "bool", "double", "float16", "float32", "float64", "half",
           "int8", "int16", "int32", "int64", "string", "uint8", "uint16", "uint32", "uint64"]
