"""The typed interfaces between the data plane, the app and what they serve, through a real
server: what a :class:`Loader` says of its health reaches ``/v2/health/ready`` (its
``not_ready_reason`` in the body), what a :class:`Servable` reports in ``stats()`` reaches
``/metrics``, and the data plane refuses requests over the limits it was built with.

The loaders and servables here are real subclasses of the interfaces (no stand-ins): the
server only sees their typed methods."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest
from doubler_model import Doubler, write_doubler_repository

from tierserve.core.errors import InvalidInputError
from tierserve.server.app import BackgroundServer
from tierserve.server.runtime.dataplane import DataPlane
from tierserve.server.runtime.metrics import ServerMetrics
from tierserve.server.runtime.repository import FunctionLoader, Loader, ModelRepository
from tierserve.server.runtime.servables import RankingServable, RequestLimits
from tierserve.server.runtime.tensors import DecodedRequest
from tierserve.server.settings import Settings


class _CachedDoubler(RankingServable):
    """A ranking servable whose ``stats()`` reports a cache hit rate per table."""

    def stats(self):
        return {"cache_hit_rate": {"t0": 0.25, "t1": 0.75}}


class _GatedLoader(Loader):
    """Serves :class:`Doubler` (``_CachedDoubler`` for model ``m``); ``reason`` not None
    makes the loader unhealthy with that reason."""

    def __init__(self) -> None:
        self.reason: str | None = None

    def __call__(self, model, version, version_dir, ps_config):
        return _CachedDoubler(model, version, Doubler())

    def healthy(self) -> bool:
        return self.reason is None

    def not_ready_reason(self) -> str | None:
        return self.reason


def _settings(root) -> Settings:
    return Settings.build(
        model_repository=write_doubler_repository(root), http_port=0, poll_interval_s=0
    )


def test_loader_defaults_keep_a_server_ready():
    loader = FunctionLoader(lambda *args: None)
    assert loader.healthy() is True
    assert loader.not_ready_reason() is None


def test_the_loaders_reason_is_the_ready_routes_answer(tmp_path):
    loader = _GatedLoader()
    with BackgroundServer(_settings(tmp_path), loader) as server:
        url = f"http://{server.http_url}/v2/health/ready"
        assert httpx.get(url).status_code == 200
        loader.reason = "the Kafka apply consumer of the volatile tier does not run"
        answer = httpx.get(url)
        assert answer.status_code == 503
        assert answer.json() == {"error": loader.reason}
        assert not server.plane.ready()
        loader.reason = None
        assert httpx.get(url).status_code == 200


def test_servable_stats_reach_the_metrics(tmp_path):
    with BackgroundServer(_settings(tmp_path), _GatedLoader()) as server:
        text = httpx.get(f"http://{server.http_url}/metrics").text
    assert 'tierserve_cache_hit_rate{model="m",table="t0"} 0.25' in text
    assert 'tierserve_cache_hit_rate{model="m",table="t1"} 0.75' in text


def test_a_servable_without_stats_adds_no_series(tmp_path):
    def load(model, version, version_dir, ps_config):
        return RankingServable(model, version, Doubler())

    with BackgroundServer(_settings(tmp_path), load) as server:
        answer = httpx.get(f"http://{server.http_url}/metrics")
    assert answer.status_code == 200
    assert "tierserve_cache_hit_rate{" not in answer.text


def test_the_data_plane_applies_the_limits_it_is_built_with(tmp_path):
    repository = ModelRepository(
        lambda m, v, d, c: RankingServable(m, v, Doubler()),
        root=write_doubler_repository(tmp_path),
    )
    repository.load("m", "1")
    executor = ThreadPoolExecutor(1)
    plane = DataPlane(
        repository, executor, ServerMetrics(), limits=RequestLimits(max_keys_per_request=4)
    )
    plane.started = True
    rows = 3  # 3 rows x 2 keys: over the limit of 4
    request = DecodedRequest(
        inputs={
            "DES": np.ones((rows, 3), np.float32),
            "CATCOLUMN": np.ones((rows, 2), np.int64),
        },
        declared={"DES": "FP32", "CATCOLUMN": "INT64"},
        outputs=None,
    )

    async def run():
        try:
            await plane.infer("m", "", request)
        finally:
            await plane.close()

    try:
        with pytest.raises(InvalidInputError, match="max_keys_per_request"):
            asyncio.run(run())
    finally:
        executor.shutdown()
        repository.close()
