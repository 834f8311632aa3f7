"""The embedding training cache on several ranks (``mpiexec -n 2``): each rank keeps the rows
it owns in its own server (Staged: its hash map; Cached: its own RocksDB folder) and trains
each keyset's working set; the saved table, its optimizer state and the dense weights equal
one process's."""

from __future__ import annotations

import os

import numpy as np
import pytest
from keyset_data import keyset_parts

from .mpi_run import HERE, mpiexec, run

SCRIPT = HERE / "etc_script.py"
SLOTS = 4
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """Two Norm file lists (overlapping keys) and their keyset files."""
    pairs = keyset_parts(tmp_path_factory.mktemp("etc_mpi_data"), SLOTS)
    return ",".join(p[0] for p in pairs), ",".join(p[1] for p in pairs)


def _train(ranks, work, sources, **settings):
    work.mkdir(parents=True)
    done = run(ranks, SCRIPT, WORK=work, OUT=work / "r.npz", SOURCES=sources[0],
               KEYSETS=sources[1], **settings)
    assert done.returncode == 0, done.stderr[-3000:]
    return np.load(work / "r.npz")


@pytest.mark.parametrize("ps_type,emb_type,fit", [
    ("Staged", "DistributedSlotSparseEmbeddingHash", ""),
    ("Cached", "DistributedSlotSparseEmbeddingHash", ""),
    ("Cached", "LocalizedSlotSparseEmbeddingHash", ""),
    ("Cached", "LocalizedSlotSparseEmbeddingHash", "1"),  # fit over set_source with keysets
])
def test_two_ranks_with_the_cache_equal_one_rank(ps_type, emb_type, fit, sources, tmp_path):
    mpiexec()
    settings = dict(PS_TYPE=ps_type, EMB_TYPE=emb_type, FIT=fit)
    one = _train(0, tmp_path / "one", sources, **settings)
    two = _train(2, tmp_path / "two", sources, **settings)
    assert np.all(np.diff(two["keys"]) > 0)  # written in key order, as one process writes
    np.testing.assert_array_equal(two["keys"], one["keys"])
    np.testing.assert_array_equal(two["slot_ids"], one["slot_ids"])
    for name in ("dense", "vectors", "adam_m"):
        scale = np.abs(one[name]).max()
        assert np.abs(two[name] - one[name]).max() <= 1e-4 * scale, name
    # each rank's server held its own rows, together the whole table
    assert len(two["rank_rows"]) == 2 and all(two["rank_rows"] > 0)
    assert two["rank_rows"].sum() == int(two["total"]) == len(one["keys"])
    if ps_type == "Cached":  # each rank's RocksDB in its own folder under local_paths[0]
        for r in range(2):
            assert os.path.isdir(tmp_path / "two" / "ssd" / f"rank{r}" / "etc_table0")


def test_local_paths_must_match_the_ranks(sources, tmp_path):
    mpiexec()
    from tierserve.core.errors import ConfigError
    from tierserve.trainer.hugectr.etc import EmbeddingTrainingCache

    cache = EmbeddingTrainingCache.__new__(EmbeddingTrainingCache)
    cache.rank, cache.size = 1, 3
    assert cache._rank_path(["a", "b", "c"]) == "b"
    assert cache._rank_path(["a"]) == os.path.join("a", "rank1")
    with pytest.raises(ConfigError, match="local_paths lists 2 paths but the job has 3 ranks"):
        cache._rank_path(["a", "b"])


def test_a_saved_table_loads_into_two_ranks_each_keeping_its_rows(sources, tmp_path):
    """Incremental training: a second run finds the first run's sparse model folder and each
    rank keeps its rows of it (Localized: by the saved slot ids); 2 ranks then end as 1."""
    mpiexec()
    settings = dict(PS_TYPE="Staged", EMB_TYPE="LocalizedSlotSparseEmbeddingHash")
    runs = {}
    for ranks in (0, 2):
        work = tmp_path / f"ranks{ranks}"
        _train(ranks, work / "first", sources, **settings)
        (work / "second").mkdir(parents=True)
        (work / "first" / "etc_table0.model").rename(work / "second" / "etc_table0.model")
        done = run(ranks, SCRIPT, WORK=work / "second", OUT=work / "second" / "r.npz",
                   SOURCES=sources[0], KEYSETS=sources[1], **settings)
        assert done.returncode == 0, done.stderr[-3000:]
        runs[ranks] = np.load(work / "second" / "r.npz")
    one, two = runs[0], runs[2]
    np.testing.assert_array_equal(two["keys"], one["keys"])
    assert two["rank_rows"].sum() == len(one["keys"])  # no row on two ranks
    for name in ("vectors", "adam_m"):
        assert np.abs(two[name] - one[name]).max() <= 1e-4 * np.abs(one[name]).max(), name
