"""The dense model file (docs/formats.md, Files and messages 2).

``<prefix>_dense_<iter>.model`` is float32 little-endian: every trainable parameter of the
graph, concatenated in graph order (InnerProduct: W[in, out] then b[out]; BatchNorm: gamma
then beta; MultiCross: per layer w then b).  Non-trainable state (BatchNorm running mean and
variance) goes in ``<same name>.nontrainable``; dense optimizer state in
``<prefix>_opt_dense_<iter>.model``.  Writes are atomic.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from tierserve.core.errors import CorruptModelFileError, InvalidInputError
from tierserve.ps.atomic import atomic_write_file

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


def read_dense_flat(
    path: str | os.PathLike, shapes: Sequence[tuple[int, ...]], what: str = "dense model file"
) -> np.ndarray:
    """Every float of the file at ``path`` (read, never mapped), checked against ``shapes``.

    The file must hold exactly the number of floats the shapes need, all finite, else
    :class:`CorruptModelFileError` gives the file, what it holds and what was expected (a
    file that changes while it is read is caught the same way).
    """
    path = Path(path)
    if not path.is_file():
        raise CorruptModelFileError(f"{what} {path} does not exist")
    expected = sum(int(np.prod(s, dtype=np.int64)) for s in shapes)
    # An anonymous mapping, not the heap: unmapped as soon as it is dropped (a served copy
    # that moves to shared memory must not stay in a heap that malloc never trims), and one
    # float more than needed, so that a longer file shows.
    buffer = np.frombuffer(mmap.mmap(-1, (expected + 1) * DENSE_DTYPE.itemsize), DENSE_DTYPE)
    with open(path, "rb") as f:
        read = f.readinto(memoryview(buffer).cast("B"))
    if read != expected * DENSE_DTYPE.itemsize:
        size = max(path.stat().st_size, read)
        if size % DENSE_DTYPE.itemsize:
            raise CorruptModelFileError(
                f"{what} {path} has {size} bytes, not a whole number of float32 values"
            )
        raise CorruptModelFileError(
            f"{what} {path} holds {size // DENSE_DTYPE.itemsize} float32 values; the graph "
            f"needs {expected}"
        )
    flat = buffer[:expected]
    if not np.isfinite(flat).all():
        raise CorruptModelFileError(f"{what} {path} holds NaN or infinite values")
    return flat


def read_dense_file(
    path: str | os.PathLike,
    shapes: Sequence[tuple[int, ...]],
    what: str = "dense model file",
) -> list[np.ndarray]:
    """Split the file at ``path`` into writable arrays of ``shapes`` (in order); see
    :func:`read_dense_flat` for what is checked.  Serving reads through
    :mod:`tierserve.model.served_weights`."""
    flat = read_dense_flat(path, shapes, what)
    return [a.astype(np.float32, copy=False) for a in split_flat(flat, shapes)]


def split_flat(values: np.ndarray, shapes: Sequence[tuple[int, ...]]) -> list[np.ndarray]:
    """Split a flat vector into arrays of ``shapes``; sizes must add up exactly."""
    sizes = [int(np.prod(s, dtype=np.int64)) for s in shapes]
    if values.size != sum(sizes):
        raise InvalidInputError(f"{values.size} values given, shapes need {sum(sizes)}")
    offsets = np.cumsum([0, *sizes])
    return [values[a:b].reshape(s) for a, b, s in zip(offsets[:-1], offsets[1:], shapes)]
