"""HugeCTR's file layouts, written for the tests straight from HugeCTR's C++ (v3.5 .. v4.3),
independent of tierserve's code: tests check tierserve's bytes against these.

- Norm: ``DataWriter<Check_t>`` / ``Checker_Traits`` (``HugeCTR/include/data_generator.hpp``)
  append bytes and ``write()`` them as one frame ``[int32 length][bytes][uint8 byte sum]``
  with ``Check_t::Sum``, bare with ``Check_t::None``; the 64-byte ``DataSetHeader`` is one
  such write, then each record is one.  Reading is ``CheckSum::read`` / ``CheckNone::read``
  (``HugeCTR/include/data_readers/check_sum.hpp``) driven as ``DataReaderWorker`` does: the
  header in one read, then per record the label and dense floats, then per slot the nnz and
  its keys.
- Raw (``data_generation_for_raw`` / ``DataReaderWorkerRaw``): per record label and dense
  (float32, or int32 without ``float_label_dense``), then one int32 key per slot.
- Keyset (``ParameterServer::load_keyset_from_file``, ``criteo2hugectr``'s keyset writer):
  the keys, raw, in the model's key type (uint32, or int64 with ``i64_input_key``).
- ``Model::export_predictions``: every value as ``ostream << float << " "`` (six significant
  digits, ``%g``), appended, no newline.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

KEY_FORMAT = {False: "<I", True: "<q"}  # i64_input_key -> the key's struct format


@dataclass
class Sample:
    """One record: its labels, dense values and the keys of each slot."""

    label: list[float]
    dense: list[float]
    slots: list[list[int]]


class DataWriter:
    """HugeCTR's ``DataWriter<Check_t>``: ``append`` bytes, ``write`` them as one frame."""

    def __init__(self, check_sum: bool) -> None:
        self.check_sum = check_sum
        self.out = bytearray()
        self._pending = bytearray()

    def append(self, data: bytes) -> None:
        self._pending += data

    def write(self) -> None:
        body = bytes(self._pending)
        if self.check_sum:
            self.out += struct.pack("<i", len(body)) + body + bytes([sum(body) % 256])
        else:
            self.out += body
        self._pending.clear()


def norm_header(check_sum: bool, n: int, label_dim: int, dense_dim: int, slot_num: int) -> bytes:
    """``DataSetHeader``: eight int64, ``error_check`` 1 with checksums."""
    return struct.pack("<8q", int(check_sum), n, label_dim, dense_dim, slot_num, 0, 0, 0)


def norm_bytes(
    samples: list[Sample], label_dim: int, dense_dim: int, slot_num: int, check_sum: bool,
    i64_input_key: bool,
) -> bytes:
    """A Norm file as HugeCTR's generator (``data_generation_for_test2``) writes it."""
    kf = KEY_FORMAT[i64_input_key]
    w = DataWriter(check_sum)
    w.append(norm_header(check_sum, len(samples), label_dim, dense_dim, slot_num))
    w.write()
    for s in samples:
        for v in s.label + s.dense:
            w.append(struct.pack("<f", v))
        for keys in s.slots:
            w.append(struct.pack("<i", len(keys)))
            for k in keys:
                w.append(struct.pack(kf, k))
        w.write()
    return bytes(w.out)


class ChecksumError(ValueError):
    """``Error_t::DataCheckError`` / ``BrokenFile`` of HugeCTR's checker."""


class CheckNone:
    """HugeCTR's ``CheckNone::read``: the bytes as they are."""

    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def read(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise ChecksumError(f"end of file at byte {self.pos}, {n} more wanted")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out


class CheckSum(CheckNone):
    """HugeCTR's ``CheckSum::read``: a frame may be consumed by several reads; its checksum
    byte is read and compared when its length is used up."""

    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.counter, self.accum = 0, 0

    def read(self, n: int) -> bytes:
        if self.counter == 0:
            self.counter = struct.unpack("<i", super().read(4))[0]
        self.counter -= n
        if self.counter < 0:
            raise ChecksumError(f"counter {self.counter} < 0: a read crosses its frame")
        out = super().read(n)
        self.accum = (self.accum + sum(out)) % 256
        if self.counter == 0:
            stored = super().read(1)[0]
            ok, self.accum = stored == self.accum, 0
            if not ok:
                raise ChecksumError("checksum mismatch")
        return out


def parse_norm(
    data: bytes, check_sum: bool, slot_num: int, i64_input_key: bool
) -> tuple[tuple[int, ...], list[Sample]]:
    """Read a Norm file as ``DataReaderWorker`` does; every byte must be used."""
    kf = KEY_FORMAT[i64_input_key]
    ks = struct.calcsize(kf)
    checker = CheckSum(data) if check_sum else CheckNone(data)
    header = struct.unpack("<8q", checker.read(64))
    if header[0] != int(check_sum) or header[4] != slot_num:
        raise ChecksumError(f"DataHeaderError: {header}")
    label_dim, dense_dim = header[2], header[3]
    samples = []
    for _ in range(header[1]):
        values = struct.unpack(f"<{label_dim + dense_dim}f",
                               checker.read(4 * (label_dim + dense_dim)))
        slots = []
        for _ in range(slot_num):
            nnz = struct.unpack("<i", checker.read(4))[0]
            raw = checker.read(ks * nnz) if nnz else b""
            slots.append([struct.unpack_from(kf, raw, ks * i)[0] for i in range(nnz)])
        samples.append(Sample(list(values[:label_dim]), list(values[label_dim:]), slots))
    if checker.pos != len(data):
        raise ChecksumError(f"{len(data) - checker.pos} bytes after the last record")
    return header, samples


def raw_bytes(
    labels: list[list[float]], dense: list[list[float]], keys: list[list[int]],
    float_label_dense: bool,
) -> bytes:
    """A Raw file as ``data_generation_for_raw<unsigned int>`` writes it."""
    vf = "<f" if float_label_dense else "<I"
    out = bytearray()
    for lab, den, ks in zip(labels, dense, keys):
        for v in lab + den:
            out += struct.pack(vf, v if float_label_dense else int(v))
        for k in ks:
            out += struct.pack("<I", k)
    return bytes(out)


def keyset_bytes(keys: list[int], i64_input_key: bool) -> bytes:
    """A keyset file: the keys, raw, in the model's key type."""
    kf = KEY_FORMAT[i64_input_key]
    return b"".join(struct.pack(kf, k) for k in keys)


def parse_keyset(data: bytes, i64_input_key: bool) -> list[int]:
    """``load_keyset_from_file``: the file's bytes as keys of the model's key type."""
    kf = KEY_FORMAT[i64_input_key]
    ks = struct.calcsize(kf)
    assert len(data) % ks == 0
    return [struct.unpack_from(kf, data, i)[0] for i in range(0, len(data), ks)]


def export_predictions_text(values: list[float]) -> str:
    """What one ``export_predictions`` call appends: each value, ``ostream``-formatted (C's
    ``%g``), then a space."""
    return "".join(f"{v:g} " for v in values)
