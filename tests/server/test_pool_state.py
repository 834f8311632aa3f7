"""A pool worker's data plane (server/runtime/pool_state.py): readiness is the pool's, and
repository load and unload are refused, as explicit behaviour of PooledDataPlane (not patched
in)."""

import asyncio

import pytest

from tierserve.core.errors import ConfigError
from tierserve.server.runtime.dataplane import DataPlane
from tierserve.server.runtime.pool_state import PooledDataPlane, PoolState
from tierserve.server.runtime.repository import FunctionLoader, ModelRepository


def _refuse(name, version, folder, ps_config):
    raise AssertionError("nothing loads in these tests")


@pytest.fixture
def repository(tmp_path):
    (tmp_path / "ps.json").write_text('{"models": []}')
    return ModelRepository(_refuse, root=tmp_path)


def test_the_pool_answers_ready_only_while_every_worker_is(repository):
    ready = bytearray([0, 0])
    pool = PoolState(0, ready)
    plane = PooledDataPlane(repository, None, pool=pool)
    plane.started = True
    assert plane.own_ready()
    ready[0] = 1
    assert not plane.ready()
    assert plane.not_ready_reason() == "another worker process is not ready"
    ready[1] = 1
    assert plane.ready()
    plane.started = False  # this worker's own reason comes first
    assert not plane.ready() and plane.not_ready_reason() == DataPlane.not_ready_reason(plane)


def test_load_and_unload_are_refused_with_the_worker_count(repository):
    plane = PooledDataPlane(repository, None, pool=PoolState(0, bytearray(3)))
    for call in (plane.load, plane.unload):
        with pytest.raises(ConfigError, match="--workers 3"):
            asyncio.run(call("m"))


def test_a_plain_function_becomes_a_loader(repository):
    assert isinstance(repository.loader, FunctionLoader)
    assert repository.loader.tier_stats() == {} and repository.loader.healthy()
    repository.loader.close()
    assert ModelRepository(repository.loader, root=repository.root).loader is repository.loader
