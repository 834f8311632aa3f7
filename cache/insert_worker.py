"""The background worker that inserts missed embeddings when the hit rate is high.

Queries hand over ``(keys, embeddings, epoch)`` batches with :meth:`InsertWorker.submit`,
which never blocks: when the bounded queue is full the batch is dropped and counted (the
keys simply miss again later).  The worker drains whatever is queued, merges it, removes
repeated keys and inserts the merged batch with the oldest epoch, so staleness filtering
stays conservative.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

import numpy as np

log = logging.getLogger(__name__)

InsertFn = Callable[[np.ndarray, np.ndarray, int], None]


class InsertWorker:
    """A daemon thread feeding ``insert(keys, embeddings, epoch)`` from a bounded queue."""

    def __init__(self, insert: InsertFn, max_queued: int = 64, max_merge: int = 16,
                 name: str = "tierserve-cache-insert") -> None:
        if max_queued <= 0:
            raise ValueError(f"max_queued must be positive, got {max_queued}")
        self._insert = insert
        self._queue: queue.Queue = queue.Queue(maxsize=max_queued)
        self._max_merge = max_merge
        self._stop = threading.Event()
        self.dropped = 0
        self.failed = 0
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    @property
    def depth(self) -> int:
        """Batches waiting now."""
        return self._queue.qsize()

    def submit(self, keys: np.ndarray, embeddings: np.ndarray, epoch: int) -> bool:
        """Queue a batch; ``False`` (and counted as dropped) when the queue is full or closed."""
        if self._stop.is_set():
            return False
        try:
            self._queue.put_nowait((keys, embeddings, epoch))
        except queue.Full:
            self.dropped += 1
            return False
        return True

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every queued batch has been inserted; ``False`` on timeout."""
        if timeout is None:
            self._queue.join()
            return True
        done = threading.Event()

        def wait() -> None:
            self._queue.join()
            done.set()

        threading.Thread(target=wait, daemon=True).start()
        return done.wait(timeout)

    def close(self, timeout: float = 5.0) -> None:
        """Stop the worker after the batches already queued."""
        self._stop.set()
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            try:
                first = self._queue.get(timeout=0.05)
            except queue.Empty:
                if self._stop.is_set():
                    return
                continue
            items = [first]
            while len(items) < self._max_merge:
                try:
                    items.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            try:
                self._insert_merged(items)
            except Exception:  # a failed insert only costs cache hits; keep serving
                self.failed += 1
                log.exception("embedding cache: async insert failed")
            finally:
                for _ in items:
                    self._queue.task_done()

    def _insert_merged(self, items: list) -> None:
        if len(items) == 1:
            keys, embeddings, epoch = items[0]
        else:
            keys = np.concatenate([k for k, _, _ in items])
            embeddings = np.concatenate([e for _, e, _ in items])
            epoch = min(e for _, _, e in items)
            # Each key once, at its first position (batches come hottest first), with its
            # last (most recently fetched) vector.
            unique, first = np.unique(keys, return_index=True)
            _, last_rev = np.unique(keys[::-1], return_index=True)
            last = keys.size - 1 - last_rev
            by_position = np.argsort(first)
            keys = unique[by_position]
            embeddings = embeddings[last[by_position]]
        self._insert(keys, embeddings, epoch)
