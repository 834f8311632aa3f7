"""The async insert worker: merging, order, bounded queue, failures."""

from __future__ import annotations

import threading

import numpy as np
from polling import until

from tierserve.cache.insert_worker import InsertWorker


def test_queued_batches_are_merged_deduplicated_and_keep_the_last_vector():
    gate = threading.Event()
    calls = []

    def insert(keys, vectors, epoch):
        gate.wait(10)
        calls.append((keys.copy(), vectors.copy(), epoch))

    worker = InsertWorker(insert, max_queued=8)
    try:
        worker.submit(np.array([100]), np.array([[0.0]]), 1)  # taken at once, waits on gate
        assert until(lambda: worker.depth == 0, timeout=10, interval=0.001)
        worker.submit(np.array([7, 3]), np.array([[1.0], [1.0]]), 5)
        worker.submit(np.array([3, 9]), np.array([[2.0], [2.0]]), 4)
        gate.set()
        assert worker.flush(10)
    finally:
        worker.close()
    keys, vectors, epoch = calls[1]
    assert keys.tolist() == [7, 3, 9]  # first-seen order: each batch comes hottest first
    assert vectors[:, 0].tolist() == [1.0, 2.0, 2.0]  # key 3: the later fetch wins
    assert epoch == 4  # the oldest epoch, so staleness checks stay conservative


def test_a_failing_insert_is_counted_and_the_worker_goes_on():
    seen = []

    def insert(keys, vectors, epoch):
        if epoch == 1:
            raise RuntimeError("boom")
        seen.append(epoch)

    worker = InsertWorker(insert, max_queued=4)
    try:
        worker.submit(np.array([1]), np.zeros((1, 1)), 1)
        assert worker.flush(10)
        worker.submit(np.array([2]), np.zeros((1, 1)), 2)
        assert worker.flush(10)
    finally:
        worker.close()
    assert worker.failed == 1 and seen == [2]
    assert not worker.submit(np.array([3]), np.zeros((1, 1)), 3)  # closed
