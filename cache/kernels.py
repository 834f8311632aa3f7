"""The CUDA kernels (``cuda/embedding_cache.cu``), compiled with cupy at first use.

The kernels are optimisations behind :meth:`SetAssociativeTable.lookup
<tierserve.cache.set_associative.SetAssociativeTable.lookup>` and ``insert`` on cupy arrays:
same layout, same set function, same results (the GPU tests check the lookup against the
``xp`` path and the insert key by key against the numpy kernels).  When the
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
INSERT_KERNEL = "ts_cache_insert"
TABLES_KERNEL = "ts_cache_lookup_tables"
#: NVRTC options of every kernel in cuda/ (cupy adds ``-arch`` for the current device).
COMPILE_OPTIONS: tuple[str, ...] = ("--std=c++14",)
THREADS = 256  # lookup: 8 warps per block, one group of group_size(dim) lanes per key
WARP = 32
#: insert: threads per block (a chunk of keys placed at once; the source's
#: TS_INSERT_MAX_THREADS bounds it), keys per block and the most blocks
INSERT_THREADS = 512
INSERT_KEYS_PER_BLOCK = 64
INSERT_BLOCKS = 256
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


def group_size(dim: int) -> int:
    """Lanes per key of ``ts_cache_lookup`` (its ``ts_group_size``): the smallest power of two
    >= the row's float4 count (``dim % 4 == 0``) or float count, at most a warp."""
    units = dim // 4 if dim % 4 == 0 else dim
    g = 1
    while g < units and g < WARP:
        g *= 2
    return g


def launch_shape(n: int, dim: int) -> tuple[tuple[int], tuple[int]]:
    """``(grid, block)`` of a lookup of ``n`` keys of length ``dim``: one group of
    :func:`group_size` lanes per key, ``THREADS`` per block."""
    if n < 0:
        raise ValueError(f"the number of keys must not be negative, got {n}")
    per_block = THREADS // group_size(dim)
    return ((n + per_block - 1) // per_block,), (THREADS,)


def insert_shape(n: int, num_sets: int) -> tuple[tuple[int], tuple[int]]:
    """``(grid, block)`` of ``ts_cache_insert`` over ``n`` keys: block ``b`` owns the sets
    ``s % grid == b`` and walks every key, so the grid stays small (about one block per
    ``INSERT_KEYS_PER_BLOCK`` keys, at most ``INSERT_BLOCKS``, never more than the sets)."""
    if n < 0:
        raise ValueError(f"the number of keys must not be negative, got {n}")
    blocks = max(1, min(num_sets, INSERT_BLOCKS, (n + INSERT_KEYS_PER_BLOCK - 1) // INSERT_KEYS_PER_BLOCK))
    return (blocks,), (INSERT_THREADS,)


def _require(kernel: str, name: str, array, dtype, ndim: int) -> None:
    if array.dtype != dtype or array.ndim != ndim or not array.flags.c_contiguous:
        raise TypeError(
            f"{kernel}: {name} must be a C-contiguous {ndim}-D {np.dtype(dtype).name} "
            f"array, got {array.ndim}-D {array.dtype}"
            + ("" if array.flags.c_contiguous else " (not contiguous)")
        )


def _require_table(kernel: str, table) -> None:
    _require(kernel, "table.keys", table.keys, np.int64, 2)
    _require(kernel, "table.ticks", table.ticks, np.uint32, 1)
    _require(kernel, "table.values", table.values, np.float32, 2)
    if table.keys.shape != (table.num_sets, table.ways) or table.values.shape != (
        table.num_sets * table.ways, table.dim
    ):
        raise TypeError(f"{kernel}: the table's arrays do not match its num_sets, ways, dim")


def _check(kernel: str, table, keys, arrays: list[tuple]) -> int:
    """Check ``keys``, ``table`` and each ``(name, array, dtype, shape)`` of ``arrays`` for
    ``kernel``; return the number of keys.  Raises ``TypeError`` naming what is wrong."""
    _require(kernel, "keys", keys, np.int64, 1)
    _require_table(kernel, table)
    for name, array, dtype, shape in arrays:
        _require(kernel, name, array, dtype, len(shape))
    if any(tuple(array.shape) != shape for _, array, _, shape in arrays):
        (first, *rest) = arrays
        want = ", ".join([f"{first[0]} must be {first[3]}", *(f"{a[0]} {a[3]}" for a in rest)])
        got = ", ".join(str(tuple(a[1].shape)) for a in arrays)
        raise TypeError(f"{kernel}: {want}, got {got}")
    return int(keys.size)


def lookup_arguments(table, keys, out, hit, hits, tick: int | None) -> tuple:
    """The arguments of ``ts_cache_lookup`` in its parameter order, each of its C type.

    ``table`` is a :class:`~tierserve.cache.set_associative.SetAssociativeTable`; ``out``
    float32 ``[len(keys), table.dim]`` and ``hit`` uint8 ``[len(keys)]`` receive the result,
    and the number of hits is added to ``hits`` (uint64 ``[1]``, zeroed by the caller).
    Raises ``TypeError`` naming the array whose dtype or shape the kernel cannot read.
    """
    n = _check(LOOKUP_KERNEL, table, keys, [("out", out, np.float32, (int(keys.size), table.dim)),
                                            ("hit", hit, np.uint8, (int(keys.size),)),
                                            ("hits", hits, np.uint64, (1,))])
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


def insert_arguments(table, keys, vectors, slots, counts, tick: int) -> tuple:
    """The arguments of ``ts_cache_insert`` in its parameter order, each of its C type.

    ``vectors`` float32 ``[len(keys), table.dim]`` are the rows of ``keys``; ``slots`` int64
    ``[len(keys)]`` receives each key's slot (-1: not inserted) and ``counts`` (uint64
    ``[2]``, zeroed by the caller) the numbers inserted and evicted.  Raises ``TypeError``
    naming the array whose dtype or shape the kernel cannot use.
    """
    n = _check(INSERT_KERNEL, table, keys, [
        ("vectors", vectors, np.float32, (int(keys.size), table.dim)),
        ("slots", slots, np.int64, (int(keys.size),)), ("counts", counts, np.uint64, (2,))])
    return (
        keys,
        np.int64(n),
        table.keys,
        table.ticks,
        np.uint64(table.num_sets),
        np.int32(table.ways),
        vectors,
        table.values,
        np.int32(table.dim),
        slots,
        counts,
        np.int64(tick),
    )


def request_layout(counts, dims) -> tuple[np.ndarray, np.ndarray, int]:
    """``(key_offsets, out_offsets, floats)`` of a request over several tables: table ``t``'s
    ``counts[t]`` keys at ``key_offsets[t]`` (int64 ``[T + 1]``), its ``[counts[t], dims[t]]``
    rows at float ``out_offsets[t]`` (int64 ``[T]``, each a multiple of 4 so that float4 rows
    stay 16-byte aligned), ``floats`` in all."""
    counts = np.asarray(counts, dtype=np.int64)
    sizes = counts * np.asarray(dims, dtype=np.int64)
    key_offsets = np.zeros(counts.size + 1, dtype=np.int64)
    np.cumsum(counts, out=key_offsets[1:])
    padded = (sizes + 3) // 4 * 4
    out_offsets = np.zeros(counts.size, dtype=np.int64)
    if counts.size > 1:
        np.cumsum(padded[:-1], out=out_offsets[1:])
    return key_offsets, out_offsets, int(padded.sum())


def _address(array) -> int:
    """The device (cupy) or host (numpy) address of ``array``'s first element."""
    data = getattr(array, "data", None)
    ptr = getattr(data, "ptr", None)
    return int(ptr) if ptr is not None else int(array.ctypes.data)


class TableDescriptors:
    """Where ``ts_cache_lookup_tables`` finds each of a model's tables: their arrays'
    addresses and shapes, as ``xp`` arrays built once (a table's arrays never move)."""

    def __init__(self, tables, xp) -> None:
        if not tables:
            raise ValueError("ts_cache_lookup_tables needs at least one table")
        for table in tables:
            _require_table(TABLES_KERNEL, table)
        self.tables = list(tables)
        self.dims = [int(t.dim) for t in tables]
        self.group = max(group_size(d) for d in self.dims)
        self.table_keys_at = xp.asarray(np.array([_address(t.keys) for t in tables], np.uint64))
        self.ticks_at = xp.asarray(np.array([_address(t.ticks) for t in tables], np.uint64))
        self.values_at = xp.asarray(np.array([_address(t.values) for t in tables], np.uint64))
        self.num_sets = xp.asarray(np.array([t.num_sets for t in tables], np.uint64))
        self.ways = xp.asarray(np.array([t.ways for t in tables], np.int32))
        self.dims_at = xp.asarray(np.array(self.dims, np.int32))


def tables_arguments(desc: TableDescriptors, packed, out, hit, hits) -> tuple:
    """The arguments of ``ts_cache_lookup_tables`` in its parameter order, each of its C type.

    ``packed`` is int64 ``[3T + 1 + n]``: key offsets ``[T + 1]``, out offsets ``[T]``, each
    table's tick ``[T]`` (-1: do not stamp), then every table's keys; ``out`` float32 (the
    floats of :func:`request_layout`), ``hit`` uint8 ``[n]`` and ``hits`` uint64 ``[T]``
    (zeroed by the caller) receive the result.
    """
    name = TABLES_KERNEL
    t = len(desc.tables)
    _require(name, "packed", packed, np.int64, 1)
    _require(name, "out", out, np.float32, 1)
    _require(name, "hit", hit, np.uint8, 1)
    _require(name, "hits", hits, np.uint64, 1)
    n = int(packed.size) - 3 * t - 1
    if n < 0 or hit.shape != (n,) or hits.shape != (t,):
        raise TypeError(f"{name}: packed must hold 3 * {t} + 1 offsets and ticks, hit one flag "
                        f"per key and hits one count per table")
    return (
        packed[3 * t + 1 :],
        np.int64(n),
        np.int32(t),
        np.int32(desc.group),
        packed[: t + 1],
        packed[t + 1 : 2 * t + 1],
        packed[2 * t + 1 : 3 * t + 1],
        desc.table_keys_at,
        desc.ticks_at,
        desc.values_at,
        desc.num_sets,
        desc.ways,
        desc.dims_at,
        out,
        hit,
        hits,
    )


class CacheKernels:
    """The compiled kernels: ``ts_cache_lookup`` (probe, gather and stamp ticks in one
    launch), ``ts_cache_lookup_tables`` (the same over a model's tables in one launch) and
    ``ts_cache_insert`` (a batch's insert in one launch)."""

    def __init__(self, cupy, lookup_fn, insert_fn, tables_fn) -> None:
        self._cp = cupy
        self._lookup = lookup_fn
        self._insert = insert_fn
        self._tables = tables_fn

    def lookup(self, table, keys, tick: int | None = None):
        """Same contract as ``SetAssociativeTable.lookup`` for cupy tables."""
        cp = self._cp
        n = int(keys.size)
        out = cp.empty((n, table.dim), dtype=cp.float32)
        hit = cp.empty(n, dtype=cp.uint8)
        if not n:
            return out, hit.view(cp.bool_), 0
        hits = cp.zeros(1, dtype=cp.uint64)
        grid, block = launch_shape(n, table.dim)
        self._lookup(grid, block, lookup_arguments(table, keys, out, hit, hits, tick))
        # One 8-byte copy (cupy's count_nonzero took 60 us for 26,624 flags on an H200).
        return out, hit.view(cp.bool_), int(hits.get()[0])

    def lookup_tables(self, desc: TableDescriptors, keys, ticks) -> list[tuple]:
        """Look up host int64 ``keys[t]`` in table ``desc.tables[t]`` for every table in one
        launch, with one host->device copy (offsets, ticks and keys packed) and one
        device->host copy (the hit counts).  Returns per table ``(out, hit, hits, keys_d)``:
        device views of its rows ``[n_t, dim_t]`` (garbage at misses), flags, its hit count and
        its keys on the device.  ``ticks[t]`` stamps table ``t``'s hits (``None``: none)."""
        cp = self._cp
        t = len(desc.tables)
        counts = [int(k.size) for k in keys]
        key_offsets, out_offsets, floats = request_layout(counts, desc.dims)
        stamps = np.array([-1 if x is None else x for x in ticks], dtype=np.int64)
        packed = cp.asarray(np.concatenate([key_offsets, out_offsets, stamps, *keys]))
        n = int(key_offsets[-1])
        out = cp.empty(floats, dtype=cp.float32)
        hit = cp.empty(n, dtype=cp.uint8)
        hits = cp.zeros(t, dtype=cp.uint64)
        if n:
            per_block = THREADS // desc.group
            grid = ((n + per_block - 1) // per_block,)
            self._tables(grid, (THREADS,), tables_arguments(desc, packed, out, hit, hits))
        counted = hits.get() if n else np.zeros(t, np.uint64)
        keys_d = packed[3 * t + 1 :]
        result = []
        for i in range(t):
            k, c, o, dim = int(key_offsets[i]), counts[i], int(out_offsets[i]), desc.dims[i]
            result.append((out[o : o + c * dim].reshape(c, dim), hit[k : k + c].view(cp.bool_),
                           int(counted[i]), keys_d[k : k + c]))
        return result

    def insert(self, table, keys, vectors, tick: int):
        """``(slots, inserted, evicted)``: ``SetAssociativeTable.insert`` of the unique
        ``keys`` with rows ``vectors`` (cupy arrays) in one launch; ``slots`` (cupy int64)
        holds each key's slot, -1 where it was not inserted."""
        cp = self._cp
        n = int(keys.size)
        slots = cp.empty(n, dtype=cp.int64)
        if not n:
            return slots, 0, 0
        counts = cp.zeros(2, dtype=cp.uint64)
        vectors = cp.ascontiguousarray(vectors, dtype=cp.float32)
        grid, block = insert_shape(n, table.num_sets)
        self._insert(grid, block, insert_arguments(table, keys, vectors, slots, counts, tick))
        inserted, evicted = (int(c) for c in counts.get())
        return slots, inserted, evicted


def load_kernels(required: bool = False) -> CacheKernels | None:
    """The compiled kernels (once per process), or ``None`` when they cannot be built.

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
            kernel = CacheKernels(cupy, *(module.get_function(name) for name in (
                LOOKUP_KERNEL, INSERT_KERNEL, TABLES_KERNEL)))
        except Exception as exc:
            if required:
                raise
            log.warning("CUDA cache kernel unavailable, using the cupy path: %s", exc)
        _loaded["lookup"] = kernel
        return kernel
