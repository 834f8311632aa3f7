"""HugeCTR's keyset files (the keys a file list trains, raw little-endian in the model's key
width) and :class:`KeysetReader`, the reader handle that trains (file list, keyset) pairs
one after the other through the Embedding Training Cache (:mod:`.etc`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tierserve.core.errors import ConfigError

from .etc_server import CHUNK_ROWS

if TYPE_CHECKING:
    from .etc import EmbeddingTrainingCache


def keyset_dtype(i64_input_key: bool) -> np.dtype:
    """A keyset file's key type: int64 for a model with ``i64_input_key``, else uint32."""
    return np.dtype("<i8") if i64_input_key else np.dtype("<u4")


def keyset_size(path: Any, i64_input_key: bool) -> int:
    """The number of keys in a HugeCTR keyset file of the model's key width, checked: the
    size must be whole keys, and a 32-bit model refuses a file of int64 keys (its first keys'
    high halves, read as uint32 keys, would all be 0, a key a keyset holds once)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"keyset file {path} does not exist")
    size = path.stat().st_size
    dtype = keyset_dtype(i64_input_key)
    width, flag = ("int64", "True") if i64_input_key else ("uint32", "False")
    if size % dtype.itemsize:
        raise ConfigError(f"keyset file {path} has {size} bytes, not a whole number of {width} "
                          f"keys (the model has i64_input_key={flag})")
    if not i64_input_key and size >= 32:
        head = np.fromfile(path, dtype="<u4", count=min(size // 4, 2 * CHUNK_ROWS) // 2 * 2)
        if head[0::2].any() and not head[1::2].any():
            raise ConfigError(
                f"keyset file {path} holds int64 keys (every other 4-byte word is 0) but the "
                "model has i64_input_key=False: write the keyset with 4-byte keys "
                "(write_keyset(path, keys, i64_input_key=False))")
    return size // dtype.itemsize


def read_keyset(path: Any, i64_input_key: bool) -> np.ndarray:
    """The keys of a HugeCTR keyset file of the model's key width, as int64."""
    keyset_size(path, i64_input_key)
    return np.fromfile(path, dtype=keyset_dtype(i64_input_key)).astype(np.int64)


def write_keyset(path: Any, keys: Any, i64_input_key: bool) -> Path:
    """Write ``keys`` as a HugeCTR keyset file of the model's key width (uint32 keys must lie
    in 0 .. 2**32 - 1)."""
    keys = np.asarray(keys)
    if not i64_input_key and keys.size and (keys.min() < 0 or keys.max() >= 2**32):
        bad = keys[(keys < 0) | (keys >= 2**32)][0]
        raise ConfigError(f"keyset key {int(bad)} does not fit a uint32 key "
                          "(i64_input_key=False)")
    path = Path(path)
    keys.astype(keyset_dtype(i64_input_key)).tofile(path)
    return path


def _keyset_chunks(path: Any, i64_input_key: bool, rows: int = CHUNK_ROWS
                   ) -> Iterator[np.ndarray]:
    """The keys of a keyset file, ``rows`` at a time, as int64."""
    dtype = keyset_dtype(i64_input_key)
    with open(path, "rb") as f:
        while True:
            chunk = np.fromfile(f, dtype=dtype, count=rows)
            if not chunk.shape[0]:
                return
            yield chunk.astype(np.int64)


class KeysetReader:
    """A reader handle that trains the (file list, keyset) pairs of ``set_source`` one after
    the other, calling ``update(keyset)`` before each file list; the end of the last is the
    end of the epoch, and ``set_source()`` starts again from the first.

    ``set_source(file_list)`` (HugeCTR's low-level loop: the script calls
    ``EmbeddingTrainingCache.update(keyset)`` itself) reads that file list alone, with no
    keyset of its own, until ``Model.set_source(source, keyset)`` gives pairs again."""

    def __init__(self, inner: Any, cache: EmbeddingTrainingCache) -> None:
        self.inner, self.cache = inner, cache
        self._next = 0
        self._manual = False
        self._start_pair()

    def _start_pair(self) -> bool:
        pairs = self.cache._sources
        if self._manual or self._next >= len(pairs):
            return False
        source, keyset = pairs[self._next]
        self._next += 1
        self.cache.update(keyset)
        self.inner.set_source(source)
        return True

    def next_batch(self):
        while True:
            batch = self.inner.next_batch()
            if batch is not None or not self._start_pair():
                return batch

    def is_eof(self) -> bool:
        while self.inner.is_eof():
            if not self._start_pair():
                return True
        return False

    def set_source(self, file_name: Any = "") -> None:
        if file_name not in ("", None):  # the script's own file list; it updates the keysets
            self._manual = True
            self.inner.set_source(file_name)
            return
        if self._manual:
            self.inner.set_source(file_name)
            return
        self._next = 0
        self._start_pair()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["inner"], name)
