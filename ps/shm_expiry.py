"""Expiry (``ttl_seconds``) of a ``multi_process_hash_map`` table, shared by the processes of
a host.

A table with a TTL is *clocked* (:class:`~tierserve.ps.hash_table.HashTable`): its recency
ticks are times.  In shared memory every process stamps the same per-slot ticks, so the ticks
count from one start that all of them read from the table's header: a ``CLOCK_MONOTONIC``
reading in nanoseconds (:func:`time.monotonic_ns`), which is one clock for every process of
the host.

One process sweeps: the first live process in the header's list of users (the one that has
used the table longest; when it ends the next one takes over, since dead processes are never
counted).  It removes the rows under the table's write lock (``flock``), as any write, and
appends their keys to the table's *expiry log*, a file ``<name>.xlog`` beside the slots.
Every process, the sweeping one included, reads from the log the keys it has not read yet on
its own sweeps, and tells its embedding caches to drop them: the caches of every process
forget an expired row within one sweep interval, as in-process.  Each user's read position
is kept in the header beside its pid; the sweeping process drops the part of the log that
every live user has read, so the log holds at most about one sweep interval of expired keys.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

#: Header fields (int64, see :mod:`tierserve.ps.shm_hash_map`): the clock's start (ns of
#: ``CLOCK_MONOTONIC``), the TTL in ms (0: none), the sequence number of the log's first key
#: and of the key after its last.
CLOCK, TTL_MS, LOG_BASE, LOG_END = 9, 10, 11, 12


def ttl_ms(seconds: float | None) -> int:
    """The header's TTL field for ``seconds`` (0: no TTL)."""
    return 0 if seconds is None else max(1, round(seconds * 1000))


def append(path: Path, header: np.ndarray, low: int, keys: np.ndarray) -> None:
    """Drop the log's keys before sequence number ``low`` (read by every live user) and
    append ``keys``.  Under the table's write lock."""
    base, end = int(header[LOG_BASE]), int(header[LOG_END])
    low = min(max(low, base), end)
    if low == base and not keys.size:
        return
    kept = read(path, header, low)
    data = np.concatenate([kept, np.asarray(keys, dtype=np.int64)])
    tmp = path.with_name(path.name + ".new")
    data.tofile(tmp)
    os.replace(tmp, path)
    header[LOG_BASE] = low
    header[LOG_END] = end + keys.size


def read(path: Path, header: np.ndarray, start: int) -> np.ndarray:
    """The logged keys from sequence number ``start`` (at least the log's first) on."""
    base, end = int(header[LOG_BASE]), int(header[LOG_END])
    start = max(start, base)
    if start >= end:
        return np.empty(0, dtype=np.int64)
    return np.fromfile(path, dtype=np.int64, count=end - start, offset=8 * (start - base))
