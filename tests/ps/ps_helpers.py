"""Helpers shared by the ps tests: small sparse models with recomputable vectors, the hash
table's home slots recomputed with numpy."""

from __future__ import annotations

import numpy as np

from tierserve.ps.sparse_file import write_sparse_model


def write_model(folder, name, tables, fill=None, seed=0, iteration=0):
    """Write sparse files for ``tables`` = [(keys, dim), ...]; return the models[] entry.

    With ``fill`` every vector is that constant; otherwise vector i of key k is a
    deterministic function of (seed, table, k) so tests can recompute it.
    """
    files = []
    for t, (keys, dim) in enumerate(tables):
        keys = np.asarray(keys, dtype=np.int64)
        path = folder / name / f"{name}{t}_sparse_{iteration}.model"
        write_sparse_model(path, keys, expected(keys, dim, t, seed, fill))
        files.append(str(path))
    return {
        "model": name,
        "sparse_files": files,
        "embedding_vecsize_per_table": [dim for _, dim in tables],
        "maxnum_catfeature_query_per_table_per_sample": [1] * len(tables),
        "default_value_for_each_table": [-(t + 1) for t in range(len(tables))],
    }


def expected(keys, dim, table=0, seed=0, fill=None):
    keys = np.asarray(keys, dtype=np.int64)
    if fill is not None:
        return np.full((keys.size, dim), fill, np.float32)
    base = (keys.astype(np.float64) * 0.001 + seed + table * 10)[:, None]
    return (base + np.arange(dim) * 0.5).astype(np.float32)


def agree(table, ref: dict, dim: int, rng, probes=None) -> None:
    """Every reference key is found with its vector, absent keys are not, keys() matches."""
    assert len(table) == len(ref)
    keys = np.fromiter(ref, dtype=np.int64, count=len(ref))
    absent = rng.integers(-(2**63) + 2, 2**63 - 1, 500, dtype=np.int64)
    if probes is not None:
        absent = np.concatenate([absent, probes])
    absent = absent[~np.isin(absent, keys)]
    mixed = rng.permutation(np.concatenate([keys, absent]))
    got, found = table.lookup(mixed)
    want = np.isin(mixed, keys)
    np.testing.assert_array_equal(found, want)
    if keys.size:
        np.testing.assert_array_equal(got[found], np.stack([ref[k] for k in mixed[found].tolist()]))
    assert not got[~found].any()  # rows of keys not found are zero
    np.testing.assert_array_equal(table.contains(mixed), want)
    assert np.array_equal(np.sort(table.keys()), np.sort(keys))


def home_slots(keys: np.ndarray, seed: int, cap: int) -> np.ndarray:
    """The keys' home slots, as the module docstring of hash_kernels defines them (numpy):
    the first slot of bucket ``((h >> 32) * (cap / 8)) >> 32``."""
    with np.errstate(over="ignore"):
        h = (keys.astype(np.uint64) ^ np.array(seed).astype(np.uint64)) * np.uint64(
            0xFF51AFD7ED558CCD
        )
        h ^= h >> np.uint64(32)
        h *= np.uint64(0xC4CEB9FE1A85EC53)
        bucket = ((h >> np.uint64(32)) * np.uint64(cap // 8)) >> np.uint64(32)
        return bucket.astype(np.int64) * 8
