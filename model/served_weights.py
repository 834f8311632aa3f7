"""Dense weights for serving, held in memory that no operation on the model's files can reach.

A memory-mapped dense file is not safe to serve from: a file truncated or copied over in place
(``cp`` opens it with ``O_TRUNC``) turns the next read of the mapping into a SIGBUS that kills
the process, or silently into another run's weights.  So the served weights are *read* (never
mapped) once, checked, and kept:

- in the process's own memory, by default;
- in a worker pool (:data:`SHARED_ENV` names a prefix, set by the pool's parent), in a file
  of ``/dev/shm`` named by the prefix and the weights' SHA-256, written once and mapped
  read-only by every worker serving those weights, so N workers hold one copy.  Only the pool
  writes these files: the model's own files may be copied over, truncated or removed.  A
  worker that finds a file of that name with other bytes (or cannot write one: ``/dev/shm``
  full) keeps a private copy and says so.

:meth:`ServedWeights.release` removes the shared file once the version is discarded (workers
that still map it keep their pages; the memory is freed when the last one unmaps); the pool's
parent removes whatever is left when it stops (:func:`remove_shared`).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import mmap
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .dense_file import DENSE_DTYPE, read_dense_flat, split_flat

log = logging.getLogger(__name__)

#: The environment variable naming the shared-memory prefix of a worker pool's dense weights.
SHARED_ENV = "TIERSERVE_SHARED_DENSE"
SHM_DIR = Path("/dev/shm")


class ServedWeights:
    """The arrays of one dense file (in ``shapes``' order) and where they live."""

    def __init__(self, arrays: list[np.ndarray], shared: Path | None = None) -> None:
        self.arrays = arrays
        self.shared = shared  # the /dev/shm file they map, if any

    def release(self) -> None:
        """Remove the shared file (the mapping stays valid while arrays refer to it)."""
        if self.shared is not None:
            self.shared.unlink(missing_ok=True)  # another worker may have removed it
            self.shared = None


def read_served_weights(
    path: str | os.PathLike, shapes: Sequence[tuple[int, ...]], what: str = "dense model file"
) -> ServedWeights:
    """The weights of dense file ``path`` split into ``shapes``, read-only, in memory of this
    process or of its worker pool (see the module docstring)."""
    flat = read_dense_flat(path, shapes, what)
    prefix = os.environ.get(SHARED_ENV)
    shared = _share(flat, prefix) if prefix else None
    if shared is not None:
        flat, where = shared
    else:
        where = None
        flat.flags.writeable = False
    return ServedWeights(split_flat(flat, shapes), where)


def _share(flat: np.ndarray, prefix: str) -> tuple[np.ndarray, Path] | None:
    """``flat`` as a read-only mapping of the pool's shared copy; None (after a warning)
    when there is no usable one."""
    data = flat.view(np.uint8)
    digest = hashlib.sha256(data).hexdigest()[:32]
    target = SHM_DIR / f"{prefix}-{digest}"
    try:
        if not target.exists():
            _write_once(target, data)
        mapped = _map(target, data.nbytes)
    except OSError as exc:
        log.warning("dense weights kept in this process: cannot share them in %s: %s", target, exc)
        return None
    if mapped is None or not np.array_equal(mapped, data):
        log.warning("dense weights kept in this process: %s holds other bytes", target)
        return None
    return mapped.view(DENSE_DTYPE), target


def _write_once(target: Path, data: np.ndarray) -> None:
    """Write ``data`` to ``target`` whole: a file of its own first, then linked into place
    unless another worker's is there already (a link never replaces a file: every worker then
    maps the first one written)."""
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb", closefd=True) as f:
            f.write(memoryview(data))
        with contextlib.suppress(FileExistsError):
            os.link(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def _map(target: Path, size: int) -> np.ndarray | None:
    """A read-only shared mapping of ``target`` as bytes; None when its size is not ``size``."""
    fd = os.open(target, os.O_RDONLY)
    try:
        if os.fstat(fd).st_size != size:
            return None
        if size == 0:
            return np.empty(0, np.uint8)
        mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
    finally:
        os.close(fd)
    return np.frombuffer(mm, dtype=np.uint8)


def remove_shared(prefix: str) -> None:
    """Remove every shared dense file of ``prefix`` (a pool that stops)."""
    for path in SHM_DIR.glob(f"{prefix}-*"):
        path.unlink(missing_ok=True)
    for path in SHM_DIR.glob(f".{prefix}-*.tmp"):
        path.unlink(missing_ok=True)
