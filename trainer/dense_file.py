"""The dense model file (DESIGN.md, Formats 2).

``<prefix>_dense_<iter>.model`` is float32 little-endian: every trainable parameter of the
graph, concatenated in graph order (InnerProduct: W[in, out] then b[out]; BatchNorm: gamma
then beta; MultiCross: per layer w then b).  Non-trainable state (BatchNorm running mean and
variance) goes in ``<same name>.nontrainable``; dense optimizer state in
``<prefix>_opt_dense_<iter>.model``.  Writes are atomic.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from tierserve.ps.atomic import atomic_write_file
from tierserve.ps.errors import CorruptModelFileError, InvalidInputError

DENSE_DTYPE = np.dtype("<f4")
NONTRAINABLE_SUFFIX = ".nontrainable"


def dense_model_name(prefix: str, iteration: int = 0) -> str:
    """``<prefix>_dense_<iteration>.model``."""
    return f"{prefix}_dense_{iteration}.model"


def dense_optimizer_name(prefix: str, iteration: int = 0) -> str:
    """``<prefix>_opt_dense_<iteration>.model``."""
    return f"{prefix}_opt_dense_{iteration}.model"


def write_dense_file(path: str | os.PathLike, arrays: Sequence[np.ndarray]) -> Path:
    """Concatenate ``arrays`` (row-major, as float32 LE) into the file at ``path``, atomically."""
    chunks = [np.ascontiguousarray(a, dtype=DENSE_DTYPE).reshape(-1).view(np.uint8) for a in arrays]
    atomic_write_file(path, chunks)
    return Path(path)


def read_dense_file(
    path: str | os.PathLike,
    shapes: Sequence[tuple[int, ...]],
    what: str = "dense model file",
    mmap: bool = False,
) -> list[np.ndarray]:
    """Split the file at ``path`` into arrays of ``shapes`` (in order).

    ``mmap``: the arrays are read-only views of the file mapped into memory, so processes
    serving the same version share its pages (serving); else writable copies (training).

    The file must hold exactly the number of floats the shapes need, else
    :class:`CorruptModelFileError` gives the file, what it holds and what was expected.
    """
    path = Path(path)
    if not path.is_file():
        raise CorruptModelFileError(f"{what} {path} does not exist")
    size = path.stat().st_size
    if size % DENSE_DTYPE.itemsize:
        raise CorruptModelFileError(
            f"{what} {path} has {size} bytes, not a whole number of float32 values"
        )
    sizes = [int(np.prod(s, dtype=np.int64)) for s in shapes]
    expected = sum(sizes)
    found = size // DENSE_DTYPE.itemsize
    if found != expected:
        raise CorruptModelFileError(
            f"{what} {path} holds {found} float32 values; the graph needs {expected}"
        )
    flat = (
        np.memmap(path, dtype=DENSE_DTYPE, mode="r")
        if mmap
        else np.fromfile(path, dtype=DENSE_DTYPE)
    )
    if not np.isfinite(flat).all():
        raise CorruptModelFileError(f"{what} {path} holds NaN or infinite values")
    out, offset = [], 0
    for shape, n in zip(shapes, sizes):
        out.append(flat[offset : offset + n].reshape(shape).astype(np.float32, copy=False))
        offset += n
    return out


def split_flat(values: np.ndarray, shapes: Sequence[tuple[int, ...]]) -> list[np.ndarray]:
    """Split a flat vector into arrays of ``shapes``; sizes must add up exactly."""
    sizes = [int(np.prod(s, dtype=np.int64)) for s in shapes]
    if values.size != sum(sizes):
        raise InvalidInputError(f"{values.size} values given, shapes need {sum(sizes)}")
    offsets = np.cumsum([0, *sizes])
    return [values[a:b].reshape(s) for a, b, s in zip(offsets[:-1], offsets[1:], shapes)]
