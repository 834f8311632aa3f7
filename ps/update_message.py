"""The Kafka embedding-update message (docs/formats.md, Files and messages 6).

Value layout, all little-endian: magic ``b"HCTR"``, u32 ``value_size`` (bytes per vector),
then N records of int64 key + ``value_size`` bytes of float32.  The topic is the table tag
and the message key is empty.  Encoding and decoding are single numpy operations.
"""

from __future__ import annotations

import struct

import numpy as np

from tierserve.core.errors import InvalidInputError, MalformedMessageError

MAGIC = b"HCTR"
HEADER = struct.Struct("<4sI")
KEY_BYTES = 8


def _record_dtype(dim: int) -> np.dtype:
    return np.dtype([("key", "<i8"), ("embedding", "<f4", (dim,))])


def encode_update(keys: np.ndarray, embeddings: np.ndarray) -> bytes:
    """Pack ``keys`` (int32 or int64, [n]) and ``embeddings`` (float32, [n, dim]) into a value."""
    keys = np.asarray(keys)
    embeddings = np.asarray(embeddings)
    if keys.ndim != 1 or not np.issubdtype(keys.dtype, np.integer):
        raise InvalidInputError(f"keys must be a 1-D integer array, got {keys.dtype}{keys.shape}")
    if embeddings.ndim != 2 or embeddings.shape[0] != keys.shape[0] or embeddings.shape[1] < 1:
        raise InvalidInputError(
            f"embeddings must have shape [{keys.shape[0]}, dim >= 1], got {embeddings.shape}"
        )
    dim = embeddings.shape[1]
    records = np.empty(keys.shape[0], dtype=_record_dtype(dim))
    records["key"] = keys
    records["embedding"] = embeddings
    return HEADER.pack(MAGIC, dim * 4) + records.tobytes()


def decode_update(
    value: bytes | bytearray | memoryview, expected_dim: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Unpack a value into ``(keys int64 [n], embeddings float32 [n, dim])``.

    Raises :class:`MalformedMessageError` for a short or foreign value, a bad magic, a
    ``value_size`` that is not a positive multiple of 4, a body that is not whole records,
    a dimension other than ``expected_dim``, or non-finite values.
    """
    if value is None:
        raise MalformedMessageError("update message has no value")
    try:
        view = memoryview(value).cast("B")
    except TypeError:
        raise MalformedMessageError(
            f"update message value is a {type(value).__name__}, not bytes"
        ) from None
    if view.nbytes < HEADER.size:
        raise MalformedMessageError(
            f"update message of {view.nbytes} bytes is shorter than its {HEADER.size}-byte header"
        )
    magic, value_size = HEADER.unpack_from(view)
    if magic != MAGIC:
        raise MalformedMessageError(f"update message starts with {magic!r}, expected {MAGIC!r}")
    if value_size == 0 or value_size % 4:
        raise MalformedMessageError(
            f"update message value_size {value_size} is not a positive multiple of 4"
        )
    dim = value_size // 4
    if expected_dim is not None and dim != expected_dim:
        raise MalformedMessageError(
            f"update message carries vectors of dim {dim}, the table has dim {expected_dim}"
        )
    body = view[HEADER.size :]
    record_bytes = KEY_BYTES + value_size
    if body.nbytes % record_bytes:
        raise MalformedMessageError(
            f"update message body of {body.nbytes} bytes is not a whole number of "
            f"{record_bytes}-byte records (truncated?)"
        )
    if not body.nbytes:
        # No record: numpy cannot even describe a record of a header's largest value_size
        # (its dtype must fit a C int), so none is built.
        return np.empty(0, np.int64), np.empty((0, dim), np.float32)
    records = np.frombuffer(body, dtype=_record_dtype(dim))
    keys = records["key"].astype(np.int64)
    embeddings = np.ascontiguousarray(records["embedding"], dtype=np.float32)
    if not np.isfinite(embeddings).all():
        raise MalformedMessageError("update message holds NaN or infinite values")
    return keys, embeddings.reshape(len(keys), dim)


def announced_records(value) -> int:
    """The records a value's header and length announce, without decoding it (at least 1:
    a value too short to say counts as one)."""
    if not value or len(value) < HEADER.size:
        return 1
    value_size = int.from_bytes(value[4:8], "little")
    return max(1, (len(value) - HEADER.size) // (KEY_BYTES + value_size))
