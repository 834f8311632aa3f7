"""The checksum manifest the trainer writes and the server's loader verifies."""

from __future__ import annotations

import json

import pytest

from tierserve.clients.demo_model import train_demo_model, write_repository
from tierserve.core.errors import CorruptModelFileError
from tierserve.model import manifest
from tierserve.server.runtime.loader import RepositoryLoader
from tierserve.server.runtime.repository import ModelRepository


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    work = tmp_path_factory.mktemp("manifest")
    return (
        train_demo_model(work / "a", iterations=5, batch_size=128, seed=1),
        train_demo_model(work / "b", iterations=5, batch_size=128, seed=2),
    )


def test_the_trainer_records_what_it_saved(two_runs):
    first, _ = two_runs
    entries = manifest.read_manifest(first.dense_file.parent)
    assert entries[first.dense_file.name]["size"] == first.dense_file.stat().st_size
    assert len(entries[first.dense_file.name]["sha256"]) == 64
    assert first.graph.name in manifest.read_manifest(first.graph.parent)
    sparse = entries[first.sparse_files[0].name]["sizes"]
    assert sparse["key"] == (first.sparse_files[0] / "key").stat().st_size


def test_a_right_sized_dense_file_of_another_run_is_refused(two_runs, tmp_path):
    first, second = two_runs
    assert first.dense_file.stat().st_size == second.dense_file.stat().st_size
    write_repository(first, tmp_path)
    version = tmp_path / "dlrm" / "1"
    (version / first.dense_file.name).write_bytes(second.dense_file.read_bytes())
    repo = ModelRepository(RepositoryLoader(), root=tmp_path)
    try:
        with pytest.raises(CorruptModelFileError, match="not the file this model was saved with"):
            repo.load("dlrm")
        assert "sha256" in repo.index()[0]["reason"]
    finally:
        repo.close()
        repo.loader.close()


def test_verify_passes_unlisted_files_and_catches_a_changed_table(two_runs, tmp_path):
    first, _ = two_runs
    write_repository(first, tmp_path)
    version = tmp_path / "dlrm" / "1"
    manifest.verify(version, ["not-listed.json", first.dense_file.name])
    keys = version / first.sparse_files[0].name / "key"
    keys.write_bytes(keys.read_bytes()[:-8])
    with pytest.raises(CorruptModelFileError, match="sizes"):
        manifest.verify(version, [first.sparse_files[0].name])


def test_a_broken_manifest_is_a_clear_error(tmp_path):
    (tmp_path / manifest.MANIFEST).write_text(json.dumps({"nope": 1}))
    with pytest.raises(CorruptModelFileError, match="no 'files' object"):
        manifest.verify(tmp_path, ["x"])
