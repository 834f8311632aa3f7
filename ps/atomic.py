"""Crash-safe writes: data goes to a temporary sibling, is fsynced, then renamed into place.

A reader therefore sees either the old file or folder or the complete new one, never a
half-written one.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np


def fsync_dir(path: str | os.PathLike) -> None:
    """Flush a directory entry (a rename or a new file) to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_file_synced(
    path: str | os.PathLike, chunks: Iterable[bytes | memoryview | np.ndarray]
) -> None:
    """Write ``chunks`` to ``path`` (not atomically) and fsync the file."""
    with open(path, "wb") as f:
        for chunk in chunks:
            f.write(chunk)
        f.flush()
        os.fsync(f.fileno())


def atomic_write_file(
    path: str | os.PathLike, chunks: Iterable[bytes | memoryview | np.ndarray]
) -> None:
    """Replace the file at ``path`` with ``chunks`` atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write_file_synced(tmp, chunks)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


@contextlib.contextmanager
def atomic_directory(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary folder beside ``path``; on success it replaces ``path`` atomically.

    Files written into the yielded folder must be fsynced by the writer
    (:func:`write_file_synced`).  An existing folder at ``path`` is swapped out with two
    renames and deleted afterwards, so ``path`` never holds a mix of old and new files.
    On an exception the temporary folder is removed and ``path`` is left untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        yield tmp
        fsync_dir(tmp)
        old = None
        if path.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".old", dir=path.parent))
            os.rmdir(old)
            os.rename(path, old)
        os.rename(tmp, path)
        fsync_dir(path.parent)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
