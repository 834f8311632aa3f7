"""The data plane over a repository, without a transport: readiness, swaps, infer, statistics.

The servable is a small deterministic ranking model (the answer is a function of its row), so
each answer can be checked exactly and each version told apart.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from tierserve.core.errors import InvalidInputError, NotFoundError, NotReadyError
from tierserve.server.runtime.dataplane import DataPlane
from tierserve.server.runtime.metrics import ServerMetrics
from tierserve.server.runtime.repository import Loader as ServableLoader
from tierserve.server.runtime.repository import ModelRepository
from tierserve.server.runtime.servables import RankingServable
from tierserve.server.runtime.tensors import DecodedRequest, RequestedOutput


class Scaled:
    """``scale * (sum(dense) + sum(keys))`` per row: each version has its own scale."""

    dense_dim, label_dim, slot_nums, max_batchsize = 3, 1, [2], 16

    def __init__(self, scale: float) -> None:
        self.scale = scale
        self.closed = False

    def predict_batch(self, batch):
        keys = batch.sparse[0].keys.reshape(batch.batch_size, -1).sum(1)
        return (self.scale * (batch.dense.sum(1) + keys))[:, None].astype(np.float32)


class ScaledServable(RankingServable):
    def __init__(self, name, version, model):
        super().__init__(name, version, model)
        self.events: list[str] = []

    def commit(self):
        self.events.append("commit")

    def discard(self):
        self.events.append("discard")

    def close(self):
        self.events.append("close")


class Loader(ServableLoader):
    """Version v of any model scales by v; ``fail`` makes the next load raise."""

    def __init__(self):
        self.built: list[ScaledServable] = []
        self.fail: Exception | None = None

    def __call__(self, name, version, folder, ps_config):
        if self.fail is not None:
            raise self.fail
        servable = ScaledServable(name, version, Scaled(float(version)))
        self.built.append(servable)
        return servable


@pytest.fixture
def repo(tmp_path):
    (tmp_path / "ps.json").write_text('{"models": []}')
    for version in ("1", "2"):
        (tmp_path / "m" / version).mkdir(parents=True)
    return ModelRepository(Loader(), root=tmp_path)


def _request(rows: int, value: float = 1.0) -> DecodedRequest:
    return DecodedRequest(
        inputs={
            "DES": np.full((rows, 3), value, np.float32),
            "CATCOLUMN": np.full((rows, 2), 2, np.int64),
        },
        declared={"DES": "FP32", "CATCOLUMN": "INT64"},
        outputs=None,
    )


def _plane(repo, batching: bool) -> tuple[DataPlane, ThreadPoolExecutor]:
    executor = ThreadPoolExecutor(2)
    return DataPlane(repo, executor, ServerMetrics(), dynamic_batching=batching), executor


@pytest.mark.parametrize("batching", [True, False])
def test_infer_answers_with_the_serving_version(repo, batching):
    plane, executor = _plane(repo, batching)
    repo.load("m", "1")
    plane.started = True

    async def run():
        one = await plane.infer("m", "", _request(2, 1.0))
        repo.load("m", "2")
        two = await plane.infer("m", "", _request(3, 1.0))
        await plane.close()
        return one, two

    try:
        one, two = asyncio.run(run())
    finally:
        executor.shutdown()
    assert one.model_version == "1" and two.model_version == "2"
    np.testing.assert_array_equal(one.outputs["OUTPUT0"], np.full((2, 1), 1.0 * (3 + 4)))
    np.testing.assert_array_equal(two.outputs["OUTPUT0"], np.full((3, 1), 2.0 * (3 + 4)))


def test_a_swap_replaces_the_batcher_and_retires_the_old_version(repo):
    plane, executor = _plane(repo, True)
    try:
        repo.load("m", "1")
        first = repo.entries["m"].handle
        assert "batcher" in first.extras
        repo.load("m", "2")
        second = repo.entries["m"].handle
        assert "batcher" not in first.extras and "batcher" in second.extras
        v1, v2 = repo.loader.built
        assert v1.events == ["commit", "discard", "close"]  # idle: retired at once
        assert v2.events == ["commit"]
    finally:
        executor.shutdown()


def test_a_version_in_use_is_discarded_only_after_its_last_request(repo):
    plane, executor = _plane(repo, False)
    try:
        repo.load("m", "1")
        held = repo.acquire("m")
        repo.load("m", "2")
        v1 = repo.loader.built[0]
        assert v1.events == ["commit"]
        held.release()  # closes on a thread of its own

        from polling import until

        assert until(lambda: v1.events == ["commit", "discard", "close"], timeout=5)
    finally:
        executor.shutdown()


def test_readiness_follows_the_repository(repo):
    plane, executor = _plane(repo, False)
    try:
        assert not plane.ready()  # not started
        plane.started = True
        assert plane.ready()  # nothing loaded, nothing failed
        repo.loader.fail = OSError("tier down")
        repo.load_all()
        assert not plane.ready()
        assert "tier down" in plane.repository_index()[0]["reason"]
        repo.loader.fail = None
        repo.load("m")
        assert plane.ready() and plane.model_ready("m")
        repo.unload("m")
        assert plane.ready()  # an unloaded model does not make the server unready
        with pytest.raises(NotReadyError, match="unloaded"):
            plane.model_ready("m")
        with pytest.raises(NotFoundError):
            plane.model_ready("nope")
    finally:
        executor.shutdown()


def test_statistics_and_metrics_count_successes_and_failures(repo):
    plane, executor = _plane(repo, False)
    repo.load("m", "2")

    async def run():
        await plane.infer("m", "", _request(4))
        await plane.infer("m", "", _request(1))
        bad = DecodedRequest(
            inputs={"DES": np.zeros((1, 2), np.float32)}, declared={"DES": "FP32"}, outputs=None
        )
        with pytest.raises(InvalidInputError):
            await plane.infer("m", "", bad)
        with pytest.raises(InvalidInputError, match="unknown output"):
            req = _request(1)
            req.outputs = [RequestedOutput("NOPE", None)]
            await plane.infer("m", "", req)

    try:
        asyncio.run(run())
    finally:
        executor.shutdown()
    [stats] = plane.model_statistics("m")["model_stats"]
    assert stats["version"] == "2"
    assert stats["inference_count"] == 5
    assert stats["inference_stats"]["success"]["count"] == 2
    assert stats["inference_stats"]["fail"]["count"] == 2
    assert sorted(b["batch_size"] for b in stats["batch_stats"]) == [1, 4]
    assert plane.metrics_label("m") == "m" and plane.metrics_label("other") == "unknown"
