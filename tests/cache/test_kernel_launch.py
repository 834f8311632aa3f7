"""The host side of the CUDA lookup kernel, checked on the CPU against the kernel's source:
the arguments ``CacheKernels`` packs match ``ts_cache_lookup``'s parameters one by one (count,
C type, meaning), as do ``ts_cache_insert``'s, the lookup's launch covers one group of
lanes per key, wrong arrays are refused by name, and
the set hash the kernel computes is ``hashing.set_of`` (the statements of the .cu file,
evaluated in 64-bit arithmetic, against the numpy path)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from tierserve.cache import SetAssociativeTable
from tierserve.cache.hashing import set_of
from tierserve.cache.kernels import (
    INSERT_BLOCKS,
    INSERT_KERNEL,
    INSERT_THREADS,
    LOOKUP_KERNEL,
    TABLES_KERNEL,
    THREADS,
    WARP,
    TableDescriptors,
    group_size,
    insert_arguments,
    insert_shape,
    kernel_source,
    launch_shape,
    lookup_arguments,
    request_layout,
    tables_arguments,
)

M64 = (1 << 64) - 1
# C parameter types of the kernel -> what the host must pass: (array?, numpy dtype)
C_TYPES = {
    "long long*": (True, np.int64),
    "unsigned int*": (True, np.uint32),
    "float*": (True, np.float32),
    "unsigned char*": (True, np.uint8),
    "unsigned long long*": (True, np.uint64),
    "long long": (False, np.int64),
    "unsigned long long": (False, np.uint64),
    "int": (False, np.int32),
    "int*": (True, np.int32),
}


def kernel_parameters(name: str = LOOKUP_KERNEL) -> list[tuple[str, str]]:
    """``[(c_type, name), ...]`` of ``extern "C" __global__ void <name>(...)`` in the source."""
    source = kernel_source()
    match = re.search(rf'extern "C" __global__ void {name}\((.*?)\)\s*\{{', source, re.S)
    assert match, f"{name} not found in the kernel source"
    params = []
    for param in match.group(1).split(","):
        words = param.replace("*", " * ").split()
        words = [w for w in words if w not in ("const", "__restrict__")]
        params.append((" ".join(words[:-1]).replace(" *", "*"), words[-1]))
    return params


def typed_arguments(args: tuple, kernel: str, count: int) -> dict:
    """``args`` by parameter name, after checking there are ``count`` of them, one per
    parameter of ``kernel``, each of its parameter's C type (arrays C-contiguous)."""
    params = kernel_parameters(kernel)
    assert len(args) == len(params) == count
    for (c_type, name), arg in zip(params, args):
        is_array, dtype = C_TYPES[c_type]
        if is_array:
            assert isinstance(arg, np.ndarray) and arg.dtype == dtype, (name, c_type)
            assert arg.flags.c_contiguous, name
        else:  # cupy passes a numpy scalar as that exact C type
            assert type(arg) is dtype, (name, c_type, type(arg))
    return {name: arg for (_, name), arg in zip(params, args)}


def make_table(dim: int = 8, ways: int = 4) -> tuple[SetAssociativeTable, np.ndarray]:
    table = SetAssociativeTable(1024, dim, ways)
    rng = np.random.default_rng(dim)
    keys = np.unique(rng.integers(-(2**40), 2**40, 600)).astype(np.int64)
    table.place(keys, rng.standard_normal((keys.size, dim), dtype=np.float32), 1)
    return table, keys


def test_the_arguments_match_the_kernel_parameters():
    table, keys = make_table()
    out = np.empty((keys.size, table.dim), np.float32)
    hit = np.empty(keys.size, np.uint8)
    hits = np.zeros(1, np.uint64)
    args = lookup_arguments(table, keys, out, hit, hits, tick=7)
    by_name = typed_arguments(args, LOOKUP_KERNEL, 12)
    assert by_name["keys"] is keys and by_name["n"] == keys.size
    assert by_name["table_keys"] is table.keys and by_name["ticks"] is table.ticks
    assert by_name["values"] is table.values and by_name["out"] is out and by_name["hit"] is hit
    assert by_name["hits"] is hits
    assert (by_name["num_sets"], by_name["ways"], by_name["dim"]) == (
        table.num_sets, table.ways, table.dim)
    assert by_name["tick"] == 7
    assert lookup_arguments(table, keys, out, hit, hits, tick=None)[-1] == -1  # "do not stamp"


def kernel_group_size(dim: int) -> int:
    """The kernel's ``ts_group_size``, its statements run as Python."""
    source = kernel_source()
    start = source.index("ts_group_size(int dim)")
    body = source[source.index("{", start) + 1 : source.index("return g;", start)]
    env = {"dim": dim}
    for statement in (s.strip() for s in body.split(";") if s.strip()):
        statement = statement.replace("const int ", "").replace("int ", "")
        if statement.startswith("while"):
            cond, action = re.fullmatch(r"while \((.*)\) (g <<= 1)", statement).groups()
            cond = cond.replace("&&", "and")
            while eval(cond, {}, env):
                env["g"] <<= 1
            continue
        target, expr = statement.split(" = ", 1)
        cond, yes, no = re.fullmatch(r"(.*) \? (.*) : (.*)", expr).groups() if "?" in expr \
            else (None, expr, None)
        env[target] = eval(yes if cond is None or eval(cond, {}, env) else no, {}, env)
    return env["g"]


@pytest.mark.parametrize("dim", [1, 2, 3, 4, 8, 16, 17, 33, 64, 128, 129, 512])
def test_the_group_size_is_the_kernels(dim):
    g = group_size(dim)
    assert g == kernel_group_size(dim)
    assert WARP % g == 0  # a group never straddles two warps
    # enough lanes for a row's float4s (or floats), never more than needed below a warp
    units = dim // 4 if dim % 4 == 0 else dim
    assert g >= min(units, WARP) and (g == 1 or g // 2 < units)


@pytest.mark.parametrize("dim", [1, 16, 33, 128])
@pytest.mark.parametrize("n", [1, 7, 8, 9, 255, 1000, 2**20 + 3])
def test_the_launch_gives_each_key_one_group(n, dim):
    (grid,), (block,) = launch_shape(n, dim)
    g = group_size(dim)
    assert block == THREADS and block % WARP == 0 and block <= 1024
    # every key's group exists, and no block is wholly idle
    assert grid * block >= n * g > (grid - 1) * block
    assert grid < 2**31  # the grid's x limit


@pytest.mark.parametrize("n", [1, 63, 64, 65, 5000, 2**22])
@pytest.mark.parametrize("num_sets", [1, 3, 100, 10**6])
def test_the_insert_launch_owns_every_set_once(n, num_sets):
    (grid,), (block,) = insert_shape(n, num_sets)
    assert 1 <= grid <= min(num_sets, INSERT_BLOCKS)  # no block owns no set
    assert block == INSERT_THREADS and block % WARP == 0
    source = kernel_source()
    limit = int(re.search(r"#define TS_INSERT_MAX_THREADS (\d+)", source).group(1))
    assert block <= limit  # the chunk's shared arrays hold a block's keys


def test_the_launch_of_nothing_is_empty_and_negative_sizes_are_refused():
    assert launch_shape(0, 16) == ((0,), (THREADS,))  # CacheKernels does not launch it
    with pytest.raises(ValueError, match="must not be negative"):
        launch_shape(-1, 16)
    with pytest.raises(ValueError, match="must not be negative"):
        insert_shape(-1, 16)


def test_the_insert_arguments_match_the_kernel_parameters():
    table, keys = make_table()
    vectors = np.ones((keys.size, table.dim), np.float32)
    slots = np.empty(keys.size, np.int64)
    counts = np.zeros(2, np.uint64)
    args = insert_arguments(table, keys, vectors, slots, counts, tick=9)
    by_name = typed_arguments(args, INSERT_KERNEL, 12)
    assert by_name["keys"] is keys and by_name["n"] == keys.size
    assert by_name["table_keys"] is table.keys and by_name["ticks"] is table.ticks
    assert by_name["values"] is table.values and by_name["vectors"] is vectors
    assert by_name["slots"] is slots and by_name["counts"] is counts and by_name["tick"] == 9
    assert (by_name["num_sets"], by_name["ways"], by_name["dim"]) == (
        table.num_sets, table.ways, table.dim)
    with pytest.raises(TypeError, match="ts_cache_insert: vectors must be a C-contiguous 2-D float32"):
        insert_arguments(table, keys, vectors.astype(np.float64), slots, counts, 9)
    with pytest.raises(TypeError, match=r"ts_cache_insert: vectors must be \(\d+, 8\)"):
        insert_arguments(table, keys, vectors[:-1], slots, counts, 9)
    with pytest.raises(TypeError, match=r"counts \(2,\)"):
        insert_arguments(table, keys, vectors, slots, np.zeros(1, np.uint64), 9)


def test_arrays_the_kernel_cannot_read_are_refused_by_name():
    table, keys = make_table()
    out = np.empty((keys.size, table.dim), np.float32)
    hit = np.empty(keys.size, np.uint8)
    hits = np.zeros(1, np.uint64)
    with pytest.raises(TypeError, match="keys must be a C-contiguous 1-D int64 array, got 1-D int32"):
        lookup_arguments(table, keys.astype(np.int32), out, hit, hits, None)
    strided = np.repeat(keys, 2)[::2]
    with pytest.raises(TypeError, match=r"keys must .* \(not contiguous\)"):
        lookup_arguments(table, strided, out, hit, hits, None)
    with pytest.raises(TypeError, match="out must be a C-contiguous 2-D float32"):
        lookup_arguments(table, keys, out.astype(np.float64), hit, hits, None)
    with pytest.raises(TypeError, match="hit must be a C-contiguous 1-D uint8"):
        lookup_arguments(table, keys, out, hit.view(bool), hits, None)
    with pytest.raises(TypeError, match="hits must be a C-contiguous 1-D uint64"):
        lookup_arguments(table, keys, out, hit, hits.astype(np.int64), None)
    with pytest.raises(TypeError, match=rf"out must be \({keys.size}, 8\)"):
        lookup_arguments(table, keys, out[:-1], hit, hits, None)
    with pytest.raises(TypeError, match=r"hits \(1,\)"):
        lookup_arguments(table, keys, out, hit, np.zeros(2, np.uint64), None)


def kernel_set_of(key: int, num_sets: int) -> int:
    """The kernel's set of ``key``: its hash statements, run in 64-bit unsigned arithmetic."""
    source = kernel_source()
    start = source.index("ts_set_of(long long key")
    body = source[source.index("{", start) + 1 : source.index("return h;", start)]
    env = {"key": key & M64, "num_sets": num_sets}
    statements = [s.strip() for s in body.split(";") if s.strip()]
    assert len(statements) == 6, statements
    for statement in statements:
        statement = statement.replace("(unsigned long long)", "").replace("ULL", "")
        statement = statement.replace("unsigned long long h =", "h =")
        target, op, expr = re.fullmatch(r"(\w+)\s*([\^*>]*=)\s*(.+)", statement).groups()
        value = eval(expr, {}, dict(env))  # the hex constants and shifts of the source
        if op != "=":
            value = eval(f"h {op[:-1]} value", {}, {"h": env[target], "value": value})
        env[target] = value & M64
    return env["h"]


@pytest.mark.parametrize("num_sets", [1, 3, 1000, 2**31 + 11, 2**32 - 1])
def test_the_kernel_hash_is_set_of(num_sets):
    rng = np.random.default_rng(num_sets)
    keys = np.concatenate([
        [0, 1, -1, 2**63 - 1, -(2**63) + 2], rng.integers(-(2**63), 2**63 - 1, 40, dtype=np.int64),
    ]).astype(np.int64)
    want = set_of(keys, num_sets)
    got = [kernel_set_of(int(k), num_sets) for k in keys]
    np.testing.assert_array_equal(got, want)
    assert all(0 <= s < num_sets for s in got)


def test_a_required_kernel_raises_even_after_a_fallback(caplog, monkeypatch):
    """``use_kernel=True`` must not be ignored because an earlier cache (``use_kernel=None``)
    fell back to the cupy path: the required load tries again and raises why."""
    import logging

    from tierserve.cache import kernels

    try:
        import cupy  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("cupy is installed: the kernel may compile here")
    monkeypatch.setattr(kernels, "_loaded", {})
    with caplog.at_level(logging.WARNING, logger="tierserve.cache.kernels"):
        assert kernels.load_kernels() is None
    assert "CUDA cache kernel unavailable, using the cupy path" in caplog.text
    with pytest.raises(ImportError, match="cupy"):
        kernels.load_kernels(required=True)


def test_the_tables_arguments_match_the_kernel_parameters():
    tables = [make_table(dim, ways)[0] for dim, ways in ((16, 2), (3, 1), (128, 8))]
    desc = TableDescriptors(tables, np)
    assert desc.group == group_size(128) == WARP
    keys = [np.arange(5, dtype=np.int64), np.arange(0, dtype=np.int64), np.arange(2, dtype=np.int64)]
    key_offsets, out_offsets, floats = request_layout([k.size for k in keys], desc.dims)
    packed = np.concatenate([key_offsets, out_offsets, [4, -1, 6], *keys]).astype(np.int64)
    out = np.empty(floats, np.float32)
    hit = np.empty(7, np.uint8)
    hits = np.zeros(3, np.uint64)
    args = tables_arguments(desc, packed, out, hit, hits)
    by_name = typed_arguments(args, TABLES_KERNEL, 16)
    np.testing.assert_array_equal(by_name["keys"], np.concatenate(keys))
    assert by_name["n"] == 7 and by_name["tables"] == 3 and by_name["group"] == WARP
    np.testing.assert_array_equal(by_name["key_offsets"], [0, 5, 5, 7])
    np.testing.assert_array_equal(by_name["out_offsets"], out_offsets)
    np.testing.assert_array_equal(by_name["ticks_now"], [4, -1, 6])
    assert list(by_name["table_keys_at"]) == [t.keys.ctypes.data for t in tables]
    assert list(by_name["ticks_at"]) == [t.ticks.ctypes.data for t in tables]
    assert list(by_name["values_at"]) == [t.values.ctypes.data for t in tables]
    np.testing.assert_array_equal(by_name["num_sets"], [t.num_sets for t in tables])
    np.testing.assert_array_equal(by_name["ways"], [2, 1, 8])
    np.testing.assert_array_equal(by_name["dims"], [16, 3, 128])
    assert by_name["out"] is out and by_name["hit"] is hit and by_name["hits"] is hits
    with pytest.raises(TypeError, match="hits one count per table"):
        tables_arguments(desc, packed, out, hit, np.zeros(2, np.uint64))


@pytest.mark.parametrize("counts,dims", [([1], [16]), ([3, 0, 5], [3, 16, 1]), ([7, 2, 9, 1], [5, 128, 2, 33])])
def test_the_request_layout_packs_tables_without_overlap_and_float4_aligned(counts, dims):
    key_offsets, out_offsets, floats = request_layout(counts, dims)
    np.testing.assert_array_equal(np.diff(key_offsets), counts)
    assert key_offsets[0] == 0
    ends = out_offsets + np.asarray(counts) * np.asarray(dims)
    assert (out_offsets % 4 == 0).all()  # float4 rows of a dim % 4 == 0 table stay aligned
    assert (out_offsets[1:] >= ends[:-1]).all() and ends[-1] <= floats < ends[-1] + 4
