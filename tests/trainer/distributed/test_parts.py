"""The distributed trainer's parts in one process: batch shares, the vvgpu mapping, the fused
allreduce's weighting, gathered metrics and the sharded table (with the one-process
communicator, and the ownership rules of a 2-rank job)."""

from __future__ import annotations

import numpy as np
import pytest

from tierserve.core.errors import ConfigError
from tierserve.model.batch import Batch, SparseInput
from tierserve.ps.partition import partition_of
from tierserve.ps.sparse_file import SparseTable
from tierserve.trainer.distributed import LocalComm, rank_device
from tierserve.trainer.distributed.allreduce import allreduce_gradients
from tierserve.trainer.distributed.metrics import GatheredMetrics
from tierserve.trainer.distributed.reader import share, slice_batch
from tierserve.trainer.distributed.sharded_table import ShardedTable
from tierserve.trainer.embedding import Embedding_t, EmbeddingTable
from tierserve.trainer.metrics import Metrics, MetricsType
from tierserve.trainer.optimizers import CreateOptimizer, Optimizer_t, Update_t


def test_shares_cover_a_batch_in_order():
    for n in (0, 1, 5, 512, 513):
        for size in (1, 2, 3, 4):
            parts = [share(n, r, size) for r in range(size)]
            assert parts[0][0] == 0 and parts[-1][1] == n
            assert all(a[1] == b[0] for a, b in zip(parts, parts[1:]))
            assert max(h - lo for lo, h in parts) - min(h - lo for lo, h in parts) <= 1


def test_slice_batch_keeps_each_sample_with_its_keys():
    rows = [[1], [2, 3], [], [4], [5, 6, 7], [8]]  # 3 samples x 2 slots
    keys = np.array([k for r in rows for k in r], dtype=np.int64)
    offsets = np.r_[0, np.cumsum([len(r) for r in rows])].astype(np.int64)
    batch = Batch(label=np.arange(3, dtype=np.float32)[:, None],
                  dense=np.arange(6, dtype=np.float32).reshape(3, 2),
                  sparse=(SparseInput(keys, offsets, 2),))
    part = slice_batch(batch, 1, 3)
    assert part.label[:, 0].tolist() == [1, 2]
    assert part.dense.tolist() == [[2, 3], [4, 5]]
    s = part.sparse[0]
    assert s.keys.tolist() == [4, 5, 6, 7, 8]
    assert s.row_offsets.tolist() == [0, 0, 1, 4, 5]


def test_rank_device_follows_vvgpu_node_by_node():
    assert [rank_device([[0, 1], [0, 1]], r, 4) for r in range(4)] == [
        (0, 0), (0, 1), (1, 0), (1, 1)]
    assert rank_device([[3]], 0, 1) == (0, 3)
    with pytest.raises(ConfigError, match=r"lists 1 device\(s\) but the job has 2 ranks"):
        rank_device([[0]], 0, 2)
    with pytest.raises(ConfigError, match="node 0 lists a device twice"):
        rank_device([[0, 0]], 0, 2)


class _TwoRankSum(LocalComm):
    """The one-process communicator, except that an allreduce adds a second rank's buffer
    (given up front): the weighting arithmetic without a second process."""

    def __init__(self, other: list[np.ndarray]) -> None:
        self.other = other

    def allreduce_sum(self, buf, what="allreduce"):
        buf += self.other.pop(0)
        return buf


def test_fused_allreduce_weights_ranks_by_their_samples():
    rng = np.random.default_rng(0)
    g1 = [[rng.normal(size=(3, 2)).astype(np.float32), None], [rng.normal(size=4).astype(
        np.float32)]]
    g2 = [[rng.normal(size=(3, 2)).astype(np.float32), None], [rng.normal(size=4).astype(
        np.float32)]]
    n1, n2, l1, l2 = 5, 3, 0.7, 0.2
    other = np.concatenate([g2[0][0].ravel() * n2, g2[1][0] * n2, [l2 * n2, n2]]).astype(
        np.float32)
    expect = [(g1[0][0] * n1 + g2[0][0] * n2) / 8, (g1[1][0] * n1 + g2[1][0] * n2) / 8]
    loss, total = allreduce_gradients(_TwoRankSum([other]), g1, l1, n1)
    assert total == 8 and loss == pytest.approx((l1 * 5 + l2 * 3) / 8, rel=1e-6)
    assert g1[0][1] is None
    np.testing.assert_allclose(g1[0][0], expect[0], rtol=1e-6)
    np.testing.assert_allclose(g1[1][0], expect[1], rtol=1e-6)


def test_gathered_metrics_equal_one_process_metrics():
    rng = np.random.default_rng(1)
    spec = {MetricsType.AUC: 1.0, MetricsType.AverageLoss: 0.0, MetricsType.HitRate: 1.0}
    plain, gathered = Metrics(spec), GatheredMetrics(spec, LocalComm())
    for _ in range(3):
        y = (rng.random((64, 1)) < 0.3).astype(np.float32)
        p = rng.random((64, 1))
        loss = float(rng.random())
        plain.update(y, p, loss)
        gathered.update(y, p, loss)
    for (n1, v1), (n2, v2) in zip(plain.results(), gathered.results()):
        assert n1 == n2 and v1 == pytest.approx(v2, rel=1e-12)


def _csr(rng, batch, slots, key_range):
    keys = rng.integers(0, key_range, batch * slots).astype(np.int64)
    return SparseInput(keys, np.arange(batch * slots + 1, dtype=np.int64), slots)


@pytest.mark.parametrize("kind", [Embedding_t.DistributedSlotSparseEmbeddingHash,
                                  Embedding_t.LocalizedSlotSparseEmbeddingHash])
@pytest.mark.parametrize("update", [Update_t.Global, Update_t.LazyGlobal])
def test_sharded_table_on_one_rank_equals_the_table(kind, update):
    opt = CreateOptimizer(optimizer_type=Optimizer_t.Adam, update_type=update)
    plain = EmbeddingTable(kind, 4, 1, opt, seed=3)
    sharded = ShardedTable(EmbeddingTable(kind, 4, 1, opt, seed=3), LocalComm())
    rng = np.random.default_rng(2)
    for step in range(1, 5):
        sparse = _csr(rng, 32, 3, 50)
        a = plain.forward(sparse)
        b = sharded.forward(sparse)
        np.testing.assert_allclose(b, a, rtol=1e-6)
        g = rng.normal(size=a.shape).astype(np.float32)
        plain.backward(g, 0.01, step)
        sharded.backward(g, 0.01, step)
    x, y = plain.export(), sharded.export()
    order_x, order_y = np.argsort(x.keys), np.argsort(y.keys)
    np.testing.assert_array_equal(x.keys[order_x], y.keys[order_y])
    np.testing.assert_allclose(x.embeddings[order_x], y.embeddings[order_y], rtol=1e-6)


class _Rank1Of2(LocalComm):
    """Rank 1 of a 2-rank job, for the ownership rules (which exchange nothing)."""

    rank, size = 1, 2


def test_a_rank_loads_only_the_rows_it_owns():
    opt = CreateOptimizer(optimizer_type=Optimizer_t.SGD)
    keys = np.arange(100, dtype=np.int64)
    vectors = np.arange(400, dtype=np.float32).reshape(100, 4)
    dist = ShardedTable(EmbeddingTable(Embedding_t.DistributedSlotSparseEmbeddingHash, 4, 1,
                                       opt), _Rank1Of2())
    dist.load(SparseTable(keys=keys, embeddings=vectors))
    mine = partition_of(keys, 2) == 1
    assert sorted(dist.local.keys.tolist()) == keys[mine].tolist()
    local = ShardedTable(EmbeddingTable(Embedding_t.LocalizedSlotSparseEmbeddingHash, 4, 1,
                                        opt), _Rank1Of2())
    slots = keys % 5
    local.load(SparseTable(keys=keys, embeddings=vectors, slot_ids=slots))
    assert sorted(local.local.keys.tolist()) == keys[slots % 2 == 1].tolist()


def test_launcher_environment_and_timeout_setting(monkeypatch):
    from tierserve.trainer.distributed import comm

    for var in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE"):
        monkeypatch.delenv(var, raising=False)
    assert comm.launched_size() == 1
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "3")
    assert comm.launched_size() == 3
    monkeypatch.setenv(comm.TIMEOUT_VAR, "soon")
    with pytest.raises(ConfigError, match="TIERSERVE_COLLECTIVE_TIMEOUT_S must be a number"):
        comm._timeout()
    monkeypatch.setenv(comm.TIMEOUT_VAR, "0")
    with pytest.raises(ConfigError, match="TIERSERVE_COLLECTIVE_TIMEOUT_S must be positive"):
        comm._timeout()
    monkeypatch.setenv(comm.TIMEOUT_VAR, "12.5")
    assert comm._timeout() == 12.5


def test_a_killed_process_is_not_alive_even_as_a_zombie():
    import signal
    import subprocess
    import sys

    from tierserve.trainer.distributed.comm import _alive

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert _alive(child.pid)
        child.send_signal(signal.SIGKILL)
        from polling import until

        assert until(lambda: not _alive(child.pid), timeout=10)  # a zombie until reaped
    finally:
        child.kill()
        child.wait()
    assert not _alive(child.pid)
