"""Which partition a key belongs to, the same everywhere (docs/formats.md, Files and messages 7).

A key's partition is ``mix64(key) % num_partitions`` where ``mix64`` is the splitmix64
finalizer (Steele, Lea and Flood, 2014) applied to the key's 64 two's-complement bits::

    z = key
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9   (mod 2**64)
    z = (z ^ (z >> 27)) * 0x94D049BB133111EB   (mod 2**64)
    z =  z ^ (z >> 31)

Any process that shares a Redis Cluster with tierserve must partition keys this way.

This module also holds the codebase's one set of mixing constants: the splitmix64 ones
above (partitions, the trainer's key-seeded initial vectors and generated data) and
MurmurHash3's 64-bit finalizer constants ``FMIX_C1`` / ``FMIX_C2`` (the hash table's slot hash
and the embedding cache's set hash, also in ``cuda/embedding_cache.cu``, which a test checks
against these).  Keys are normalised by :mod:`tierserve.ps.keys`.
"""

from __future__ import annotations

import numpy as np

from .keys import as_keys

#: splitmix64's increment (the golden ratio) and finalizer multipliers.
GOLDEN = 0x9E3779B97F4A7C15
SPLITMIX_M1 = 0xBF58476D1CE4E5B9
SPLITMIX_M2 = 0x94D049BB133111EB
#: MurmurHash3's fmix64 multipliers: slot and set hashes (``h = key * C1;
#: h = (h ^ (h >> 32)) * C2``).
FMIX_C1 = 0xFF51AFD7ED558CCD
FMIX_C2 = 0xC4CEB9FE1A85EC53

_GOLDEN = np.uint64(GOLDEN)
_M1 = np.uint64(SPLITMIX_M1)
_M2 = np.uint64(SPLITMIX_M2)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)

__all__ = [
    "FMIX_C1", "FMIX_C2", "GOLDEN", "SPLITMIX_M1", "SPLITMIX_M2", "as_keys",
    "group_by_partition", "mix64", "partition_of", "splitmix64",
]


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


def splitmix64(x) -> np.ndarray:
    """splitmix64's output for state ``x`` (uint64, elementwise): ``mix64(x + GOLDEN)``."""
    z = np.asarray(x, dtype=np.uint64) + _GOLDEN
    z = (z ^ (z >> _S30)) * _M1
    z = (z ^ (z >> _S27)) * _M2
    return z ^ (z >> _S31)


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
