"""The Norm format: HugeCTR's binary files with a header and variable-length records.

The header is eight little-endian int64: ``error_check`` (1 with checksums, 0 without),
``number_of_records``, ``label_dim``, ``dense_dim``, ``slot_num`` and three reserved (0).
A record is::

    float32 label[label_dim]
    float32 dense[dense_dim]
    slot_num x { int32 nnz; key[nnz] }      key: uint32, or int64 when i64_input_key

With ``Check_t.Sum`` HugeCTR's data writer frames every write it checksums, the header
included, as ``[int32 length][length bytes][uint8 checksum]`` (the checksum is the byte sum
mod 256 of the ``length`` bytes).  So a Sum file is the framed header (4 + 64 + 1 bytes: it
starts ``40 00 00 00 01 00 00 00``) followed by one frame per record; a ``Check_t.Non`` file
is the bare 64-byte header followed by the bare records.

Files tierserve wrote before it framed the header (a bare header with ``error_check`` 1, then
framed records) are still read, with a warning: that header is unambiguous (its first int64
is 1, where HugeCTR's framed one starts with the int32 64).  HugeCTR cannot read them;
rewrite them.

Keys in Norm files are global (slots do not overlap), as HugeCTR expects; the tierserve
generator and converter write them with the slot offsets already added.

This module reads files (:func:`iter_norm_file`, :func:`detect_key_bits`); the header is
:mod:`.norm_header`, writing :mod:`.norm_write`, decoding records :mod:`.norm_decode`, whose
names are re-exported here.
"""

from __future__ import annotations

import contextlib
import mmap
import os
from collections.abc import Iterator

import numpy as np

from .errors import DataFileError
from .norm_decode import _NormDecoder
from .norm_header import (  # noqa: F401 - the header's names, re-exported
    FRAMED_HEADER_SIZE,
    HEADER_DTYPE,
    HEADER_SIZE,
    LegacyNormHeaderWarning,
    _checked_header,
    data_offset,
    encode_norm_header,
    key_dtype,
    norm_num_records,
    read_norm_header,
)
from .norm_write import NormWriter, encode_norm_records, write_norm_file  # noqa: F401
from .params import Check_t
from .records import Records


def iter_norm_file(
    path: str | os.PathLike,
    label_dim: int,
    dense_dim: int,
    slot_num: int,
    check_type: Check_t,
    i64_input_key: bool,
    chunk_records: int = 16384,
) -> Iterator[tuple[int, Records]]:
    """Decode a Norm file in runs of ``chunk_records``: yields (first record index, records).

    The header must match ``label_dim``, ``dense_dim``, ``slot_num`` and ``check_type``; a
    truncated file, a bad checksum or bytes after the last record raise
    :class:`DataFileError` naming the file and record.
    """
    path = str(path)
    header, start = _checked_header(path, label_dim, dense_dim, slot_num, check_type)
    total = header["number_of_records"]
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    buf = np.frombuffer(mm, dtype=np.uint8)
    try:
        decoder = _NormDecoder(
            path,
            buf,
            label_dim,
            dense_dim,
            slot_num,
            Check_t(check_type) is Check_t.Sum,
            key_dtype(i64_input_key),
        )
        pos, first = start, 0
        while first < total:
            count = min(chunk_records, total - first)
            try:
                records, pos = decoder.decode(pos, count, first)
            except DataFileError as exc:
                if first == 0 and _reads_as(decoder, key_dtype(not i64_input_key), count, start):
                    bits, flag = (32, False) if i64_input_key else (64, True)
                    raise DataFileError(
                        path,
                        f"{exc.problem}; the file reads as {bits}-bit keys: set "
                        f"i64_input_key={flag} (CLI: --key-bits {bits})",
                        record=exc.record,
                        slot=exc.slot,
                        field=exc.field,
                    ) from None
                raise
            yield first, records
            first += count
        if pos != size:
            raise DataFileError(
                path,
                f"{size - pos} bytes after the last of its {total} records (header "
                "number_of_records too small, or a corrupt file)",
                record=total,
            )
    finally:
        decoder = buf = None
        with contextlib.suppress(BufferError):  # a view escaped; unmapped when collected
            mm.close()


def _reads_as(decoder: _NormDecoder, kdt: np.dtype, count: int, start: int) -> bool:
    """Whether the first ``count`` records (at most 64, from byte ``start``) decode with keys
    of ``kdt``."""
    other = _NormDecoder(
        decoder.path, decoder.buf, decoder.label_dim, decoder.ld - decoder.label_dim,
        decoder.slot_num, decoder.check_sum, kdt,
    )
    try:
        other.decode(start, min(count, 64), 0)
    except DataFileError:
        return False
    return True


def detect_key_bits(path: str | os.PathLike, label_dim: int, dense_dim: int, slot_num: int,
                    check_type: Check_t) -> int | None:
    """32 or 64 when the first records of a Norm file decode with only that key width, else
    None (both or neither do; the header does not record the width)."""
    header, start = _checked_header(str(path), label_dim, dense_dim, slot_num, check_type)
    count = min(64, header["number_of_records"])
    if count == 0:
        return None
    with open(path, "rb") as f:
        buf = np.fromfile(f, dtype=np.uint8, count=1 << 22)  # 64 records fit in 4 MiB
    fits = []
    for bits in (32, 64):
        decoder = _NormDecoder(str(path), buf, label_dim, dense_dim, slot_num,
                               Check_t(check_type) is Check_t.Sum, key_dtype(bits == 64))
        if _reads_as(decoder, decoder.kdt, count, start):
            fits.append(bits)
    return fits[0] if len(fits) == 1 else None
