"""The model repository with the real loader: a version is staged, then committed or dropped.

These cross the server <-> ps <-> cache seams: the repository decides, the loader stages a
version's tables in the shared parameter server, and only a commit makes them the served ones.
"""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
from polling import until

from tierserve.clients.demo_model import write_repository
from tierserve.model.batch import Batch, SparseInput
from tierserve.server.runtime.loader import RepositoryLoader
from tierserve.server.runtime.repository import ModelRepository

ROWS = 32


def _batch(seed: int = 0) -> Batch:
    rng = np.random.default_rng(seed)
    keys = rng.integers(0, 300, ROWS * 8).astype(np.int64)
    return Batch(
        label=np.zeros((ROWS, 1), np.float32),
        dense=rng.random((ROWS, 13), dtype=np.float32),
        sparse=(SparseInput(keys, np.arange(ROWS * 8 + 1, dtype=np.int64), 8),),
    )


def _predict(repo: ModelRepository, batch: Batch) -> tuple[str, np.ndarray]:
    handle = repo.acquire("dlrm")
    try:
        return handle.servable.version, handle.servable.model.predict_batch(batch)
    finally:
        handle.release()


def _edit_ps_json(root, **fields) -> None:
    path = root / "ps.json"
    data = json.loads(path.read_text())
    data["models"][0].update(fields)
    path.write_text(json.dumps(data))


def _repository(root, demo) -> ModelRepository:
    write_repository(demo, root)
    return ModelRepository(RepositoryLoader(), root=root)


def _storages(loader: RepositoryLoader) -> list[str]:
    return sorted(loader.parameter_server.volatile.tables())


def test_a_refused_version_changes_nothing_served(tmp_path, demos):
    """Version 2 stages its tables, then fails building its cache: version 1's answers and
    tables stay exactly as they were, and nothing of version 2 is left in the tiers."""
    first, second = demos
    repo = _repository(tmp_path, first)
    try:
        repo.load_all()
        batch = _batch()
        version, before = _predict(repo, batch)
        assert version == "1"
        tables = _storages(repo.loader)
        # A static cache of half the rows cannot hold the table: fails after staging.
        _edit_ps_json(tmp_path, gpucache=True, embedding_cache_type="static", gpucacheper=0.5)
        write_repository(second, tmp_path, version=2)
        repo.poll()
        repo.poll()  # settled: loads, fails
        version, after = _predict(repo, batch)
        assert version == "1"
        np.testing.assert_array_equal(after, before)
        assert _storages(repo.loader) == tables
        entry = repo.entries["dlrm"]
        assert "gpucacheper" in entry.failed["2"].reason
    finally:
        repo.close()
        repo.loader.close()


def test_a_staged_version_serves_only_once_committed_and_the_old_reads_its_own(tmp_path, demos):
    """Staging changes no answer; after the commit, requests still holding version 1 get
    version 1's embeddings (never the new tables under the old dense network)."""
    first, second = demos
    repo = _repository(tmp_path, first)
    try:
        repo.load_all()
        batch = _batch(1)
        _, v1 = _predict(repo, batch)
        old = repo.acquire("dlrm")  # a request in flight on version 1
        write_repository(second, tmp_path, version=2)
        staged = repo.loader("dlrm", "2", tmp_path / "dlrm" / "2", repo.ps_config())
        np.testing.assert_array_equal(_predict(repo, batch)[1], v1)  # staged: nothing changed
        v2 = staged.model.predict_batch(batch)
        assert not np.allclose(v1, v2)
        staged.discard()
        staged.close()
        repo.load("dlrm", "2")
        version, now = _predict(repo, batch)
        assert version == "2"
        np.testing.assert_allclose(now, v2, rtol=1e-6)
        np.testing.assert_array_equal(old.servable.model.predict_batch(batch), v1)
        old.release()  # the last user of version 1: its tables are dropped
        assert until(lambda: len(_storages(repo.loader)) == 1)
    finally:
        repo.close()
        repo.loader.close()


def test_ps_json_cache_settings_reach_the_cache(tmp_path, demos):
    """embedding_cache_type, refresh_interval and refresh_delay are the model's, as written."""
    first, _ = demos
    write_repository(first, tmp_path)
    _edit_ps_json(
        tmp_path, gpucache=True, gpucacheper=1.0, embedding_cache_type="static",
        refresh_interval=3600, refresh_delay=1800,
    )  # fmt: skip
    repo = ModelRepository(RepositoryLoader(), root=tmp_path)
    try:
        repo.load_all()
        handle = repo.acquire("dlrm")
        cache = handle.servable.model.cache.cache(0)
        handle.release()
        assert cache.cache_type == "static"
        assert (cache.refresh_interval, cache.refresh_delay) == (3600.0, 1800.0)
        # and it answers as the model without a cache does
        batch = _batch(2)
        with_cache = _predict(repo, batch)[1]
    finally:
        repo.close()
        repo.loader.close()
    _edit_ps_json(tmp_path, gpucache=False)
    plain = ModelRepository(RepositoryLoader(), root=tmp_path)
    try:
        plain.load_all()
        np.testing.assert_allclose(_predict(plain, batch)[1], with_cache, rtol=1e-6)
    finally:
        plain.close()
        plain.loader.close()


def test_unloading_drops_the_tables_and_shutdown_keeps_them(tmp_path, demos):
    first, _ = demos
    repo = _repository(tmp_path, first)
    try:
        repo.load_all()
        ps = repo.loader.parameter_server
        assert ps.models() == ["dlrm"]
        repo.unload("dlrm")
        assert ps.models() == []
        assert _storages(repo.loader) == []
        repo.load("dlrm")
        assert ps.models() == ["dlrm"]
    finally:
        repo.close()
    # shutdown retires without discarding: the persistent tier keeps the table
    assert ps.persistent.tables() != []
    repo.loader.close()


def test_a_version_whose_backend_is_down_is_retried_until_it_loads(
    tmp_path, demos, redis_server_factory
):
    """Redis is down when the model first loads: the repository shows why and when it will
    retry, and polling loads it once Redis is back, without anyone asking."""
    first, _ = demos
    redis = redis_server_factory()
    write_repository(first, tmp_path)
    data = json.loads((tmp_path / "ps.json").read_text())
    data["volatile_db"] = {"type": "redis", "address": f"{redis.host}:{redis.port}"}
    data["persistent_db"] = {"type": "disabled"}
    (tmp_path / "ps.json").write_text(json.dumps(data))
    redis.stop()
    repo = ModelRepository(RepositoryLoader(), root=tmp_path)
    try:
        repo.load_all()
        [row] = repo.index()
        assert row["state"] == "UNAVAILABLE" and "retry 2 in" in row["reason"], row
        # The first retry waits the base (1 s) with equal jitter: between half and all of it.
        delay = float(re.search(r"retry 2 in ([0-9.]+) s", row["reason"]).group(1))
        assert 0.5 <= delay <= 1.0, row
        redis.start()

        def loaded() -> bool:
            repo.poll()
            return repo.entries["dlrm"].state == "READY"

        assert until(loaded, timeout=20)
        assert _predict(repo, _batch())[0] == "1"
    finally:
        repo.close()
        repo.loader.close()


def test_a_data_error_waits_for_the_files_to_change(tmp_path, demos):
    """A corrupt version is not retried while unchanged; replaced, it loads."""
    first, _ = demos
    write_repository(first, tmp_path)
    dense = next((tmp_path / "dlrm" / "1").glob("*_dense_*.model"))
    good = dense.read_bytes()
    dense.write_bytes(good[:-4])
    loads = []

    class CountingLoader(RepositoryLoader):
        def __call__(self, *args):
            loads.append(args[1])
            return super().__call__(*args)

    repo = ModelRepository(CountingLoader(), root=tmp_path)
    try:
        repo.load_all()
        for _ in range(3):
            repo.poll()
        assert loads == ["1"]
        shutil.copy2(dense, dense.with_suffix(".bak"))
        dense.write_bytes(good)
        dense.with_suffix(".bak").unlink()
        repo.poll()  # files changed: seen once
        repo.poll()  # settled: loaded
        assert repo.entries["dlrm"].state == "READY"
    finally:
        repo.close()
        repo.loader.close()
