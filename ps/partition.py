"""Which partition a key belongs to, the same everywhere (DESIGN.md, Formats 7).

A key's partition is ``mix64(key) % num_partitions`` where ``mix64`` is the splitmix64
finalizer (Steele, Lea and Flood, 2014) applied to the key's 64 two's-complement bits::

    z = key
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9   (mod 2**64)
    z = (z ^ (z >> 27)) * 0x94D049BB133111EB   (mod 2**64)
    z =  z ^ (z >> 31)

Any process that shares a Redis Cluster with tierserve must partition keys this way.
"""

from __future__ import annotations

import numpy as np

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)


def as_keys(keys) -> np.ndarray:
    """``keys`` as a contiguous 1-D int64 array (int32 keys are widened)."""
    keys = np.asarray(keys)
    if keys.dtype != np.int64:
        if keys.size and not np.issubdtype(keys.dtype, np.integer):
            from .errors import InvalidInputError

            raise InvalidInputError(f"keys must be integers, got {keys.dtype}")
        keys = keys.astype(np.int64)
    return np.ascontiguousarray(keys.reshape(-1))


def mix64(keys: np.ndarray) -> np.ndarray:
    """The splitmix64 finalizer of each int64 key, as uint64 (a new array)."""
    z = as_keys(keys).view(np.uint64).copy()
    t = z >> _S30
    z ^= t
    z *= _M1
    np.right_shift(z, _S27, out=t)
    z ^= t
    z *= _M2
    np.right_shift(z, _S31, out=t)
    z ^= t
    return z


def partition_of(keys: np.ndarray, num_partitions: int) -> np.ndarray:
    """The partition (0 .. num_partitions-1, int64) of each key."""
    if num_partitions == 1:
        return np.zeros(np.shape(keys)[0], dtype=np.int64)
    z = mix64(keys)
    z %= np.uint64(num_partitions)
    return z.view(np.int64)


def group_by_partition(
    keys: np.ndarray, num_partitions: int
) -> tuple[np.ndarray, np.ndarray]:
    """``(order, bounds)``: ``keys[order[bounds[p]:bounds[p+1]]]`` are partition ``p``'s keys.

    ``order`` is stable, so keys of one partition keep their request order.
    """
    parts = partition_of(keys, num_partitions)
    if num_partitions <= 1 << 16:  # small integers: numpy's stable sort is a radix sort
        parts = parts.astype(np.uint8 if num_partitions <= 256 else np.uint16)
    order = np.argsort(parts, kind="stable")
    bounds = np.zeros(num_partitions + 1, dtype=np.int64)
    np.cumsum(np.bincount(parts, minlength=num_partitions), out=bounds[1:])
    return order, bounds
