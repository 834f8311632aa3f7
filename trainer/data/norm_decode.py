"""Decoding Norm records (see :mod:`.norm` for the format), vectorised with numpy: fixed-size
records in one gather, variable ones by walking their slot counts, checksums checked; a bad
record raises :class:`~.errors.DataFileError` naming the file, record, slot and field."""

from __future__ import annotations

import numpy as np

from .errors import DataFileError
from .norm_header import _I32
from .records import Records


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
