"""Keys and vectors as the bytes Redis and RocksDB store (docs/formats.md, Files and messages 7 and
8).

A key is its int64's 8 little-endian bytes; a vector is its float32 little-endian bytes.
Conversions are whole-array numpy operations; the per-key lists exist only because the
client libraries take one bytes object per key.
"""

from __future__ import annotations

import numpy as np

from tierserve.core.errors import TierserveError


def key_fields(keys: np.ndarray) -> list[bytes]:
    """Each int64 key as its 8 little-endian bytes (the Redis field and RocksDB key)."""
    return np.ascontiguousarray(keys, dtype="<i8").view("V8").tolist()


def vector_values(embeddings: np.ndarray) -> list[bytes]:
    """Each float32 row as its bytes."""
    e = np.ascontiguousarray(embeddings, dtype="<f4")
    return e.view(f"V{4 * e.shape[1]}").reshape(-1).tolist()


def decode_values(values: list, dim: int, what: str) -> tuple[np.ndarray, np.ndarray]:
    """``(found mask, embeddings of the found)`` from a list of bytes-or-None."""
    ok = np.fromiter(map(bool, values), dtype=bool, count=len(values))
    buf = b"".join(filter(None, values))
    n = int(np.count_nonzero(ok))
    if len(buf) != n * dim * 4:
        raise TierserveError(
            f"{what} holds vectors of {len(buf) // max(n, 1)} bytes, expected {dim * 4} (dim {dim})"
        )
    return ok, np.frombuffer(buf, dtype=np.float32).reshape(n, dim)
