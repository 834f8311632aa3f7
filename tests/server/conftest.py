"""Fixtures of the server tests: a small real DLRM in a model repository.

``tiny_repository(supportlonglong=True, max_batch_size=64)`` trains the demo DLRM for a few
steps on 1,024 generated rows (well under a second), writes ``<tmp>/repo/dlrm/1`` and its
``ps.json`` (hash map in front of RocksDB), and returns ``(repo, model)``; the trained model
is shared by every repository of the session.  ``demos`` are two demo DLRMs of one
architecture with different weights (10 and 40 steps, other seeds), for version swaps.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_dlrm(tmp_path_factory):
    from tierserve.clients.demo_model import train_demo_model

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no GPU: the trainer says so
        return train_demo_model(
            tmp_path_factory.mktemp("tiny") / "train", iterations=4, batch_size=64, num_samples=1024
        )


@pytest.fixture(scope="session")
def tiny_repository(tiny_dlrm, tmp_path_factory):
    from tierserve.clients.demo_model import write_repository

    def make(supportlonglong: bool = True, max_batch_size: int = 64) -> Path:
        repo = tmp_path_factory.mktemp("repo")
        write_repository(tiny_dlrm, repo, max_batch_size=max_batch_size)
        config = json.loads((repo / "ps.json").read_text())
        config["supportlonglong"] = supportlonglong
        config["persistent_db"]["path"] = str(repo.parent / f"{repo.name}-rocksdb")
        (repo / "ps.json").write_text(json.dumps(config))
        return repo

    return make


@pytest.fixture(scope="session")
def demos(tmp_path_factory):
    from tierserve.clients.demo_model import train_demo_model

    work = tmp_path_factory.mktemp("repo-demos")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no GPU: the trainer says so
        first = train_demo_model(work / "a", iterations=10, batch_size=256, seed=1)
        second = train_demo_model(work / "b", iterations=40, batch_size=256, seed=2)
    return first, second
