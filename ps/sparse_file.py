"""The sparse model folder: one embedding table on disk (docs/formats.md, Files and messages 1).

A folder ``<prefix><i>_sparse_<iter>.model/`` holds ``key`` (int64 LE, N x 8 bytes),
``emb_vector`` (float32 LE, N x dim, row-major, in key order) and, for localized-slot
embeddings, ``slot_id`` (int64 LE, N).  The layout is HugeCTR's.  Keys are always stored as
int64; int32 keys are widened on write and can be narrowed again on read.

A folder converted for a compact ``storage_dtype`` (``tierserve convert --storage-dtype``)
holds ``emb_vector.<dtype>`` instead of ``emb_vector``: the stored rows of
:mod:`tierserve.ps.row_codec` (N rows of whole 4-byte words, in key order), which the server
loads as they are.  :func:`read_rows` reads either for a table's codec.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tierserve.core.errors import CorruptModelFileError, InvalidInputError

from .atomic import atomic_directory, write_file_synced
from .row_codec import RowCodec

KEY_FILE = "key"
VECTOR_FILE = "emb_vector"
SLOT_FILE = "slot_id"

KEY_DTYPE = np.dtype("<i8")
VECTOR_DTYPE = np.dtype("<f4")


def sparse_model_name(prefix: str, index: int, iteration: int = 0) -> str:
    """``<prefix><index>_sparse_<iteration>.model``, the folder name of table ``index``."""
    return f"{prefix}{index}_sparse_{iteration}.model"


def sparse_optimizer_name(prefix: str, index: int, iteration: int = 0) -> str:
    """``<prefix><index>_opt_sparse_<iteration>.model``, the optimizer state of table ``index``."""
    return f"{prefix}{index}_opt_sparse_{iteration}.model"


@dataclass(frozen=True)
class SparseTable:
    """One embedding table as arrays: ``keys[i]`` owns ``embeddings[i]`` (and ``slot_ids[i]``)."""

    keys: np.ndarray
    embeddings: np.ndarray
    slot_ids: np.ndarray | None = None

    @property
    def dim(self) -> int:
        return int(self.embeddings.shape[1])

    def __len__(self) -> int:
        return int(self.keys.shape[0])


def _file_rows(path: Path, row_bytes: int, what: str) -> int:
    if not path.is_file():
        raise CorruptModelFileError(f"sparse model file {path} is missing")
    size = path.stat().st_size
    if row_bytes <= 0 or size % row_bytes:
        raise CorruptModelFileError(
            f"sparse model file {path} has {size} bytes, not a multiple of the "
            f"{row_bytes}-byte {what}"
        )
    return size // row_bytes


def _map(path: Path, dtype: np.dtype, count: int, mmap: bool) -> np.ndarray:
    if count == 0:
        return np.empty(0, dtype=dtype)
    if mmap:
        return np.memmap(path, dtype=dtype, mode="r", shape=(count,))
    return np.fromfile(path, dtype=dtype, count=count)


def read_sparse_model(
    folder: str | os.PathLike,
    embedding_vec_size: int | None = None,
    *,
    key_dtype: np.dtype | type = np.int64,
    mmap: bool = True,
) -> SparseTable:
    """Read one sparse model folder, memory-mapped by default.

    ``embedding_vec_size`` is checked when given and inferred from the file sizes otherwise
    (an empty table with no size given reads as dim 0).  ``key_dtype=np.int32`` narrows the
    keys and fails if one does not fit.  Any inconsistency raises
    :class:`CorruptModelFileError` naming the file.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise CorruptModelFileError(f"sparse model folder {folder} does not exist")
    n = _file_rows(folder / KEY_FILE, KEY_DTYPE.itemsize, "int64 key")
    vector_path = folder / VECTOR_FILE
    vector_bytes = _file_rows(vector_path, VECTOR_DTYPE.itemsize, "float32 value")
    if embedding_vec_size is None:
        if n == 0:
            if vector_bytes:
                raise CorruptModelFileError(
                    f"{vector_path} holds {vector_bytes} floats but {folder / KEY_FILE} no keys"
                )
            dim = 0
        elif vector_bytes % n:
            raise CorruptModelFileError(
                f"{vector_path} holds {vector_bytes} floats, not a multiple of the {n} keys "
                f"in {folder / KEY_FILE}"
            )
        else:
            dim = vector_bytes // n
    else:
        dim = int(embedding_vec_size)
        if vector_bytes != n * dim:
            raise CorruptModelFileError(
                f"{vector_path} holds {vector_bytes} floats; {n} keys x dim {dim} needs {n * dim}"
            )
    keys = _map(folder / KEY_FILE, KEY_DTYPE, n, mmap)
    embeddings = _map(vector_path, VECTOR_DTYPE, n * dim, mmap).reshape(n, dim)
    slot_ids = None
    slot_path = folder / SLOT_FILE
    if slot_path.exists():
        slots = _file_rows(slot_path, KEY_DTYPE.itemsize, "int64 slot id")
        if slots != n:
            raise CorruptModelFileError(f"{slot_path} has {slots} slot ids for {n} keys")
        slot_ids = _map(slot_path, KEY_DTYPE, n, mmap)
    if np.dtype(key_dtype) == np.int32:
        info = np.iinfo(np.int32)
        if n and (keys.min() < info.min or keys.max() > info.max):
            raise CorruptModelFileError(f"{folder / KEY_FILE} holds keys that do not fit int32")
        keys = keys.astype(np.int32)
    return SparseTable(keys, embeddings, slot_ids)


def write_sparse_model(
    folder: str | os.PathLike,
    keys: np.ndarray,
    embeddings: np.ndarray,
    slot_ids: np.ndarray | None = None,
) -> Path:
    """Write one table as a sparse model folder, atomically (temp folder, fsync, rename)."""
    keys = np.asarray(keys)
    embeddings = np.asarray(embeddings)
    if keys.ndim != 1 or not np.issubdtype(keys.dtype, np.integer):
        raise InvalidInputError(f"keys must be a 1-D integer array, got {keys.dtype}{keys.shape}")
    if embeddings.ndim != 2 or embeddings.shape[0] != keys.shape[0]:
        raise InvalidInputError(
            f"embeddings must have shape [{keys.shape[0]}, dim], got {embeddings.shape}"
        )
    if slot_ids is not None:
        slot_ids = np.asarray(slot_ids)
        if slot_ids.shape != keys.shape:
            raise InvalidInputError(f"slot_ids must have shape {keys.shape}, got {slot_ids.shape}")
    folder = Path(folder)
    with atomic_directory(folder) as tmp:
        write_file_synced(tmp / KEY_FILE, [_le_bytes(keys, KEY_DTYPE)])
        write_file_synced(tmp / VECTOR_FILE, [_le_bytes(embeddings, VECTOR_DTYPE)])
        if slot_ids is not None:
            write_file_synced(tmp / SLOT_FILE, [_le_bytes(slot_ids, KEY_DTYPE)])
    return folder


def _le_bytes(array: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """The array's bytes in ``dtype`` (little-endian), without a copy when already so."""
    return np.ascontiguousarray(array, dtype=dtype).reshape(-1).view(np.uint8)


#: Rows encoded per step when a float32 file is converted (bounds the temporaries).
ENCODE_CHUNK = 1 << 18


def compact_vector_file(codec: RowCodec) -> str:
    """The file name of a folder's rows stored as ``codec`` stores them."""
    return VECTOR_FILE if codec.identity else f"{VECTOR_FILE}.{codec.dtype.value}"


def encode_rows(codec: RowCodec, embeddings: np.ndarray, what: str, progress=None) -> np.ndarray:
    """float32 ``[n, dim]`` (e.g. a memory-mapped file) as ``codec``'s words, in chunks;
    ``progress(done, total)`` is called after each."""
    if codec.identity:
        return embeddings
    n = embeddings.shape[0]
    words = np.empty((n, codec.words), dtype=np.float32)
    for c0 in range(0, n, ENCODE_CHUNK):
        c1 = min(n, c0 + ENCODE_CHUNK)
        words[c0:c1] = codec.encode(embeddings[c0:c1], f"{what} rows {c0}..{c1 - 1}")
        if progress is not None:
            progress(c1, n)
    return words


def read_rows(folder: str | os.PathLike, codec: RowCodec, *, mmap: bool = True):
    """``(keys, stored rows)`` of one sparse model folder for a table stored as ``codec``.

    The folder's ``emb_vector.<dtype>`` (written by :func:`write_rows`) is taken as it is;
    else its float32 ``emb_vector`` is encoded (once, here).  A folder converted for another
    dtype only is refused, naming both.
    """
    folder = Path(folder)
    compact = folder / compact_vector_file(codec)
    if codec.identity or not compact.exists():
        if not (folder / VECTOR_FILE).exists() and folder.is_dir():
            others = sorted(p.name for p in folder.glob(f"{VECTOR_FILE}.*"))
            if others:
                raise CorruptModelFileError(
                    f"sparse model folder {folder} holds {', '.join(others)} but the table's "
                    f"storage_dtype is {codec.dtype.value}: convert its float32 {VECTOR_FILE} "
                    f"for {codec.dtype.value} (tierserve convert --storage-dtype)"
                )
        table = read_sparse_model(folder, codec.dim, mmap=mmap)
        return table.keys, encode_rows(codec, table.embeddings, str(folder / VECTOR_FILE))
    n = _file_rows(folder / KEY_FILE, KEY_DTYPE.itemsize, "int64 key")
    rows = _file_rows(compact, 4 * codec.words,
                      f"{codec.dtype.value} row of dim {codec.dim} ({4 * codec.words} bytes)")  # fmt: skip
    if rows != n:
        raise CorruptModelFileError(f"{compact} holds {rows} rows for {n} keys")
    keys = _map(folder / KEY_FILE, KEY_DTYPE, n, mmap)
    words = _map(compact, VECTOR_DTYPE, n * codec.words, mmap).reshape(n, codec.words)
    return keys, words


def write_rows(folder: str | os.PathLike, keys: np.ndarray, words: np.ndarray, codec: RowCodec,
               slot_ids: np.ndarray | None = None) -> Path:  # fmt: skip
    """Write one table's stored rows as a converted sparse model folder, atomically."""
    if codec.identity:
        return write_sparse_model(folder, keys, words, slot_ids)
    folder = Path(folder)
    with atomic_directory(folder) as tmp:
        write_file_synced(tmp / KEY_FILE, [_le_bytes(keys, KEY_DTYPE)])
        write_file_synced(tmp / compact_vector_file(codec), [_le_bytes(words, VECTOR_DTYPE)])
        if slot_ids is not None:
            write_file_synced(tmp / SLOT_FILE, [_le_bytes(slot_ids, KEY_DTYPE)])
    return folder


def convert_sparse_model(src: str | os.PathLike, dst: str | os.PathLike, storage_dtype,
                         embedding_vec_size: int | None = None, progress=None) -> Path:  # fmt: skip
    """Convert a float32 sparse model folder ``src`` into ``dst`` for ``storage_dtype``
    (``tierserve convert --storage-dtype``); ``progress(done, total)`` is called per chunk.
    The rows file keeps the source's modification time (the update replay reads it)."""
    table = read_sparse_model(src, embedding_vec_size)
    codec = RowCodec(storage_dtype, table.dim)
    words = encode_rows(codec, table.embeddings, str(src), progress)
    out = write_rows(dst, table.keys, words, codec, table.slot_ids)
    # the rows are as old as their source: online-update replay starts from that time
    made = os.stat(Path(src) / VECTOR_FILE)
    os.utime(out / compact_vector_file(codec), ns=(made.st_atime_ns, made.st_mtime_ns))
    return out
