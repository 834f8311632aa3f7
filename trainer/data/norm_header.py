"""The Norm file header (see :mod:`.norm` for the format): its fields, framed (``Check_t.Sum``)
or bare; encoding it, reading and checking it against a reader's settings, and the warning
for the bare Sum header an older tierserve wrote."""

from __future__ import annotations

import os
import struct
import threading
import warnings

import numpy as np

from .errors import DataFileError
from .params import Check_t

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
