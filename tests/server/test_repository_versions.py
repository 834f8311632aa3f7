"""What the repository takes as a version: complete folders, ASCII-digit names, folders inside
the repository, and a model that keeps its kind (ranking or embedding store).

Real loader, real tiers (hash map in front of RocksDB), version folders written as the demo
writes them and then broken as an operator or a slow copy would.
"""

from __future__ import annotations

import json
import logging
import shutil

import pytest

from tierserve.clients.demo_model import write_repository
from tierserve.core.errors import TierserveError
from tierserve.model import manifest
from tierserve.server.runtime.loader import RepositoryLoader
from tierserve.server.runtime.repository import ModelRepository
from tierserve.server.runtime.servables import EmbeddingLookupServable, RankingServable


@pytest.fixture
def repo(tmp_path, demos):
    write_repository(demos[0], tmp_path / "repo")
    repository = ModelRepository(RepositoryLoader(), root=tmp_path / "repo")
    yield repository
    repository.close()
    repository.loader.close()


def _serving(repo: ModelRepository):
    handle = repo.acquire("dlrm")
    handle.release()
    return handle.servable


def _settle(repo: ModelRepository) -> None:
    repo.poll()  # seen
    repo.poll()  # settled: loaded or refused


def _edit_model(root, **fields) -> None:
    path = root / "ps.json"
    data = json.loads(path.read_text())
    data["models"][0].update(fields)
    path.write_text(json.dumps(data))


def _version_without_graph(root, demo, version: int = 2):
    """Version ``version`` copied the way a slow copy leaves it: everything but the graph."""
    target = write_repository(demo, root, version=version)
    graph = target / demo.graph.name
    held = root.parent / f"held-{graph.name}"
    shutil.move(graph, held)
    return target, held


def test_a_version_missing_its_graph_waits_for_it_and_never_serves_half(repo, demos):
    """The graph JSON is copied last: until it lands version 2 is incomplete (the manifest
    and ps.json both name it), version 1 serves on, and the index says what is missing; once
    it lands, version 2 serves as the ranking model it is."""
    _, second = demos
    repo.load_all()
    root = repo.root
    target, held = _version_without_graph(root, second)
    for _ in range(3):
        _settle(repo)
    servable = _serving(repo)
    assert servable.version == "1" and isinstance(servable, RankingServable)
    [row] = repo.index()
    assert row["state"] == "READY" and row["version"] == "1"
    assert "version 2" in row["reason"] and "incomplete" in row["reason"]
    assert second.graph.name in row["reason"]
    shutil.move(held, target / second.graph.name)
    _settle(repo)
    servable = _serving(repo)
    assert servable.version == "2" and isinstance(servable, RankingServable)
    assert repo.index()[0]["reason"] == ""


@pytest.mark.parametrize("named_by", ["manifest", "ps.json"])
def test_what_names_the_graph_makes_a_version_without_it_incomplete(tmp_path, demos, named_by):
    """Either the manifest or the ps.json entry naming the graph is enough: a version
    without it never loads, not even as the first version (as an embedding store)."""
    first, _ = demos
    root = tmp_path / "repo"
    target, _ = _version_without_graph(root, first, version=1)
    if named_by == "manifest":
        _edit_model(root, network_file="")
    else:
        (target / manifest.MANIFEST).unlink()
    repo = ModelRepository(RepositoryLoader(), root=root)
    try:
        with pytest.raises(TierserveError, match="incomplete"):
            repo.load("dlrm")
        [row] = repo.index()
        assert row["state"] == "UNAVAILABLE" and first.graph.name in row["reason"]
        assert repo.loader.parameter_server is None or repo.loader.parameter_server.models() == []
    finally:
        repo.close()
        repo.loader.close()


def test_a_file_the_manifest_lists_must_be_there_with_its_size(repo, demos):
    """A sparse folder still being copied (a short key file) is incomplete, not corrupt, and
    loads once it is whole."""
    _, second = demos
    repo.load_all()
    target = write_repository(second, repo.root, version=2)
    keys = target / second.sparse_files[0].name / "key"
    whole = keys.read_bytes()
    keys.write_bytes(whole[: len(whole) // 2])
    _settle(repo)
    assert _serving(repo).version == "1"
    assert "incomplete" in repo.index()[0]["reason"]
    keys.write_bytes(whole)
    _settle(repo)
    assert _serving(repo).version == "2"


def test_a_model_never_changes_kind_between_versions_unasked(repo, demos):
    """Version 2 has no graph and nothing names one (no manifest, ps.json names none): it
    is a whole embedding store, but version 1 serves as a ranking model, so it is refused
    with the reason in the index.  Unloading and loading the model is the explicit switch."""
    _, second = demos
    repo.load_all()
    root = repo.root
    target, _ = _version_without_graph(root, second)
    (target / manifest.MANIFEST).unlink()
    _edit_model(root, network_file="", dense_file="")
    _settle(repo)
    servable = _serving(repo)
    assert servable.version == "1" and isinstance(servable, RankingServable)
    [row] = repo.index()
    assert row["state"] == "READY" and "embedding store" in row["reason"]
    assert "ranking" in row["reason"] and "unload" in row["reason"]
    _settle(repo)  # refused once: not staged again while nothing changed
    repo.unload("dlrm")
    repo.load("dlrm")
    servable = _serving(repo)
    assert servable.version == "2" and isinstance(servable, EmbeddingLookupServable)


def test_a_refused_newer_version_shows_its_reason_beside_the_serving_one(repo, demos):
    _, second = demos
    repo.load_all()
    target = write_repository(second, repo.root, version=2)
    dense = next(target.glob("*_dense_*.model"))
    dense.write_bytes(dense.read_bytes()[:-4])  # also unlike the manifest: corrupt
    _settle(repo)
    [row] = repo.index()
    assert (row["state"], row["version"]) == ("READY", "1")
    assert row["reason"].startswith("version 2: ") and "version 1 serves" in row["reason"]


@pytest.mark.parametrize("name", ["²", "٣", "0", "-1", " 2"])
def test_only_ascii_digits_name_versions(repo, demos, name, caplog):
    """``'²'.isdigit()`` is true and ``int('²')`` raises; ``int('٣')`` is 3: neither is a
    version.  Such folders are skipped with a log line, and polling and loading go on."""
    _, second = demos
    repo.load_all()
    odd = repo.root / "dlrm" / name
    shutil.copytree(repo.root / "dlrm" / "1", odd)
    with caplog.at_level(logging.WARNING, logger="tierserve.server.runtime.repository"):
        _settle(repo)
        assert repo.versions("dlrm") == ["1"]
        repo.load("dlrm")
        assert repo.model_names() == ["dlrm"]
    assert f"{name!r}" in caplog.text and "not a version" in caplog.text
    write_repository(second, repo.root, version=2)
    _settle(repo)
    assert _serving(repo).version == "2"


@pytest.mark.parametrize("link", ["model", "version"])
def test_a_folder_linked_from_outside_the_repository_is_refused(tmp_path, demos, link):
    """A model or version folder that is a symlink to a folder outside the repository is
    refused with the reason in the index (a link inside the repository is fine)."""
    first, _ = demos
    root, outside = tmp_path / "repo", tmp_path / "outside"
    write_repository(first, root)
    write_repository(first, outside)
    if link == "model":
        (root / "other").symlink_to(outside / "dlrm", target_is_directory=True)
        name = "other"
        _edit_model(root, model="other")
    else:
        (root / "dlrm" / "2").symlink_to(outside / "dlrm" / "1", target_is_directory=True)
        name = "dlrm"
    repo = ModelRepository(RepositoryLoader(), root=root)
    try:
        repo.load_all()
        row = next(r for r in repo.index() if r["name"] == name)
        assert row["state"] == "UNAVAILABLE"
        assert "outside the model repository" in row["reason"]
        with pytest.raises(TierserveError, match="outside the model repository"):
            repo.load(name)
    finally:
        repo.close()
        repo.loader.close()
    _edit_model(root, model="dlrm")
    (root / "dlrm" / "3").symlink_to(root / "dlrm" / "1", target_is_directory=True)
    inside = ModelRepository(RepositoryLoader(), root=root)
    try:
        inside.load("dlrm")
        assert _serving(inside).version == "3"
    finally:
        inside.close()
        inside.loader.close()
