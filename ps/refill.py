"""Refilling a Redis volatile tier whose node came back empty.

A Redis server or cluster node restarted without persistence comes back empty; with
``initialize_after_startup`` (HugeCTR's: this process fills the volatile tier) the
parameter server fills it again, in the background, as it did at startup.

How it knows: the Redis tier marks every partition of a table it loaded with a small key on
the partition's own node (``hps_et{<tag>/pN}s``, see :meth:`RedisTier.mark_partitions`).  A
node that lost its data lost the marks of its partitions with it.  Every
``refill_interval_ms`` a :class:`Refiller` thread asks, per served table, which partitions
lack their mark (one round trip per node), and fills those partitions again:

- from the persistent tier when it holds the table (it also took the online updates), else
  from the version's sparse model files;
- the keys of those partitions only, ``initial_cache_rate`` of them as at startup when a
  persistent tier stands behind;
- then marks them.  A node that fails mid-way is tried again at the next check.

Lookups meanwhile fall through to the persistent tier or the default vector, as for any
miss.  An online update that reached the empty node before its refill may be overwritten by
the source's vector when the source did not take that update (the files never do).
"""

from __future__ import annotations

import logging
import math
import threading

import numpy as np

from tierserve.core.errors import BackendUnavailableError, TierserveError

from .partition import partition_of
from .redis_tier import RedisTierConfig
from .rocksdb_tier import RocksDBConfig
from .sparse_file import read_rows

log = logging.getLogger(__name__)

#: Keys per insert while refilling (bounds the memory a refill holds at once).
CHUNK = 1 << 16


class Refiller:
    """Checks the served tables of ``ps`` and refills empty partitions of its Redis tier."""

    def __init__(self, ps, interval_s: float) -> None:
        self.ps = ps
        self.tier = ps.volatile
        self.interval_s = interval_s
        vdb = ps.config.volatile_db
        self.initial_cache_rate = float(vdb.initial_cache_rate)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tierserve-refill", daemon=True)

    def start(self) -> Refiller:
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop checking (waits for a refill in progress to reach its next chunk)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.check()
            except Exception:  # the thread must outlive any one failure
                log.exception("refill check failed")

    def check(self) -> int:
        """One pass over the served tables; returns how many keys it wrote back."""
        written = 0
        for name in self.ps.models():
            try:
                model = self.ps.model(name)
            except TierserveError:
                continue  # unloaded meanwhile
            if not model.acquire():
                continue  # being replaced: its tables go away
            try:
                for index, spec in enumerate(model.tables.values()):
                    if self._stop.is_set():
                        return written
                    written += self._check_table(model, index, spec)
            finally:
                model.release()
        return written

    def _check_table(self, model, index: int, spec) -> int:
        try:
            empty = self.tier.unmarked_partitions(spec.storage)
        except BackendUnavailableError as exc:
            log.debug("refill check of %s skipped: %s", spec.storage, exc)
            return 0
        if not empty:
            return 0
        log.warning(
            "%s: partitions %s of %s lost their data (node restarted empty?); refilling",
            self.tier.kind, empty, spec.storage,
        )  # fmt: skip
        try:
            written, source = self._refill(model, index, spec, np.asarray(empty))
            self.tier.mark_partitions(spec.storage, empty)
        except BackendUnavailableError as exc:
            log.warning("refill of %s interrupted, tried again later: %s", spec.storage, exc)
            return 0
        self.tier.stats.refilled += written
        log.info("refilled %d keys of %s from %s", written, spec.storage, source)
        return written

    def _refill(self, model, index: int, spec, empty: np.ndarray) -> tuple[int, str]:
        persistent = self.ps.persistent
        n = self.tier.num_partitions
        written = 0
        if persistent is not None and persistent.dim(spec.storage) is not None:
            keys = persistent.list_keys(spec.storage)
            keys = keys[np.isin(partition_of(keys, n), empty)]
            keys = keys[: int(math.ceil(self.initial_cache_rate * keys.size))]
            for c0 in range(0, keys.size, CHUNK):
                if self._stop.is_set():
                    raise BackendUnavailableError("refill stopped: the server is closing")
                chunk = keys[c0 : c0 + CHUNK]
                emb, found = persistent.lookup(spec.storage, chunk)
                if found.any():
                    self.tier.insert(spec.storage, chunk[found], emb[found])
                    written += int(found.sum())
            return written, f"the {persistent.kind} tier"
        path = model.config.sparse_files[index]
        keys, rows = read_rows(path, spec.codec)  # as the table stores them
        keys = np.asarray(keys)
        count = keys.shape[0]
        if persistent is not None:  # as at startup: the rest stays in the persistent tier
            count = min(count, int(math.ceil(self.initial_cache_rate * count)))
        for c0 in range(0, count, CHUNK):
            if self._stop.is_set():
                raise BackendUnavailableError("refill stopped: the server is closing")
            c1 = min(count, c0 + CHUNK)
            chunk = keys[c0:c1]
            mine = np.flatnonzero(np.isin(partition_of(chunk, n), empty))
            if mine.size:
                self.tier.insert(spec.storage, chunk[mine], rows[c0:c1][mine])
                written += int(mine.size)
        return written, f"the model files ({path})"


def start_refill(ps) -> Refiller | None:
    """A started :class:`Refiller` for ``ps``, or None when its volatile tier needs none.

    Only a Redis tier that this process fills (``initialize_after_startup`` true and no
    read-only persistent tier, which makes the server attach instead) with a nonzero
    ``refill_interval_ms``.
    """
    vdb = ps.config.volatile_db
    if not isinstance(vdb, RedisTierConfig) or ps.volatile is None:
        return None
    pdb = ps.config.persistent_db
    attaches = isinstance(pdb, RocksDBConfig) and pdb.read_only
    if not vdb.initialize_after_startup or attaches or vdb.refill_interval_ms == 0:
        return None
    return Refiller(ps, vdb.refill_interval_ms / 1000.0).start()
