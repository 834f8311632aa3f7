"""Compact embedding rows: the ``storage_dtype`` of a table and the codec of its rows.

A table's rows are stored as ``float32`` (the default), ``float16`` or ``int8``.  Every tier
and the embedding cache store a row as a fixed number of 4-byte *words*, so the hash maps'
kernels, Redis, RocksDB and the cache move compact rows exactly as they move float32 ones;
:class:`RowCodec` turns float32 ``[n, dim]`` into words (:meth:`~RowCodec.encode`, on insert,
load and online update) and back (:meth:`~RowCodec.decode`, on lookup).  Lookups always
answer float32.

Row layouts (little-endian; docs/formats.md):

- ``float32``: ``dim`` float32 values (``dim`` words, the layout tierserve always had);
- ``float16``: ``dim`` IEEE half values, zero-padded to a whole word;
- ``int8``: row-wise 8-bit quantization as FBGEMM's fused 8-bit rows (TorchRec's
  row-wise quantized tables): the row's float32 ``scale`` and float32 ``bias``, then
  ``dim`` unsigned bytes ``q``, zero-padded to a whole word; a value is
  ``q * scale + bias``, with ``bias`` the row's minimum and ``scale = (max - min) / 255``,
  so each element is within ``scale / 2`` of the float32 it came from.  Scale and bias come
  first (FBGEMM's fused rows put them after ``q``; TorchRec's inference tables put them
  first), so they stay aligned for any ``dim``.

Values that a layout cannot hold are refused (:class:`InvalidInputError`), never stored
altered: NaN and infinities in every layout, magnitudes above 65504 in ``float16``, and in
``int8`` rows whose range (max - min) is beyond float32's (about 3.4e38).
"""

from __future__ import annotations

from enum import Enum

import numpy as np

from tierserve.core.errors import InvalidInputError

#: The largest finite float16.
FP16_MAX = 65504.0
#: The widest row (max - min) int8 stores: ``q * scale`` must stay a finite float32.
INT8_MAX_SPAN = float(np.finfo(np.float32).max) * (1 - 2.0**-20)


class StorageDtype(str, Enum):
    """How a table's rows are stored (``ps.json``'s ``storage_dtype``)."""

    float32 = "float32"
    float16 = "float16"
    int8 = "int8"


STORAGE_DTYPES = tuple(d.value for d in StorageDtype)
#: Each dtype's layout code in :mod:`tierserve.ps.row_kernels` (kept equal to its constants).
_LAYOUTS = {StorageDtype.float32: 0, StorageDtype.float16: 1, StorageDtype.int8: 2}


def storage_dtype(value) -> StorageDtype:
    """``value`` as a :class:`StorageDtype`, or :class:`InvalidInputError` naming it."""
    try:
        return StorageDtype(value)
    except ValueError:
        raise InvalidInputError(
            f"storage_dtype {value!r} is not one of {', '.join(STORAGE_DTYPES)}"
        ) from None


def row_bytes(dtype: StorageDtype, dim: int) -> int:
    """Bytes of one stored row of ``dim`` values, before padding to whole words."""
    dtype = StorageDtype(dtype)
    if dtype is StorageDtype.float32:
        return 4 * dim
    if dtype is StorageDtype.float16:
        return 2 * dim
    return dim + 8


class RowCodec:
    """The rows of one table: ``dim`` float32 values stored as ``words`` 4-byte words."""

    def __init__(self, dtype, dim: int) -> None:
        self.dtype = storage_dtype(dtype)
        self.dim = int(dim)
        if self.dim <= 0:
            raise InvalidInputError(f"embedding dim must be positive, got {dim}")
        self.row_bytes = row_bytes(self.dtype, self.dim)
        self.words = (self.row_bytes + 3) // 4

    @property
    def layout(self) -> int:
        """The layout code of the compiled kernels (:mod:`tierserve.ps.row_kernels`)."""
        return _LAYOUTS[self.dtype]

    @property
    def identity(self) -> bool:
        """Whether rows are stored as the float32 values themselves."""
        return self.dtype is StorageDtype.float32

    def __repr__(self) -> str:
        return f"RowCodec({self.dtype.value}, dim={self.dim})"

    # --- float32 -> words --------------------------------------------------------------------

    def encode(self, embeddings, what: str = "embeddings") -> np.ndarray:
        """float32 ``[n, dim]`` as stored words: float32 ``[n, words]`` holding the row bytes.

        float32 rows are returned as they are (no copy when already contiguous float32).
        """
        emb = np.ascontiguousarray(embeddings, dtype=np.float32)
        if emb.ndim != 2 or emb.shape[1] != self.dim:
            raise InvalidInputError(
                f"{what} must have shape [n, {self.dim}], got {list(emb.shape)}"
            )
        if self.identity:
            return emb
        self._check_values(emb, what)
        out = np.zeros((emb.shape[0], 4 * self.words), dtype=np.uint8)
        if self.dtype is StorageDtype.float16:
            out[:, : self.row_bytes] = emb.astype("<f2").view(np.uint8)
        else:
            q, scale, bias = quantize_int8(emb)
            out[:, 8 : 8 + self.dim] = q
            sb = np.stack([scale, bias], axis=1).astype("<f4")
            out[:, :8] = sb.view(np.uint8)
        return out.view(np.float32)

    def _check_values(self, emb: np.ndarray, what: str) -> None:
        if emb.size == 0:
            return
        if not np.isfinite(emb).all():
            bad = np.argwhere(~np.isfinite(emb))[0]
            raise InvalidInputError(
                f"{what}: row {int(bad[0])} holds {float(emb[tuple(bad)])} at column {int(bad[1])}; "
                f"storage_dtype {self.dtype.value} stores finite values only"
            )
        if self.dtype is StorageDtype.float16:
            peak = float(np.abs(emb).max())
            if peak > FP16_MAX:
                row = int(np.argmax(np.abs(emb).max(axis=1)))
                raise InvalidInputError(
                    f"{what}: row {row} holds a value of magnitude {peak:g}, beyond float16's "
                    f"{FP16_MAX:g}; store this table as float32 or int8 (storage_dtype)"
                )

    # --- words -> float32 --------------------------------------------------------------------

    def decode(self, words, xp=np):
        """Stored words ``[n, words]`` (numpy, or cupy with ``xp=cupy``) as float32 ``[n, dim]``."""
        if self.identity:
            return words
        words = xp.ascontiguousarray(words)
        if xp is np:
            from . import row_kernels  # numba: imported on first use of a compact table

            out = np.empty((words.shape[0], self.dim), dtype=np.float32)
            row_kernels.decode_rows(words, self.layout, out)
            return out
        b = words.view(xp.uint8)
        if self.dtype is StorageDtype.float16:
            return xp.ascontiguousarray(b[:, : self.row_bytes]).view(xp.float16).astype(xp.float32)
        return b[:, 8 : 8 + self.dim].astype(xp.float32) * words[:, :1] + words[:, 1:2]


def quantize_int8(emb: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Row-wise 8-bit quantization of finite float32 ``[n, dim]``: ``(q uint8, scale, bias)``
    float32 with ``q * scale + bias`` within ``scale / 2`` of each value (plus float32
    rounding of that product and sum).

    ``bias`` is the row minimum and ``scale`` the range / 255 (rounded up to a float32 that
    covers the range), both float32; ``q`` is
    computed from those float32 values (in float64), so the bound holds for what is stored.
    A constant row has scale 0 and is stored exactly.
    """
    lo = emb.min(axis=1) if emb.size else np.zeros(emb.shape[0], np.float32)
    hi = emb.max(axis=1) if emb.size else lo
    span = hi.astype(np.float64) - lo
    scale = (span / 255.0).astype(np.float32)
    # rounded up where float32 rounded it down (or to 0: tiny ranges), so 255 steps span the row
    short = scale.astype(np.float64) * 255.0 < span
    scale[short] = np.nextafter(scale[short], np.float32(np.inf))
    if (span > INT8_MAX_SPAN).any():  # q * scale would overflow float32 when decoded
        row = int(np.argmax(span > INT8_MAX_SPAN))
        raise InvalidInputError(
            f"row {row} spans {float(lo[row]):g} .. {float(hi[row]):g}, a range beyond "
            "float32: int8 storage cannot scale it; store this table as float32"
        )
    bias = lo
    s64 = scale.astype(np.float64)[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(s64 > 0, np.rint((emb - bias.astype(np.float64)[:, None]) / s64), 0.0)
    return np.clip(q, 0, 255).astype(np.uint8), scale, bias


