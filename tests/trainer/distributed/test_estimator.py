"""The Estimator API under ``mpiexec -n 2`` against one process (estimator_script.py, a
wide-and-deep DNNLinearCombinedClassifier): 2 ranks with global batch B end with the
variables and evaluation metrics of one process with batch B (shares of each global batch,
or an input_fn that reads its own share through ``input_context``); each rank holds only the
table rows it owns; ``train_and_evaluate`` exports one version, from the chief, which the
server loads and serves as ``predict`` gives; a killed rank is named."""

from __future__ import annotations

import numpy as np
import pytest

from tierserve.core.errors import ConfigError
from tierserve.ps.partition import partition_of
from tierserve.trainer.distributed import LocalComm
from tierserve.trainer.estimator.distributed import EstimatorRun, InputContext

from .mpi_run import HERE, mpiexec, run

SCRIPT = HERE / "estimator_script.py"


def _train(ranks, out_dir, **settings):
    out_dir.mkdir(parents=True, exist_ok=True)
    done = run(ranks, SCRIPT, MODEL_DIR=out_dir / "model", OUT=out_dir / "r.npz", **settings)
    assert done.returncode == 0, done.stderr[-3000:]
    return np.load(out_dir / "r.npz")


def _relative(a, b):
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-12))


@pytest.mark.slow
@pytest.mark.parametrize("settings", [
    # one epoch of 1025 rows: the last training batch holds 1 sample (rank 1 stands by with
    # a sample that weighs nothing); evaluation batches of 256 end in one of 1 sample
    dict(ROWS=1025, EPOCHS=1, BATCH=128, EVAL_BATCH=256),
    # two epochs, a short last batch (2 samples, one per rank)
    dict(ROWS=1025, EPOCHS=2, BATCH=128),
    # the input_fn reads its own share (Dataset.shard by input_context) with batch B / 2
    dict(ROWS=1024, EPOCHS=1, BATCH=128, SHARDED_INPUT=1),
], ids=["placeholder", "short-last-batch", "input-context"])
def test_two_ranks_equal_one_rank(settings, tmp_path):
    mpiexec()
    one = _train(0, tmp_path / "one", **settings)
    two = _train(2, tmp_path / "two", **settings)
    assert int(two["global_step"]) == int(one["global_step"])
    names = one["names"].tolist()
    assert two["names"].tolist() == names
    assert any("embedding_weights" in n for n in names) and any("linear" in n for n in names)
    for n in names:
        assert _relative(two[f"v:{n}"], one[f"v:{n}"]) < 1e-4, n
    assert abs(float(two["auc"]) - float(one["auc"])) < 0.002
    assert float(two["loss"]) == pytest.approx(float(one["loss"]), rel=1e-4)
    assert float(two["average_loss"]) == pytest.approx(float(one["average_loss"]), rel=1e-4)
    assert float(two["accuracy"]) == pytest.approx(float(one["accuracy"]), abs=1e-9)
    ranks = [np.load(tmp_path / "two" / f"r.npz.rank{r}.npz") for r in (0, 1)]
    for r, part in enumerate(ranks):
        held = part["held"]
        assert len(held) > 0 and (partition_of(held, 2) == r).all()  # its own rows only
        assert float(part["auc"]) == float(two["auc"])  # every rank: the merged metrics
    assert [bool(p["is_chief"]) for p in ranks] == [True, False]
    assert [str(p["task_type"]) for p in ranks] == ["chief", "worker"]
    assert [int(p["workers"]) for p in ranks] == [2, 2]


@pytest.mark.slow
def test_a_stop_and_a_checkpoint_timer_on_the_chief_hold_for_every_rank(tmp_path):
    """A hook on the chief alone stops training at step 7, and checkpoints are timed (every
    millisecond) on the chief's clock: every rank stops and saves at the chief's steps."""
    mpiexec()
    settings = dict(CHIEF_STOP_AT=7, CHECKPOINT_SECS=0.001)
    one = _train(0, tmp_path / "one", **settings)
    two = _train(2, tmp_path / "two", **settings)
    assert int(one["global_step"]) == int(two["global_step"]) == 7
    for n in one["names"].tolist():
        assert _relative(two[f"v:{n}"], one[f"v:{n}"]) < 1e-4, n
    saved = sorted(p.name for p in (tmp_path / "two" / "model").glob("model.ckpt-*.npz"))
    assert "model.ckpt-7.npz" in saved and len(saved) >= 2


@pytest.mark.slow
def test_train_and_evaluate_exports_one_version_from_the_chief(tmp_path):
    import httpx

    from tierserve.server.app import BackgroundServer
    from tierserve.server.settings import Settings
    from tierserve.trainer.estimator import export

    mpiexec()
    one = _train(0, tmp_path / "one", TRAIN_AND_EVALUATE=1)
    two = _train(2, tmp_path / "two", TRAIN_AND_EVALUATE=1)
    assert abs(float(two["auc"]) - float(one["auc"])) < 0.002
    home = tmp_path / "two" / "model" / "export" / "wide_deep" / "wide_deep"
    assert sorted(p.name for p in home.iterdir()) == ["1"]  # nothing half-written either
    assert two["exports"].tolist() == [str(home / "1")]
    repo = home.parent
    request = export.encode_request(home / "1", {k: v for k, v in _rows(16).items()})
    settings = Settings.build(model_repository=repo, http_port=0, grpc_port=None,
                              poll_interval_s=0)
    with BackgroundServer(settings) as server:
        body = {"inputs": [{"name": k, "datatype": "FP32" if k == "DES" else
                            "INT32" if k == "ROWINDEX" else "INT64", "shape": list(a.shape),
                            "data": a.reshape(-1).tolist()} for k, a in request.items()]}
        r = httpx.post(f"http://{server.http_url}/v2/models/wide_deep/infer", json=body,
                       timeout=60)
        assert r.status_code == 200, r.text
        served = np.asarray(r.json()["outputs"][0]["data"], dtype=np.float32)
    np.testing.assert_allclose(served, two["predicted"], atol=1e-5, rtol=0)


def _rows(n):
    """The script's first ``n`` examples (its features, drawn with its seed)."""
    rng = np.random.default_rng(11)
    x = rng.normal(size=1025).astype(np.float32)
    kind = rng.choice(["a", "b", "c", "d", "e"], size=1025)
    user = rng.integers(0, 400, size=1025).astype(np.int64)
    return {"x": x[:n], "kind": kind[:n], "user": user[:n]}


@pytest.mark.slow
def test_an_evaluation_one_rank_has_no_share_of_is_refused_on_every_rank(tmp_path):
    mpiexec()
    (tmp_path / "o").mkdir()
    done = run(2, SCRIPT, timeout=60, MODEL_DIR=tmp_path / "o" / "model",
               OUT=tmp_path / "o" / "r.npz", ROWS=64, BATCH=16, EVAL_BATCH=1)
    assert done.returncode != 0
    assert "evaluate under mpiexec: rank(s) [1] of 2 got no evaluation batch" in done.stderr
    assert not (tmp_path / "o" / "r.npz").exists()


@pytest.mark.slow
def test_killed_rank_is_named_and_the_job_ends(tmp_path):
    mpiexec()
    (tmp_path / "o").mkdir()
    done = run(2, SCRIPT, timeout=30, MODEL_DIR=tmp_path / "o" / "model",
               OUT=tmp_path / "o" / "r.npz", EPOCHS=20, DIE_AT=4, DIE_RANK=1)
    assert done.returncode != 0
    assert "rank 1 of 2" in done.stderr and "died before finishing" in done.stderr
    assert "after rank 1 died" in done.stderr  # rank 0 says why it stopped
    assert not (tmp_path / "o" / "r.npz").exists()


class _Rank1Of2(LocalComm):
    rank, size = 1, 2


def test_only_the_chief_exports():
    with pytest.raises(ConfigError, match=r"runs on the chief \(rank 0\), not rank 1"):
        EstimatorRun(_Rank1Of2()).export(None, "base", None)


def test_input_context_per_replica_batch():
    ctx = InputContext(num_input_pipelines=2, input_pipeline_id=1, num_replicas_in_sync=2)
    assert ctx.get_per_replica_batch_size(128) == 64
    with pytest.raises(ConfigError, match="global batch size 129 is not divisible by the 2"):
        ctx.get_per_replica_batch_size(129)


def test_run_config_reports_the_rank_the_launcher_gave(monkeypatch):
    from tierserve.trainer.estimator import RunConfig

    for var in ("PMI_SIZE", "PMI_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK",
                "PMIX_SIZE", "PMIX_RANK"):
        monkeypatch.delenv(var, raising=False)
    alone = RunConfig()
    assert (alone.is_chief, alone.task_type, alone.task_id, alone.num_worker_replicas) == (
        True, "worker", 0, 1)
    monkeypatch.setenv("PMI_SIZE", "3")
    monkeypatch.setenv("PMI_RANK", "2")
    third = RunConfig()
    assert (third.is_chief, third.task_type, third.task_id, third.global_id_in_cluster,
            third.num_worker_replicas) == (False, "worker", 1, 2, 3)
    monkeypatch.setenv("PMI_RANK", "0")
    assert RunConfig().task_type == "chief" and RunConfig().is_chief
