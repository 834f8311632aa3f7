"""Which keys were updated since a moment: keeps stale vectors out of the cache.

A miss is served by fetching from the parameter server and then (maybe much later, from the
insert queue) inserting what was fetched.  If an update to one of those keys was applied in
between, the fetched vector is stale and must not enter the cache.  Every update applied to
the cache bumps an *epoch* and logs the updated keys; a fetch remembers the epoch it started
at, and at insert time :meth:`UpdateLog.fresh` drops the keys updated since.  The log keeps
the last ``max_entries`` updates; a fetch older than that is dropped entirely (conservative:
the next miss fetches again).

Not thread-safe by itself: the cache calls it under its writer lock.
"""

from __future__ import annotations

from collections import deque

import numpy as np


class UpdateLog:
    """Epoch counter plus the keys of the last ``max_entries`` updates."""

    def __init__(self, max_entries: int = 4096) -> None:
        if max_entries <= 0:
            raise ValueError(f"max_entries must be positive, got {max_entries}")
        self.epoch = 0
        self._barrier = 0  # fetches that started before this epoch are stale as a whole
        self._max = max_entries
        self._log: deque[tuple[int, np.ndarray]] = deque()

    def record(self, keys: np.ndarray) -> int:
        """Log an update of ``keys`` (host int64); return the new epoch."""
        self.epoch += 1
        self._log.append((self.epoch, np.array(keys, dtype=np.int64, copy=True).reshape(-1)))
        while len(self._log) > self._max:
            self._log.popleft()
        return self.epoch

    def record_all(self) -> int:
        """Log that every key changed (a new model version, a cleared cache)."""
        self.epoch += 1
        self._barrier = self.epoch
        self._log.clear()
        return self.epoch

    def fresh(self, keys: np.ndarray, since: int) -> np.ndarray | None:
        """Mask of ``keys`` not updated after epoch ``since``; ``None`` when all are fresh."""
        if since >= self.epoch:
            return None
        if since < self._barrier or not self._log or self._log[0][0] > since + 1:
            return np.zeros(keys.size, dtype=bool)  # the log no longer reaches back: drop all
        updated = [k for e, k in self._log if e > since]
        return ~np.isin(keys, np.concatenate(updated))
