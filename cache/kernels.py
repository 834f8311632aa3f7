"""The CUDA lookup kernel (``cuda/embedding_cache.cu``), compiled with cupy at first use.

The kernel is an optimisation behind :meth:`SetAssociativeTable.lookup
<tierserve.cache.set_associative.SetAssociativeTable.lookup>` on cupy arrays: same layout,
same set function, same results (the GPU tests check it against the ``xp`` path).  When the
source cannot be found or does not compile, the cache logs why and uses the ``xp`` path.
"""

from __future__ import annotations

import importlib.resources
import logging
import threading
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

SOURCE = "embedding_cache.cu"
_THREADS = 256  # 8 warps per block, one warp per key
_lock = threading.Lock()
_loaded: dict[str, object] = {}


def kernel_source(name: str = SOURCE) -> str:
    """The text of a kernel source shipped as package data of ``tierserve.cache.cuda``."""
    try:
        return importlib.resources.files("tierserve.cache.cuda").joinpath(name).read_text()
    except (ModuleNotFoundError, FileNotFoundError):
        pass
    # Editable installs cannot import the data-only package ``tierserve.cache.cuda`` (it
    # has no __init__.py); there the sources sit in the repository's cuda/ folder.
    for folder in (Path(__file__).resolve().parent / "cuda", Path(__file__).resolve().parents[1] / "cuda"):
        if (folder / name).is_file():
            return (folder / name).read_text()
    raise FileNotFoundError(f"CUDA source {name} not found in package tierserve.cache.cuda")


class LookupKernel:
    """``ts_cache_lookup``: probe, gather and stamp ticks in one launch."""

    def __init__(self, cupy, function) -> None:
        self._cp = cupy
        self._fn = function

    def lookup(self, table, keys, tick: int | None = None):
        """Same contract as ``SetAssociativeTable.lookup`` for cupy tables."""
        cp = self._cp
        n = int(keys.size)
        out = cp.empty((n, table.dim), dtype=cp.float32)
        hit = cp.empty(n, dtype=cp.uint8)
        if n:
            blocks = (n * 32 + _THREADS - 1) // _THREADS
            self._fn(
                (blocks,),
                (_THREADS,),
                (
                    keys,
                    np.int64(n),
                    table.keys,
                    table.ticks,
                    np.uint64(table.num_sets),
                    np.int32(table.ways),
                    table.values,
                    np.int32(table.dim),
                    out,
                    hit,
                    np.int64(-1 if tick is None else tick),
                ),
            )
        hit = hit.view(cp.bool_)
        return out, hit, int(cp.count_nonzero(hit))


def load_lookup_kernel(required: bool = False) -> LookupKernel | None:
    """The compiled kernel (once per process), or ``None`` when it cannot be built.

    With ``required`` a failure raises instead of falling back.
    """
    with _lock:
        if "lookup" in _loaded:
            return _loaded["lookup"]
        kernel = None
        try:
            import cupy

            module = cupy.RawModule(code=kernel_source(), options=("--std=c++14",))
            kernel = LookupKernel(cupy, module.get_function("ts_cache_lookup"))
        except Exception as exc:
            if required:
                raise
            log.warning("CUDA cache kernel unavailable, using the cupy path: %s", exc)
        _loaded["lookup"] = kernel
        return kernel
