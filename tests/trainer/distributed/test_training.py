"""``mpiexec -n 2`` against one process: the small DLRM of dlrm_script.py trained on 2 ranks
with global batch B ends with the same dense weights, tables and evaluation metrics as one
process with batch B; the tables really are sharded; a snapshot resumes on another rank
count; a killed rank is named; a vvgpu that does not match the ranks is refused."""

from __future__ import annotations

import os

import numpy as np
import pytest

import tierserve.trainer as hugectr
from tierserve.ps.partition import partition_of

from .mpi_run import HERE, mpiexec, run

SCRIPT = HERE / "dlrm_script.py"
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("dlrm_data")
    hugectr.tools.DataGenerator(hugectr.tools.DataGeneratorParams(
        format=hugectr.DataReaderType_t.Norm, label_dim=1, dense_dim=13, num_slot=8,
        i64_input_key=True, source=os.path.join(out, "file_list.txt"),
        eval_source=os.path.join(out, "file_list_test.txt"), slot_size_array=[500] * 8,
        nnz_array=[1] * 8, check_type=hugectr.Check_t.Sum, num_files=2, eval_num_files=1,
        num_samples_per_file=4096)).generate()
    return out


def _train(ranks, out_dir, data_dir, **settings):
    out_dir.mkdir(parents=True, exist_ok=True)
    done = run(ranks, SCRIPT, DATA_DIR=data_dir, OUT=out_dir / "r.npz", **settings)
    assert done.returncode == 0, done.stderr[-3000:]
    return np.load(out_dir / "r.npz")


def _relative(a, b):
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.mark.parametrize("emb_type", ["DistributedSlotSparseEmbeddingHash",
                                      "LocalizedSlotSparseEmbeddingHash"])
@pytest.mark.parametrize("opt,update", [("Adam", "Global"), ("AdaGrad", "Local")])
def test_two_ranks_equal_one_rank(emb_type, opt, update, data_dir, tmp_path):
    mpiexec()
    settings = dict(EMB_TYPE=emb_type, OPT=opt, UPDATE=update, ITERS=12, BATCH=512)
    one = _train(0, tmp_path / "one", data_dir, **settings)
    two = _train(2, tmp_path / "two", data_dir, **settings)
    assert _relative(two["dense"], one["dense"]) < 1e-4
    np.testing.assert_array_equal(two["keys"], one["keys"])  # the saved model: same rows
    assert _relative(two["vectors"], one["vectors"]) < 1e-4
    np.testing.assert_allclose(two["losses"], one["losses"], rtol=1e-4)
    assert abs(float(two["auc"]) - float(one["auc"])) < 0.002
    assert float(two["avg_loss"]) == pytest.approx(float(one["avg_loss"]), rel=1e-4)
    # get_incremental_model on each rank: its own changed rows, together the one process's
    np.testing.assert_array_equal(two["changed"], one["changed"])
    # each rank held only its own rows, placed as the embedding type says
    counts = two["rank_rows"]
    assert len(counts) == 2 and all(c > 0 for c in counts)
    assert counts.sum() == len(one["keys"])
    rank0 = two["rank_keys"][: counts[0]]
    if emb_type.startswith("Distributed"):
        assert (partition_of(rank0, 2) == 0).all()
    else:  # Localized: slot s on rank s % 2; the reader adds slot offsets of 500
        assert ((rank0 // 500) % 2 == 0).all()


def test_snapshot_of_two_ranks_resumes_on_one(data_dir, tmp_path):
    mpiexec()
    prefix = tmp_path / "snap" / "dlrm"
    prefix.parent.mkdir()
    whole = _train(2, tmp_path / "whole", data_dir, ITERS=10, SNAPSHOT=5,
                   SNAPSHOT_PREFIX=prefix)
    resumed = _train(0, tmp_path / "resumed", data_dir, ITERS=10, RESUME_ITER=5,
                     SNAPSHOT_PREFIX=prefix)
    np.testing.assert_allclose(resumed["losses"], whole["losses"][5:], rtol=1e-4)
    assert _relative(resumed["dense"], whole["dense"]) < 1e-4
    assert _relative(resumed["vectors"], whole["vectors"]) < 1e-4


def test_killed_rank_is_named_and_the_job_ends(data_dir, tmp_path):
    mpiexec()
    (tmp_path / "o").mkdir()
    done = run(2, SCRIPT, timeout=30, DATA_DIR=data_dir, OUT=tmp_path / "o" / "r.npz",
               ITERS=40, DIE_AT=4, DIE_RANK=1)
    assert done.returncode != 0
    assert "rank 1 of 2" in done.stderr and "died before finishing" in done.stderr
    assert "after rank 1 died" in done.stderr  # rank 0 says why it stopped
    assert not (tmp_path / "o" / "r.npz").exists()


def test_vvgpu_must_list_one_device_per_rank(data_dir, tmp_path):
    mpiexec()
    (tmp_path / "o").mkdir()
    done = run(2, SCRIPT, timeout=30, DATA_DIR=data_dir, OUT=tmp_path / "o" / "r.npz",
               VVGPU="[[0]]")
    assert done.returncode != 0
    assert "vvgpu=[[0]]) lists 1 device(s) but the job has 2 ranks" in done.stderr


def test_criteo_sample_two_ranks_reach_one_ranks_auc(tmp_path):
    mpiexec()
    from shared_data import CRITEO_SAMPLE, require

    from tierserve.trainer.data.criteo import convert_criteo

    data = tmp_path / "criteo"
    convert_criteo(require(CRITEO_SAMPLE), data, train_rows=6000, eval_rows=2000,
                   min_frequency=10)
    settings = dict(SLOTS=26, ITERS=120, BATCH=256, EVAL_BATCH=1000, LR=0.001, OPT="Adam",
                    UPDATE="Local")
    one = _train(0, tmp_path / "one", data, **settings)
    two = _train(2, tmp_path / "two", data, **settings)
    print(f"Criteo sample AUC: 1 rank {float(one['auc']):.4f}, 2 ranks {float(two['auc']):.4f}")
    assert float(one["auc"]) >= 0.70
    assert abs(float(two["auc"]) - float(one["auc"])) < 0.005


def test_an_epoch_ending_in_fewer_samples_than_ranks(data_dir, tmp_path):
    """The last training and evaluation batches hold one sample: the second rank joins the
    step with a placeholder that changes nothing and counts in no metric."""
    mpiexec()
    settings = dict(EPOCH=1, BATCH=8191, EVAL_BATCH=4095, ITERS=3)
    one = _train(0, tmp_path / "one", data_dir, **settings)
    two = _train(2, tmp_path / "two", data_dir, **settings)
    assert len(one["losses"]) == len(two["losses"]) == 2
    np.testing.assert_allclose(two["losses"], one["losses"], rtol=1e-4)
    assert _relative(two["dense"], one["dense"]) < 1e-4
    assert _relative(two["vectors"], one["vectors"]) < 1e-4
    assert float(two["auc"]) == pytest.approx(float(one["auc"]), abs=1e-6)
    assert float(two["avg_loss"]) == pytest.approx(float(one["avg_loss"]), rel=1e-5)


def test_fit_on_two_ranks_trains_the_same_and_reports_once(data_dir, tmp_path):
    mpiexec()
    one = _train(0, tmp_path / "one", data_dir, FIT=1, ITERS=6)
    (tmp_path / "two").mkdir()
    done = run(2, SCRIPT, DATA_DIR=data_dir, OUT=tmp_path / "two" / "r.npz", FIT=1, ITERS=6)
    assert done.returncode == 0, done.stderr[-3000:]
    two = np.load(tmp_path / "two" / "r.npz")
    assert _relative(two["dense"], one["dense"]) < 1e-4
    np.testing.assert_allclose(two["losses"], one["losses"], rtol=1e-4)
    out = done.stdout + done.stderr
    assert out.count("[tierserve] iter 2: loss") == 1  # rank 0 speaks for the job
    assert out.count("[tierserve] iter 6: eval AUC") == 1
