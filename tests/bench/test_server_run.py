"""bench/server/run.py: the in-process ``predict`` it measures the server against computes
with the server's BLAS thread count (numpy's default is one per core; the server's is 1)."""

from __future__ import annotations

import pytest

from bench.server.run import match_server_blas_threads
from tierserve.model.blas_threads import get_blas_threads, set_blas_threads


@pytest.fixture
def blas_threads():
    before = get_blas_threads()
    if before is None:
        pytest.skip("numpy's BLAS is not OpenBLAS: its thread count cannot be read")
    yield
    set_blas_threads(before)


def test_predict_gets_the_servers_blas_thread_count(blas_threads):
    set_blas_threads(2)
    assert match_server_blas_threads("--workers 2") == 1
    assert get_blas_threads() == 1
    assert match_server_blas_threads("--blas-threads 2 --workers 1") == 2
    assert get_blas_threads() == 2
    assert match_server_blas_threads("--grpc-transport native --blas-threads=1") == 1
    assert get_blas_threads() == 1
