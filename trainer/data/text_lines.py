"""Text files as datasets: ``TextLineDataset`` (``Dataset.list_files`` gives the file
names)."""

from __future__ import annotations

import gzip
import io
import itertools
import os
import zlib
from typing import Any

import numpy as np

from tierserve.core.errors import InvalidInputError

from .dataset import AUTOTUNE, Dataset
from .dataset_blocks import _LEAF, _as_array, _Block, _BlockIter
from .errors import DataFileError
from .stages import _FlatMapIter


class TextLineDataset(Dataset):
    """The lines of text files (``tf.data.TextLineDataset``), as str without the newline.

    ``filenames``: a path, a list of paths, or a dataset of paths; files are read one after
    the other, or with ``num_parallel_reads`` N > 1 (or ``AUTOTUNE``) N at a time, each in
    its own thread, their lines interleaved one by one (``interleave(cycle_length=N)``).
    ``compression_type``: ``""``/None, ``"GZIP"`` or ``"ZLIB"``; ``buffer_size``: read
    buffer in bytes.
    """

    def __init__(
        self,
        filenames: Any,
        compression_type: str | None = None,
        buffer_size: int | None = None,
        num_parallel_reads: int | None = None,
    ) -> None:
        if compression_type not in (None, "", "GZIP", "ZLIB"):
            raise InvalidInputError(
                f"TextLineDataset: compression_type must be '', 'GZIP' or 'ZLIB', got {compression_type!r}"
            )
        if num_parallel_reads == AUTOTUNE:
            num_parallel_reads = os.cpu_count() or 1
        if num_parallel_reads is not None and int(num_parallel_reads) < 1:
            raise InvalidInputError(
                "TextLineDataset: num_parallel_reads must be >= 1 or AUTOTUNE, got "
                f"{num_parallel_reads}"
            )
        self.parallel_reads = 1 if num_parallel_reads is None else int(num_parallel_reads)
        if buffer_size is not None and int(buffer_size) < 1:
            raise InvalidInputError(f"TextLineDataset: buffer_size must be >= 1, got {buffer_size}")
        self.compression = compression_type or ""
        self.buffer_size = None if buffer_size is None else int(buffer_size)
        if isinstance(filenames, Dataset):
            self.names: Dataset | list[str] = filenames
        else:
            array = _as_array(filenames)
            self.names = [os.fspath(str(x)) for x in array.reshape(-1)]

    def _open(self, path: str):
        buffering = self.buffer_size or io.DEFAULT_BUFFER_SIZE
        try:
            if self.compression == "GZIP":
                raw = io.BufferedReader(gzip.GzipFile(path, "rb"), buffering)
            elif self.compression == "ZLIB":
                raw = io.BufferedReader(_ZlibReader(open(path, "rb")), buffering)  # noqa: SIM115
            else:
                raw = open(path, "rb", buffering=buffering)  # noqa: SIM115 - closed by the iterator
        except OSError as exc:
            raise DataFileError(path, f"cannot open: {exc.strerror or exc}") from None
        return io.TextIOWrapper(raw, encoding="utf-8", newline=None)

    def _blocks(self) -> _BlockIter:
        names = self.names
        if not isinstance(names, Dataset):
            names = Dataset.from_tensor_slices(np.array(names, dtype=object))
        if self.parallel_reads > 1:
            n = self.parallel_reads
            return names.interleave(
                lambda name: _OneFile(self, str(name)), n, 1, num_parallel_calls=n
            )._blocks()
        return _FlatMapIter(names._blocks(), lambda name: _OneFile(self, str(name)))


class _OneFile(Dataset):
    def __init__(self, owner: TextLineDataset, path: str) -> None:
        self.owner, self.path = owner, path

    def _blocks(self) -> _BlockIter:
        return _TextFileIter(self.owner, self.path)


class _TextFileIter(_BlockIter):
    """Reads exactly as many lines as are pulled."""

    def __init__(self, owner: TextLineDataset, path: str) -> None:
        self.owner, self.path = owner, path
        self.file = None
        self.line = 0  # lines read so far
        self.done = False

    def pull(self, max_rows: int) -> _Block | None:
        if self.done:
            return None
        if self.file is None:
            self.file = self.owner._open(self.path)
        try:
            lines = list(itertools.islice(self.file, max_rows))
        except (OSError, EOFError, zlib.error, UnicodeDecodeError) as exc:
            raise DataFileError(self.path, f"line {self.line + 1}: cannot read: {exc}") from None
        if not lines:
            self.close()
            return None
        text = "".join(lines)
        parts = text.split("\n")
        if text.endswith("\n"):
            parts.pop()
        values = np.empty(len(parts), dtype=object)
        values[:] = parts
        lines_no = np.arange(self.line + 1, self.line + 1 + len(parts), dtype=np.int64)
        self.line += len(parts)
        files = np.empty(len(parts), dtype=object)
        files[:] = self.path
        return _Block(_LEAF, [values], (files, lines_no))

    def close(self) -> None:
        self.done = True
        if self.file is not None:
            self.file.close()
            self.file = None


class _ZlibReader(io.RawIOBase):
    """A readable raw stream of a zlib-compressed file."""

    def __init__(self, file) -> None:
        self.file, self.z, self.buf = file, zlib.decompressobj(), b""

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        while not self.buf:
            data = self.file.read(65536)
            if not data:
                self.buf = self.z.flush()
                if not self.buf:
                    return 0
                break
            self.buf = self.z.decompress(data)
        n = min(len(b), len(self.buf))
        b[:n], self.buf = self.buf[:n], self.buf[n:]
        return n

    def close(self) -> None:
        self.file.close()
        super().close()
