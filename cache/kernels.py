"""The CUDA lookup kernel (``cuda/embedding_cache.cu``), compiled with cupy at first use.

The kernel is an optimisation behind :meth:`SetAssociativeTable.lookup
<tierserve.cache.set_associative.SetAssociativeTable.lookup>` on cupy arrays: same layout,
same set function, same results (the GPU tests check it against the ``xp`` path).  When the
source cannot be found or does not compile, the cache logs why and uses the ``xp`` path.

:data:`COMPILE_OPTIONS` are the NVRTC options every kernel is built with, here through cupy
and in CI through :mod:`tierserve.cache.nvrtc` (no GPU needed), so CI compiles what runs.
"""

from __future__ import annotations

import contextlib
import importlib.resources
import logging
import threading
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

SOURCE = "embedding_cache.cu"
LOOKUP_KERNEL = "ts_cache_lookup"
#: NVRTC options of every kernel in cuda/ (cupy adds ``-arch`` for the current device).
COMPILE_OPTIONS: tuple[str, ...] = ("--std=c++14",)
THREADS = 256  # 8 warps per block, one warp per key
WARP = 32
_lock = threading.Lock()
_loaded: dict[str, object] = {}


def _source_folders() -> list[Path]:
    here = Path(__file__).resolve()
    return [here.parent / "cuda", here.parents[1] / "cuda"]


def kernel_source(name: str = SOURCE) -> str:
    """The text of a kernel source shipped as package data of ``tierserve.cache.cuda``."""
    try:
        return importlib.resources.files("tierserve.cache.cuda").joinpath(name).read_text()
    except (ModuleNotFoundError, FileNotFoundError):
        pass
    # Editable installs cannot import the data-only package ``tierserve.cache.cuda`` (it
    # has no __init__.py); there the sources sit in the repository's cuda/ folder.
    for folder in _source_folders():
        if (folder / name).is_file():
            return (folder / name).read_text()
    raise FileNotFoundError(f"CUDA source {name} not found in package tierserve.cache.cuda")


def kernel_source_names() -> list[str]:
    """The names of every ``.cu`` source shipped with the package, sorted."""
    names: set[str] = set()
    with contextlib.suppress(ModuleNotFoundError, FileNotFoundError):
        names = {
            p.name for p in importlib.resources.files("tierserve.cache.cuda").iterdir()
            if p.name.endswith(".cu")
        }
    if not names:
        for folder in _source_folders():
            if folder.is_dir():
                names = {p.name for p in folder.glob("*.cu")}
                break
    return sorted(names)


def launch_shape(n: int) -> tuple[tuple[int], tuple[int]]:
    """``(grid, block)`` of a lookup of ``n`` keys: one warp per key, ``THREADS`` per block."""
    if n < 0:
        raise ValueError(f"the number of keys must not be negative, got {n}")
    return ((n * WARP + THREADS - 1) // THREADS,), (THREADS,)


def _require(name: str, array, dtype, ndim: int) -> None:
    if array.dtype != dtype or array.ndim != ndim or not array.flags.c_contiguous:
        raise TypeError(
            f"ts_cache_lookup: {name} must be a C-contiguous {ndim}-D {np.dtype(dtype).name} "
            f"array, got {array.ndim}-D {array.dtype}"
            + ("" if array.flags.c_contiguous else " (not contiguous)")
        )


def lookup_arguments(table, keys, out, hit, hits, tick: int | None) -> tuple:
    """The arguments of ``ts_cache_lookup`` in its parameter order, each of its C type.

    ``table`` is a :class:`~tierserve.cache.set_associative.SetAssociativeTable`; ``out``
    float32 ``[len(keys), table.dim]`` and ``hit`` uint8 ``[len(keys)]`` receive the result,
    and the number of hits is added to ``hits`` (uint64 ``[1]``, zeroed by the caller).
    Raises ``TypeError`` naming the array whose dtype or shape the kernel cannot read.
    """
    _require("keys", keys, np.int64, 1)
    _require("table.keys", table.keys, np.int64, 2)
    _require("table.ticks", table.ticks, np.uint32, 1)
    _require("table.values", table.values, np.float32, 2)
    _require("out", out, np.float32, 2)
    _require("hit", hit, np.uint8, 1)
    _require("hits", hits, np.uint64, 1)
    n = int(keys.size)
    if out.shape != (n, table.dim) or hit.shape != (n,) or hits.shape != (1,):
        raise TypeError(
            f"ts_cache_lookup: out must be ({n}, {table.dim}), hit ({n},) and hits (1,), got "
            f"{tuple(out.shape)}, {tuple(hit.shape)} and {tuple(hits.shape)}"
        )
    if table.keys.shape != (table.num_sets, table.ways) or table.values.shape != (
        table.num_sets * table.ways, table.dim
    ):
        raise TypeError("ts_cache_lookup: the table's arrays do not match its num_sets, ways, dim")
    return (
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
        hits,
        np.int64(-1 if tick is None else tick),
    )


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
        if not n:
            return out, hit.view(cp.bool_), 0
        hits = cp.zeros(1, dtype=cp.uint64)
        grid, block = launch_shape(n)
        self._fn(grid, block, lookup_arguments(table, keys, out, hit, hits, tick))
        # One 8-byte copy (cupy's count_nonzero took 60 us for 26,624 flags on an H200).
        return out, hit.view(cp.bool_), int(hits.get()[0])


def load_lookup_kernel(required: bool = False) -> LookupKernel | None:
    """The compiled kernel (once per process), or ``None`` when it cannot be built.

    With ``required`` a failure raises instead of falling back (also after an earlier call
    without ``required`` fell back).
    """
    with _lock:
        if "lookup" in _loaded and (_loaded["lookup"] is not None or not required):
            return _loaded["lookup"]
        kernel = None
        try:
            import cupy

            module = cupy.RawModule(code=kernel_source(), options=COMPILE_OPTIONS)
            kernel = LookupKernel(cupy, module.get_function(LOOKUP_KERNEL))
        except Exception as exc:
            if required:
                raise
            log.warning("CUDA cache kernel unavailable, using the cupy path: %s", exc)
        _loaded["lookup"] = kernel
        return kernel
