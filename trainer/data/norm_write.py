"""Writing Norm files (see :mod:`.norm` for the format): :class:`NormWriter` appends records
and sets the header's record count on close; ``encode_norm_records`` frames and checksums a
batch of records at once."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from tierserve.core.errors import InvalidInputError

from .norm_decode import _byte_sums, _scatter
from .norm_header import data_offset, encode_norm_header, key_dtype
from .params import Check_t
from .records import Records


class NormWriter:
    """Appends records to a new Norm file; the header's record count is set on :meth:`close`.

    The file appears under its name only once closed (written beside it, then renamed).
    """

    def __init__(
        self,
        path: str | os.PathLike,
        label_dim: int,
        dense_dim: int,
        slot_num: int,
        check_type: Check_t = Check_t.Sum,
        i64_input_key: bool = False,
    ) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._tmp = self.path.with_name(f".{self.path.name}.tmp{os.getpid()}")
        self.label_dim, self.dense_dim, self.slot_num = label_dim, dense_dim, slot_num
        self.check_sum = Check_t(check_type) is Check_t.Sum
        self.key_dtype = key_dtype(i64_input_key)
        self.count = 0
        self._file = open(self._tmp, "wb")  # noqa: SIM115 - closed by close()/__exit__
        self._file.write(bytes(data_offset(self.check_sum)))

    def write(self, records: Records) -> None:
        """Append ``records`` (keys as they should appear in the file)."""
        if (records.label.shape[1], records.dense.shape[1], records.slot_num) != (
            self.label_dim,
            self.dense_dim,
            self.slot_num,
        ):
            raise InvalidInputError(
                f"{self.path}: records have label/dense/slots "
                f"{records.label.shape[1]}/{records.dense.shape[1]}/{records.slot_num}, the file "
                f"{self.label_dim}/{self.dense_dim}/{self.slot_num}"
            )
        self._file.write(encode_norm_records(records, self.check_sum, self.key_dtype))
        self.count += len(records)

    def close(self) -> Path:
        """Write the header, then move the file into place."""
        if self._file.closed:
            return self.path
        self._file.seek(0)
        self._file.write(
            encode_norm_header(
                self.count, self.label_dim, self.dense_dim, self.slot_num, self.check_sum
            )
        )
        self._file.close()
        os.replace(self._tmp, self.path)
        return self.path

    def __enter__(self) -> NormWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self._file.close()
            self._tmp.unlink(missing_ok=True)


def write_norm_file(
    path: str | os.PathLike,
    records: Records,
    check_type: Check_t = Check_t.Sum,
    i64_input_key: bool = False,
) -> Path:
    """Write ``records`` as one Norm file."""
    with NormWriter(
        path,
        records.label.shape[1],
        records.dense.shape[1],
        records.slot_num,
        check_type,
        i64_input_key,
    ) as writer:
        writer.write(records)
    return Path(path)


def encode_norm_records(records: Records, check_sum: bool, kdt: np.dtype) -> np.ndarray:
    """The bytes of ``records`` in Norm record layout (vectorised)."""
    n, s = len(records), records.slot_num
    if n == 0:
        return np.zeros(0, dtype=np.uint8)
    ld = records.label.shape[1] + records.dense.shape[1]
    ks = kdt.itemsize
    keys = records.keys
    if kdt == np.dtype("<u4") and len(keys) and (keys.min() < 0 or keys.max() >= 2**32):
        raise InvalidInputError("a key does not fit uint32; write with i64_input_key=True")
    counts = records.counts()
    nnz = counts.sum(axis=1)
    payload = 4 * ld + 4 * s + ks * nnz
    head = 4 if check_sum else 0
    size = payload + head + (1 if check_sum else 0)
    starts = np.zeros(n, dtype=np.int64)
    np.cumsum(size[:-1], out=starts[1:])
    buf = np.zeros(int(size.sum()), dtype=np.uint8)
    if check_sum:
        _scatter(buf, starts, payload.astype("<i4"))
    values = np.hstack([records.label, records.dense]).astype("<f4")
    _scatter(buf, starts + head, values)
    first = records.row_offsets[:-1].reshape(n, s)
    hdr = (starts + head + 4 * ld)[:, None] + 4 * np.arange(s) + ks * (first - first[:, :1])
    _scatter(buf, hdr.ravel(), counts.ravel().astype("<i4"))
    key_pos = np.repeat(hdr.ravel() + 4 - ks * records.row_offsets[:-1], counts.ravel())
    key_pos += ks * np.arange(len(keys), dtype=np.int64)
    _scatter(buf, key_pos, keys.astype(kdt))
    if check_sum:
        ends = starts + head + payload
        buf[ends] = _byte_sums(buf, starts + head, ends)
    return buf
