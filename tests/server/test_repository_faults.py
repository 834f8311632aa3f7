"""Storage that fills up while a version loads: a real full disk under RocksDB (a small tmpfs
mounted for the test) and a real Redis at ``maxmemory`` with ``noeviction``.

A full store is a fault that can go away: the version is refused with a readable reason
(one line, no key or vector bytes), retried with backoff, and loads once space is freed,
without anyone asking.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid

import numpy as np
import pytest
from polling import until

from tierserve.ps.sparse_file import write_sparse_model
from tierserve.server.runtime.loader import RepositoryLoader
from tierserve.server.runtime.repository import ModelRepository

ROWS, DIM = 40_000, 16
RAW_BYTES = ROWS * (8 + 4 * DIM)  # what the table's keys and vectors take


def _store_repository(root, volatile: dict, persistent: dict) -> np.ndarray:
    """An embedding-store model ``emb`` with one table of ROWS rows; returns its vectors."""
    rng = np.random.default_rng(0)
    folder = root / "emb" / "1" / "emb0_sparse_0.model"
    folder.parent.mkdir(parents=True)
    vectors = rng.standard_normal((ROWS, DIM), dtype=np.float32)
    write_sparse_model(folder, np.arange(ROWS, dtype=np.int64), vectors)
    ps = {
        "supportlonglong": True, "volatile_db": volatile, "persistent_db": persistent,
        "models": [{
            "model": "emb", "sparse_files": [folder.name], "max_batch_size": 64,
            "embedding_vecsize_per_table": [DIM], "embedding_table_names": ["table0"],
            "maxnum_catfeature_query_per_table_per_sample": [1], "gpucache": False,
        }],
    }  # fmt: skip
    (root / "ps.json").write_text(json.dumps(ps))
    return vectors


@pytest.fixture
def small_disk(tmp_path):
    """A real 8 MiB filesystem (tmpfs); skipped where mounting one is not allowed."""
    mount = tmp_path / "disk"
    mount.mkdir()
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mount)],
                            capture_output=True, text=True)  # fmt: skip
    if result.returncode != 0:
        pytest.skip(f"cannot mount a small filesystem here (needs root): {result.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _fill(mount, leave: int):
    """Take all but ``leave`` bytes of ``mount`` with one file; returns it."""
    filler = mount / "filler"
    free = shutil.disk_usage(mount).free
    with open(filler, "wb") as f:
        f.truncate(0)
        f.write(b"\0" * max(0, free - leave))  # tmpfs: written bytes take space, holes do not
    return filler


def _loaded(repo: ModelRepository) -> bool:
    repo.poll()
    return repo.entries["emb"].state == "READY"


def _lookup(repo: ModelRepository, keys: np.ndarray) -> np.ndarray:
    handle = repo.acquire("emb")
    try:
        return handle.servable.source.lookup(0, keys)
    finally:
        handle.release()


def _one_readable_line(reason: str) -> None:
    assert reason.isprintable() and "\n" not in reason, reason
    assert "\\x" not in reason and "b'" not in reason, reason  # no key or vector bytes
    assert len(reason) <= 500, len(reason)


@pytest.mark.parametrize("leave", [RAW_BYTES // 10, RAW_BYTES * 21 // 20],
                         ids=["refused-before-writing", "full-while-writing"])  # fmt: skip
def test_a_full_disk_at_load_is_retried_until_space_is_freed(tmp_path, small_disk, leave):
    """The RocksDB tier lives on a small real filesystem, nearly full: the table does not fit
    (refused up front), or seems to and fills the disk while being written (RocksDB then
    refuses every write until reopened).  Either way the version is refused with the disk
    named, retried with backoff, and loads once the filler file is deleted."""
    root = tmp_path / "repo"
    root.mkdir()
    persistent = {"type": "rocks_db", "path": str(small_disk / "rocksdb")}
    vectors = _store_repository(root, {"type": "hash_map", "initial_cache_rate": 0.5}, persistent)
    repo = ModelRepository(RepositoryLoader(), root=root)
    try:
        filler = _fill(small_disk, leave)
        repo.load_all()
        [row] = repo.index()
        assert row["state"] == "UNAVAILABLE", row
        assert "disk is full" in row["reason"] and "retry 2 in" in row["reason"], row
        _one_readable_line(row["reason"])
        for _ in range(3):
            repo.poll()  # not due yet, or due and the disk is still full
        assert repo.entries["emb"].state == "UNAVAILABLE"
        filler.unlink()
        assert until(lambda: _loaded(repo), timeout=60), repo.index()
        keys = np.arange(0, ROWS, 7, dtype=np.int64)
        np.testing.assert_array_equal(_lookup(repo, keys), vectors[keys])  # half from RocksDB
    finally:
        repo.close()
        repo.loader.close()


def test_a_redis_out_of_memory_at_load_is_one_readable_line_and_retried(
    tmp_path, redis_server_factory
):
    """Redis at maxmemory with noeviction refuses the load's writes: the index reason names
    the Redis and its memory limit in one line (never the refused command's key and vector
    bytes), and the version loads once the limit is raised."""
    redis = redis_server_factory()
    client = redis.client()
    client.config_set("maxmemory", str(RAW_BYTES // 2))
    client.config_set("maxmemory-policy", "noeviction")
    root = tmp_path / "repo"
    root.mkdir()
    volatile = {"type": "redis", "address": f"{redis.host}:{redis.port}",
                "num_partitions": 2}  # fmt: skip
    vectors = _store_repository(root, volatile, {"type": "disabled"})
    name = f"emb{uuid.uuid4().hex[:6]}"
    os.rename(root / "emb", root / name)
    config = json.loads((root / "ps.json").read_text())
    config["models"][0]["model"] = name
    (root / "ps.json").write_text(json.dumps(config))
    repo = ModelRepository(RepositoryLoader(), root=root)
    try:
        repo.load_all()
        [row] = repo.index()
        assert row["state"] == "UNAVAILABLE", row
        assert "out of memory" in row["reason"] and "maxmemory" in row["reason"], row
        assert "retry 2 in" in row["reason"], row
        _one_readable_line(row["reason"])
        client.config_set("maxmemory", "0")

        def loaded() -> bool:
            repo.poll()
            return repo.entries[name].state == "READY"

        assert until(loaded, timeout=60), repo.index()
        handle = repo.acquire(name)
        try:
            keys = np.arange(0, ROWS, 7, dtype=np.int64)
            np.testing.assert_array_equal(handle.servable.source.lookup(0, keys), vectors[keys])
        finally:
            handle.release()
    finally:
        repo.close()
        repo.loader.close()
        client.config_set("maxmemory", "0")
