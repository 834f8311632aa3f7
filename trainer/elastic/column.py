"""DLRover's ``Column``: a named, typed field of a CSV-like record, feature or label."""

from __future__ import annotations

from typing import Any

import numpy as np

from tierserve.core.errors import ConfigError

_FLOATS = {"float": "float32", "float32": "float32", "float64": "float64", "double": "float64"}
_INTS = {"int": "int64", "int32": "int32", "int64": "int64", "int8": "int32", "int16": "int32"}
_UINTS = {"uint8": "int32", "uint16": "int32", "uint32": "int64", "uint64": "int64"}


class Column:
    """One field of the records a reader gives: ``name``, ``dtype`` (float32, float64,
    double, float, int, int8..int64, uint8..uint64, string) and whether it ``is_label``.

    ``is_sparse`` marks a categorical feature (as DLRover's criteo example does; kept for the
    model_fn to read); ``default`` is the value of an empty field (DLRover's: 0, or "" for
    string columns).
    """

    def __init__(
        self,
        name: str,
        dtype: str = "float32",
        is_label: bool = False,
        is_sparse: bool = False,
        default: Any = None,
    ) -> None:
        if not isinstance(name, str) or not name:
            raise ConfigError(f"Column: name must be a non-empty str, got {name!r}")
        key = str(dtype).lower()
        if key not in _FLOATS and key not in _INTS and key not in _UINTS and key != "string":
            raise ConfigError(
                f"Column {name!r}: dtype {dtype!r} is not one of float, float32, float64, "
                "double, int, int8, int16, int32, int64, uint8, uint16, uint32, uint64, string"
            )
        self.name, self.dtype = name, key
        self.is_label, self.is_sparse = bool(is_label), bool(is_sparse)
        self.default = default

    @classmethod
    def create(
        cls, name: str, dtype: str = "float32", is_label: bool = False, **kwargs: Any
    ) -> Column:
        """DLRover's constructor: ``Column.create(name=..., dtype=..., is_label=...)``."""
        unknown = set(kwargs) - {"is_sparse", "default"}
        if unknown:
            raise ConfigError(
                f"Column {name!r}: unknown setting(s) {sorted(unknown)}; Column takes name, "
                "dtype, is_label, is_sparse and default"
            )
        return cls(name, dtype, is_label, **kwargs)

    @property
    def numpy_dtype(self) -> np.dtype:
        """The dtype decoded values have (string columns: str)."""
        if self.dtype == "string":
            return np.dtype(str)
        return np.dtype(_FLOATS.get(self.dtype) or _INTS.get(self.dtype) or _UINTS[self.dtype])

    def record_default(self) -> list[Any]:
        """This column's ``decode_csv`` record default."""
        dtype = self.numpy_dtype
        if self.default is None:
            return [""] if dtype.kind == "U" else [dtype.type(0)]
        try:
            return [dtype.type(self.default) if dtype.kind != "U" else str(self.default)]
        except (TypeError, ValueError):
            raise ConfigError(
                f"Column {self.name!r}: default {self.default!r} is not a {self.dtype}"
            ) from None

    @property
    def keys(self) -> list[str]:
        """The settings DLRover's ``Column`` prints (``str(column)``)."""
        return ["dtype", "name", "is_label"]

    def __repr__(self) -> str:
        return "{" + ";".join(f"{k}={getattr(self, k)}" for k in self.keys) + "}"
