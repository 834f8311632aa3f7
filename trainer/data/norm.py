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
"""

from __future__ import annotations

import contextlib
import mmap
import os
import struct
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from tierserve.core.errors import InvalidInputError

from .errors import DataFileError
from .params import Check_t
from .records import Records

HEADER_DTYPE = np.dtype(
    [
        ("error_check", "<i8"),
        ("number_of_records", "<i8"),
        ("label_dim", "<i8"),
        ("dense_dim", "<i8"),
        ("slot_num", "<i8"),
        ("reserved", "<i8", (3,)),
    ]
)
HEADER_SIZE = HEADER_DTYPE.itemsize  # 64: the header's fields, without a frame
#: Bytes before the first record: the framed header with checksums, the bare one without.
FRAMED_HEADER_SIZE = 4 + HEADER_SIZE + 1
_I32 = struct.Struct("<i")
_I64 = struct.Struct("<q")

_legacy_warned: set[str] = set()
_legacy_lock = threading.Lock()


class LegacyNormHeaderWarning(UserWarning):
    """A Norm file with checksums has the bare header an older tierserve wrote (HugeCTR
    frames it); it is read, but HugeCTR cannot read it."""


def data_offset(check_sum: bool) -> int:
    """Where the first record starts in a file HugeCTR's writer wrote."""
    return FRAMED_HEADER_SIZE if check_sum else HEADER_SIZE


def encode_norm_header(
    number_of_records: int, label_dim: int, dense_dim: int, slot_num: int, check_sum: bool
) -> bytes:
    """The header bytes as HugeCTR's ``DataWriter`` writes them (framed with checksums)."""
    header = np.zeros(1, dtype=HEADER_DTYPE)
    header["error_check"] = int(check_sum)
    header["number_of_records"] = number_of_records
    header["label_dim"] = label_dim
    header["dense_dim"] = dense_dim
    header["slot_num"] = slot_num
    raw = header.tobytes()
    if not check_sum:
        return raw
    return _I32.pack(len(raw)) + raw + bytes([sum(raw) & 0xFF])


def key_dtype(i64_input_key: bool) -> np.dtype:
    """The on-disk key type: int64 or uint32."""
    return np.dtype("<i8") if i64_input_key else np.dtype("<u4")


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


def _byte_sums(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """``sum(buf[starts[i]:ends[i]]) mod 256`` for each i (ranges ascending, non-empty)."""
    lo = int(starts[0])
    cs = np.cumsum(buf[lo : int(ends[-1])], dtype=np.uint8)  # wraps mod 256, as wanted
    before = np.where(starts > lo, cs[np.maximum(starts - lo - 1, 0)], 0).astype(np.uint8)
    return cs[ends - lo - 1] - before


def _scatter(buf: np.ndarray, pos: np.ndarray, values: np.ndarray) -> None:
    """Write row ``i`` of ``values`` (as bytes) at ``buf[pos[i]:]``."""
    if len(pos) == 0:
        return
    raw = np.ascontiguousarray(values).view(np.uint8).reshape(len(pos), -1)
    buf[pos[:, None] + np.arange(raw.shape[1])] = raw


class _Unaligned:
    """Reads values of ``dtype`` at arbitrary byte positions of ``buf[lo:hi]`` by fancy indexing.

    Holds one aligned copy of the range per byte offset modulo the item size, so a read is a
    single gather instead of a gather of bytes.
    """

    def __init__(self, buf: np.ndarray, lo: int, hi: int, dtype: np.dtype) -> None:
        size = dtype.itemsize
        padded = np.zeros(hi - lo + 2 * size, dtype=np.uint8)
        padded[: hi - lo] = buf[lo:hi]
        m = (hi - lo) // size + 1
        self.table = np.concatenate([padded[o : o + size * m].view(dtype) for o in range(size)])
        self.lo, self.m = lo, m
        self.mask, self.shift = size - 1, size.bit_length() - 1  # size is 4 or 8

    def take(self, pos: np.ndarray) -> np.ndarray:
        rel = pos - self.lo
        return self.table[(rel & self.mask) * self.m + (rel >> self.shift)]


def _gather(buf: np.ndarray, pos: np.ndarray, nbytes: int) -> np.ndarray:
    """Rows of ``nbytes`` bytes starting at each of ``pos``: uint8 ``[len(pos), nbytes]``."""
    return buf[pos[:, None] + np.arange(nbytes)]


def read_norm_header(path: str | os.PathLike) -> dict[str, int]:
    """The header fields of a Norm file (framed or bare, see the module docstring)."""
    return _read_header(path)[0]


def _read_header(path: str | os.PathLike) -> tuple[dict[str, int], int, bool]:
    """(header fields, offset of the first record, whether the header is the bare one an
    older tierserve wrote before checksummed records)."""
    with open(path, "rb") as f:
        raw = f.read(FRAMED_HEADER_SIZE)
    if len(raw) < HEADER_SIZE:
        raise DataFileError(
            str(path), f"truncated header: {len(raw)} of {HEADER_SIZE} bytes", record=0
        )
    first = _I64.unpack_from(raw, 0)[0]
    if first in (0, 1):  # bare header: Check_t.Non (0) or an older tierserve's Sum file (1)
        h = np.frombuffer(raw[:HEADER_SIZE], dtype=HEADER_DTYPE)[0]
        return _fields(h), HEADER_SIZE, first == 1
    if _I32.unpack_from(raw, 0)[0] != HEADER_SIZE or _I64.unpack_from(raw, 4)[0] not in (0, 1):
        raise DataFileError(
            str(path),
            f"not a Norm header: it starts with neither error_check 0 / 1 (a bare header) "
            f"nor the frame length {HEADER_SIZE} then error_check (a framed Check_t.Sum header); "
            f"first 8 bytes {raw[:8].hex(' ')}",
            field="error_check",
        )
    if len(raw) < FRAMED_HEADER_SIZE:
        raise DataFileError(
            str(path),
            f"truncated header: {len(raw)} of {FRAMED_HEADER_SIZE} bytes (framed header)",
            record=0,
        )
    body = raw[4 : 4 + HEADER_SIZE]
    if sum(body) & 0xFF != raw[4 + HEADER_SIZE]:
        raise DataFileError(
            str(path),
            f"header checksum mismatch: stored {raw[4 + HEADER_SIZE]:#04x}, "
            f"computed {sum(body) & 0xFF:#04x}",
            field="checksum",
        )
    return _fields(np.frombuffer(body, dtype=HEADER_DTYPE)[0]), FRAMED_HEADER_SIZE, False


def _fields(h) -> dict[str, int]:
    return {name: int(h[name]) for name in HEADER_DTYPE.names if name != "reserved"}


def norm_num_records(path: str | os.PathLike) -> int:
    """The records a Norm file holds, by its header (decoding checks the header against the
    file)."""
    try:
        return max(0, read_norm_header(path)["number_of_records"])
    except FileNotFoundError:
        raise DataFileError(str(path), "data file does not exist") from None


class _NormDecoder:
    """Decodes runs of records of one mapped Norm file."""

    def __init__(self, path, buf, label_dim, dense_dim, slot_num, check_sum, kdt):
        self.path, self.buf = path, buf
        self.ld = label_dim + dense_dim
        self.label_dim, self.slot_num = label_dim, slot_num
        self.check_sum, self.kdt, self.ks = check_sum, kdt, kdt.itemsize
        self.head = 4 if check_sum else 0
        self.min_payload = 4 * self.ld + 4 * slot_num

    def error(self, record: int, problem: str, **kw) -> DataFileError:
        return DataFileError(self.path, problem, record=record, **kw)

    def decode(self, pos: int, count: int, first: int) -> tuple[Records, int]:
        """``count`` records from byte ``pos`` (record index ``first``); returns the end too."""
        fixed = self._decode_fixed(pos, count, first)
        if fixed is not None:
            records, pos = fixed
            if len(records) == count:
                return records, pos
            rest, pos = self._decode_variable(pos, count - len(records), first + len(records))
            return Records.concat([records, rest]), pos
        return self._decode_variable(pos, count, first)

    # -- every record shaped like the first one: one structured view ----------------------

    def _decode_fixed(self, pos: int, count: int, first: int):
        nnz = self._walk_one(pos, first)
        s, ks = self.slot_num, self.ks
        total = int(sum(nnz))
        payload = self.min_payload + ks * total
        uniform = len(set(nnz)) == 1  # e.g. one-hot: all slots in one sub-array field
        fields = [("length", "<i4")] if self.check_sum else []
        if self.ld:
            fields.append(("values", "<f4", (self.ld,)))
        if uniform:
            slot = [("n", "<i4")] + ([("k", self.kdt, (nnz[0],))] if nnz[0] else [])
            fields.append(("slots", np.dtype(slot), (s,)))
        else:
            for i, c in enumerate(nnz):
                fields.append((f"n{i}", "<i4"))
                if c:
                    fields.append((f"k{i}", self.kdt, (c,)))
        if self.check_sum:
            fields.append(("checksum", "u1"))
        dt = np.dtype(fields)
        size = dt.itemsize
        m = min(count, (len(self.buf) - pos) // size)
        view = self.buf[pos : pos + m * size].view(dt)
        if uniform:
            ok = (view["slots"]["n"] == nnz[0]).all(axis=1)
        else:
            ok = np.ones(m, dtype=bool)
            for i, c in enumerate(nnz):
                ok &= view[f"n{i}"] == c
        if self.check_sum:
            ok &= view["length"] == payload
        m = m if ok.all() else int(np.argmin(ok))
        if m == 0:
            return None
        view = view[:m]
        if self.check_sum:
            rows = self.buf[pos : pos + m * size].reshape(m, size)
            sums = rows[:, 4 : 4 + payload].sum(axis=1, dtype=np.uint8)  # wraps mod 256
            self._check_sums(sums, view["checksum"], first)
        values = view["values"].reshape(m, self.ld) if self.ld else np.zeros((m, 0), "<f4")
        if not total:
            keys = np.zeros(0, dtype=np.int64)
        elif uniform:
            keys = view["slots"]["k"].astype(np.int64).ravel()
        else:
            parts = [view[f"k{i}"].reshape(m, c) for i, c in enumerate(nnz) if c]
            keys = np.hstack(parts).astype(np.int64).ravel()
        offsets = np.empty(m * s + 1, dtype=np.int64)
        offsets[0] = 0
        pattern = np.cumsum(np.asarray(nnz, dtype=np.int64))
        offsets[1:] = (np.arange(m, dtype=np.int64)[:, None] * total + pattern).ravel()
        records = Records(
            np.ascontiguousarray(values[:, : self.label_dim], dtype=np.float32),
            np.ascontiguousarray(values[:, self.label_dim :], dtype=np.float32),
            keys,
            offsets,
            s,
        )
        return records, pos + m * size

    def _walk_one(self, pos: int, record: int) -> list[int]:
        """The nnz of each slot of the record at ``pos`` (bounds-checked)."""
        end = len(self.buf)
        q = pos + self.head + 4 * self.ld
        nnz = []
        for slot in range(self.slot_num):
            if q + 4 > end:
                raise self.error(record, "truncated: the file ends inside this record", slot=slot)
            c = _I32.unpack_from(self.buf, q)[0]
            if c < 0:
                raise self.error(record, f"negative nnz {c}", slot=slot)
            nnz.append(c)
            q += 4 + self.ks * c
        if q + (1 if self.check_sum else 0) > end:
            raise self.error(record, "truncated: the file ends inside this record")
        return nnz

    # -- records of any shape: walk the headers, then gather per slot ---------------------

    def _record_starts(self, pos: int, count: int, first: int) -> tuple[np.ndarray, int]:
        buf, end = self.buf, len(self.buf)
        starts = np.empty(count, dtype=np.int64)
        unpack = _I32.unpack_from
        if self.check_sum:
            for i in range(count):
                if pos + 4 > end:
                    raise self.error(first + i, "truncated: the file ends inside this record")
                length = unpack(buf, pos)[0]
                if length < self.min_payload:
                    raise self.error(
                        first + i,
                        f"length field {length} is smaller than the fixed part "
                        f"({self.min_payload} bytes)",
                        field="length",
                    )
                starts[i] = pos
                pos += length + 5
                if pos > end:
                    raise self.error(first + i, "truncated: the file ends inside this record")
            return starts, pos
        ld4, ks, s = 4 * self.ld, self.ks, self.slot_num
        for i in range(count):
            starts[i] = pos
            q = pos + ld4
            for slot in range(s):
                if q + 4 > end:
                    raise self.error(
                        first + i, "truncated: the file ends inside this record", slot=slot
                    )
                c = unpack(buf, q)[0]
                if c < 0:
                    raise self.error(first + i, f"negative nnz {c}", slot=slot)
                q += 4 + ks * c
            if q > end:
                raise self.error(first + i, "truncated: the file ends inside this record")
            pos = q
        return starts, pos

    def _decode_variable(self, pos: int, count: int, first: int) -> tuple[Records, int]:
        starts, end_pos = self._record_starts(pos, count, first)
        buf, s, ks, n = self.buf, self.slot_num, self.ks, count
        words = _Unaligned(buf, pos, end_pos, np.dtype("<i4"))
        body = starts + self.head
        if self.check_sum:
            lengths = words.take(starts).astype(np.int64)
            limit = body + lengths
        else:
            limit = np.full(n, end_pos, dtype=np.int64)
        value_pos = body[:, None] + 4 * np.arange(self.ld)
        values = words.take(value_pos).view("<f4").reshape(n, self.ld)
        hdr = np.empty((n, s), dtype=np.int64)
        counts = np.empty((n, s), dtype=np.int64)
        cur = body + 4 * self.ld
        for slot in range(s):
            over = cur + 4 > limit
            if over.any():
                r = int(np.argmax(over))
                raise self.error(first + r, "record overruns its length field", slot=slot)
            hdr[:, slot] = cur
            c = words.take(cur)
            if (c < 0).any():
                r = int(np.argmax(c < 0))
                raise self.error(first + r, f"negative nnz {c[r]}", slot=slot)
            counts[:, slot] = c
            cur = cur + 4 + ks * c
        if self.check_sum:
            bad = cur != limit
            if bad.any():
                r = int(np.argmax(bad))
                raise self.error(
                    first + r,
                    f"length field says {lengths[r]} bytes but the record holds {cur[r] - body[r]}",
                    field="length",
                )
            self._check_sums(_byte_sums(buf, body, limit), buf[limit], first)
        offsets = np.zeros(n * s + 1, dtype=np.int64)
        np.cumsum(counts.ravel(), out=offsets[1:])
        key_pos = np.repeat(hdr.ravel() + 4 - ks * offsets[:-1], counts.ravel())
        key_pos += ks * np.arange(offsets[-1], dtype=np.int64)
        keys = _Unaligned(buf, pos, end_pos, self.kdt).take(key_pos).astype(np.int64)
        records = Records(
            np.ascontiguousarray(values[:, : self.label_dim], dtype=np.float32),
            np.ascontiguousarray(values[:, self.label_dim :], dtype=np.float32),
            keys,
            offsets,
            s,
        )
        return records, end_pos

    def _check_sums(self, computed: np.ndarray, stored: np.ndarray, first: int) -> None:
        bad = computed.astype(np.uint8) != stored
        if bad.any():
            r = int(np.argmax(bad))
            raise self.error(
                first + r,
                f"checksum mismatch: stored {int(stored[r]):#04x}, "
                f"computed {int(computed[r]):#04x}",
                field="checksum",
            )


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


def _checked_header(
    path, label_dim, dense_dim, slot_num, check_type
) -> tuple[dict[str, int], int]:
    """The header, checked against the reader's settings, and the first record's offset."""
    header, start, legacy = _read_header(path)
    check_sum = Check_t(check_type) is Check_t.Sum
    if header["error_check"] != int(check_sum):
        has = "has checksums (Check_t.Sum)" if header["error_check"] else "has no checksums"
        want = "Sum" if header["error_check"] else "Non"
        raise DataFileError(
            path,
            f"header says {header['error_check']}, the reader expects {int(check_sum)}: the file "
            f"{has}; set check_type=Check_t.{want}",
            field="error_check",
        )
    want = {"label_dim": label_dim, "dense_dim": dense_dim, "slot_num": slot_num}
    for name, expected in want.items():
        if header[name] != expected:
            raise DataFileError(
                path, f"header says {header[name]}, the reader expects {expected}", field=name
            )
    if header["number_of_records"] < 0:
        raise DataFileError(path, "negative record count", field="number_of_records")
    if legacy:
        _warn_legacy(path)
    return header, start


def _warn_legacy(path: str) -> None:
    """Warn once per folder: a dataset's files were all written alike."""
    folder = os.path.dirname(os.path.abspath(path))
    with _legacy_lock:
        if folder in _legacy_warned:
            return
        _legacy_warned.add(folder)
    warnings.warn(
        f"{path}: a Check_t.Sum Norm file with a bare header, as tierserve wrote before it "
        "framed the header as HugeCTR does; it is read, but HugeCTR cannot read it: rewrite it "
        "(further files like it in this folder are not reported)",
        LegacyNormHeaderWarning,
        stacklevel=4,
    )
