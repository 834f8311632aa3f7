"""One table's embedding cache on one device, in front of the parameter server.

:class:`EmbeddingCache` answers :meth:`~EmbeddingCache.query` from its table (numpy on the
CPU, cupy on a GPU) and fetches the misses from the parameter server in one batched
``lookup``.  A ``dynamic`` cache then inserts what it fetched: synchronously while the
running hit rate is below ``hit_rate_threshold`` (warming up), else through a background
worker with a bounded queue, so a warm cache never waits on inserts.  A ``static`` cache
holds a whole table and never inserts.

Consistency.  Writers (inserts, updates, refreshes) hold one lock and bump a sequence
number before and after they change the table; readers take no lock, and retry (then lock)
when the sequence number moved while they read, so a query never mixes a key with another
key's vector.  On the CPU, writers first log which slots they change: a reader overlapped
by writes that changed none of the slots it hit keeps its result (the async insert worker
writes while the next query reads; retrying every such read cost ~0.7 reads per query in
the power-law benchmark).  An update applied to the parameter server reaches the cache
through :meth:`~EmbeddingCache.on_update` before the update returns (see
:class:`~tierserve.cache.protocols.UpdateNotifier`), and :class:`~tierserve.cache.freshness.
UpdateLog` keeps a vector fetched before an update from being inserted after it.  So a
query that starts after an update was applied never returns the old vector.

Compact rows.  With ``storage_dtype`` ``float16`` or ``int8`` the table holds each row as
the parameter server's tiers do (:class:`~tierserve.ps.row_codec.RowCodec` words): vectors
are encoded as they enter (fetched, updated, refreshed) and a query decodes its hits (on the
GPU with cupy there).  An int8 row re-encoded from the served float32 values decodes to them
within float32 rounding.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections import deque
from typing import Literal

import numpy as np

from tierserve.core.errors import ConfigError, InvalidInputError
from tierserve.ps.keys import MAX_KEY32, as_keys
from tierserve.ps.row_codec import RowCodec

from . import cpu_kernels
from .cpu_kernels import distinct_by_count
from .device import array_module, device_context, to_host
from .freshness import UpdateLog
from .insert_worker import InsertWorker
from .metrics import CacheMetrics
from .protocols import ParameterServerLike, UpdateNotifier
from .set_associative import SetAssociativeTable
from .static_table import StaticTable

log = logging.getLogger(__name__)

CacheType = Literal["dynamic", "static"]
_EMA = 0.2  # weight of the newest batch in the running hit rate
_REFRESH_CHUNK = 65536
_WRITE_LOG = 64  # writes whose slots readers can check (see _read)
#: Ways per set.  Two cost the fewest array passes per lookup; in the power-law benchmark
#: (alpha 1.2, 20% cache) 2, 4 and 8 ways reach the same hit rate within 0.5%.
DEFAULT_WAYS = 2


def _check_options(
    cache_type, on_update_mode, hit_rate_threshold, dim, capacity, refresh_interval, refresh_delay
) -> None:
    """Refuse an :class:`EmbeddingCache` setting out of range (:class:`ConfigError` naming it)."""
    if cache_type not in ("dynamic", "static"):
        raise ConfigError(f"embedding_cache_type must be 'dynamic' or 'static', got {cache_type!r}")
    if on_update_mode not in ("overwrite", "invalidate"):
        raise ConfigError(f"on_update_mode must be 'overwrite' or 'invalidate', got {on_update_mode!r}")
    if not 0.0 <= hit_rate_threshold <= 1.0:
        raise ConfigError(f"hit_rate_threshold must be in [0, 1], got {hit_rate_threshold}")
    if dim <= 0:
        raise ConfigError(f"dim must be positive, got {dim}")
    if capacity <= 0:
        raise ConfigError(f"cache capacity must be positive, got {capacity}")
    if refresh_interval < 0 or refresh_delay < 0:
        raise ConfigError("refresh_interval and refresh_delay must not be negative")


class EmbeddingCache:
    """The cache of table ``table`` of model ``model`` (vectors of length ``dim``).

    ``capacity`` is the most embeddings it holds (the dynamic table rounds it down to a
    multiple of ``ways``).  ``refresh_interval`` / ``refresh_delay`` (seconds, 0 = never)
    re-pull every cached row from the parameter server periodically, starting after the
    delay.  ``use_gpu`` puts the table on CUDA device ``device_id`` with cupy (extra
    ``gpu``); ``use_kernel`` picks the CUDA kernels there (lookup and insert; ``None``: when
    they compile).
    A static cache needs ``static_keys``, every key of the table; their vectors are read from
    the parameter server.  ``on_update_mode`` says what an update does to a cached row:
    ``"overwrite"`` it with the new vector or ``"invalidate"`` it.  When the parameter
    server is an :class:`~tierserve.cache.protocols.UpdateNotifier` and ``listen`` is true,
    the cache registers itself for updates.  ``storage_dtype`` stores rows compact (see the
    module's notes); queries answer float32 either way.
    """

    def __init__(
        self,
        parameter_server: ParameterServerLike,
        model: str,
        table: str,
        dim: int,
        capacity: int,
        *,
        cache_type: CacheType = "dynamic",
        hit_rate_threshold: float = 0.9,
        refresh_interval: float = 0.0,
        refresh_delay: float = 0.0,
        use_gpu: bool = False,
        device_id: int = 0,
        ways: int = DEFAULT_WAYS,
        max_queued_inserts: int = 64,
        i64_input_key: bool = True,
        use_kernel: bool | None = None,
        static_keys: np.ndarray | None = None,
        on_update_mode: Literal["overwrite", "invalidate"] = "overwrite",
        listen: bool = True,
        storage_dtype: str = "float32",
    ) -> None:
        _check_options(cache_type, on_update_mode, hit_rate_threshold, dim, capacity,
                       refresh_interval, refresh_delay)  # fmt: skip
        self.model = model
        self.table = table
        self.dim = int(dim)
        self.codec = RowCodec(storage_dtype, self.dim)
        self.cache_type = cache_type
        self.refresh_interval, self.refresh_delay = float(refresh_interval), float(refresh_delay)
        self.hit_rate_threshold = float(hit_rate_threshold)
        self.i64_input_key = i64_input_key
        self.on_update_mode = on_update_mode
        self.device = f"cuda:{device_id}" if use_gpu else "cpu"
        self.xp = array_module(use_gpu, device_id)
        self._ps = parameter_server
        self._device_id = device_id
        self._init_counters()
        self._kernel = None
        cpu_kernels.warm_up()  # compile now, not in the first query (distinct_by_count: all caches)
        self._build_table(capacity, ways, use_kernel, static_keys)
        self.capacity = self._table.capacity
        self._listening = False
        if listen and isinstance(parameter_server, UpdateNotifier):
            parameter_server.add_update_listener(self.on_update)
            self._listening = True
        if cache_type == "static":
            self._fill_static()
        self._start_workers(max_queued_inserts)

    def _init_counters(self) -> None:
        """The writers' lock and sequence, the write log and the statistics."""
        self._lock = threading.Lock()  # writers
        self._seq = 0  # odd while a writer changes the table
        self._written: deque = deque(maxlen=_WRITE_LOG)  # (odd seq, slots changed or None)
        self._stats = threading.Lock()
        self._log = UpdateLog()
        self._tick = 0
        self._hits = self._misses = 0
        self._running = 0.0
        self._inserted = self._evicted = self._stale = self._updates = self._refreshed = 0
        self._closed = False

    def _build_table(
        self, capacity: int, ways: int, use_kernel: bool | None, static_keys: np.ndarray | None
    ) -> None:
        """The table on its device (static: ``static_keys``, rows filled later; dynamic:
        set-associative) and, on a GPU, the CUDA lookup kernel."""
        with device_context(self.xp, self._device_id):
            if self.cache_type == "static":
                if static_keys is None:
                    raise ConfigError("a static embedding cache needs the table's keys (static_keys)")
                keys = self._as_keys(static_keys, "static_keys")
                self._table = StaticTable(
                    keys, np.zeros((keys.size, self.codec.words), np.float32), capacity, self.xp,
                    what=f"table {self.table!r} of model {self.model!r}",
                )
            else:
                self._table = SetAssociativeTable(capacity, self.codec.words, ways, self.xp)
            if self.xp is not np and use_kernel is not False:
                from .kernels import load_kernels

                self._kernel = load_kernels(required=bool(use_kernel))
                if self.cache_type == "dynamic":
                    self._table.kernels = self._kernel

    def _start_workers(self, max_queued_inserts: int) -> None:
        """The insert worker (dynamic caches) and the refresher (``refresh_interval``)."""
        table = self.table
        self._worker = (
            InsertWorker(self._insert_fetched, max_queued_inserts, name=f"cache-insert-{table}")
            if self.cache_type == "dynamic"
            else None
        )
        self._stop = threading.Event()
        self._refresher = None
        if self.refresh_interval > 0:
            self._refresher = threading.Thread(
                target=self._refresh_loop, args=(self.refresh_delay, self.refresh_interval),
                name=f"cache-refresh-{table}", daemon=True,
            )
            self._refresher.start()

    @property
    def device_id(self) -> int:
        """The CUDA device of the table (meaningless on numpy)."""
        return self._device_id

    # --- queries ----------------------------------------------------------------------------

    def query(self, keys):
        """float32 ``[len(keys), dim]`` embeddings of ``keys`` (an ``xp`` array).

        Hits come from the cache, misses from one parameter-server lookup (defaults for
        keys it does not know).  ``keys`` is a 1-D integer array (numpy, or cupy on a GPU).
        """
        xp = self.xp
        with device_context(self.xp, self._device_id):
            if xp is not np and isinstance(keys, xp.ndarray):
                keys_d = self._as_device_keys(keys)
                keys_h = None
            else:
                keys_h = self._as_keys(keys, "keys")
                keys_d = keys_h if xp is np else xp.asarray(keys_h)
            out, hit, hits, miss_idx = self._read(keys_d, self._next_tick())
            return self._serve(keys_h, keys_d, out, hit, hits, miss_idx)

    lookup = query

    def _next_tick(self) -> int:
        """The batch number of a new query."""
        with self._stats:
            self._tick += 1
            return self._tick

    def _serve(self, keys_h, keys_d, out, hit, hits: int, miss_idx):
        """Complete a read of ``keys_d`` (``keys_h``: the same keys on the host, or ``None``):
        fetch the misses (``~hit``; ``miss_idx`` their positions where known) into ``out``,
        count, and insert what was fetched.  Returns ``out``."""
        xp = self.xp
        with device_context(self.xp, self._device_id):
            n = int(keys_d.size)
            misses = n - hits
            if misses:
                if miss_idx is None:
                    # On a GPU the flags come to the host (n bytes) rather than a device
                    # nonzero (several launches and a synchronisation).
                    miss_idx = np.flatnonzero(~to_host(hit))
                miss_keys = (to_host(keys_d) if keys_h is None else keys_h)[miss_idx]
                # Most requested first: where a set cannot take every new key, they win.
                unique, inverse = distinct_by_count(miss_keys)
                epoch = self._log.epoch  # before the fetch: updates after it make it stale
                fetched = self._fetch(unique)
                if xp is np:
                    out[miss_idx] = fetched[inverse]
                else:  # the missed rows in order, one copy each for rows and positions
                    out[xp.asarray(miss_idx)] = xp.asarray(fetched[inverse])
            self._account(n, hits)
            if misses and self._worker is not None:
                if self._running < self.hit_rate_threshold:
                    self._insert_fetched(unique, fetched, epoch)
                else:
                    self._worker.submit(unique, fetched, epoch)
            return out

    def _read(self, keys, tick: int):
        """``(embeddings, hit, hits, misses)`` of a consistent read (``misses``: positions
        of the misses, where the lookup gives them).  When writes overlapped it and the
        write log names the slots they changed, the hits on those slots count as misses
        (the caller fetches them from the parameter server like any miss), so a reader never
        waits for a long insert; otherwise it is retried, at last under the writer lock."""
        for _ in range(3):
            seq = self._seq
            out, hit, hits, slots, misses = self._lookup(keys, tick)
            now = self._seq
            if now == seq and not seq & 1:
                return out, hit, hits, misses
            changed = None if slots is None else self._touched(slots, hit, seq, now)
            if changed is not None:
                if changed.size:
                    hit[changed] = False
                    return out, hit, hits - int(changed.size), None
                return out, hit, hits, misses
        with self._lock:
            out, hit, hits, _, misses = self._lookup(keys, tick)
            return out, hit, hits, misses

    def _touched(self, slots, hit, seq: int, now: int):
        """The positions of a read's hits whose slots the writes that overlapped it
        (sequence numbers ``seq`` .. ``now``) changed; ``None`` when the write log cannot
        tell (it no longer reaches back, or a write may have changed any slot)."""
        first = seq if seq & 1 else seq + 1  # writes are logged under odd numbers
        if now < first:
            return np.empty(0, dtype=np.int64)
        written = [at for odd, at in list(self._written) if first <= odd <= now]
        if len(written) != (now - first) // 2 + 1 or any(at is None for at in written):
            return None
        return cpu_kernels.touched(slots, hit, np.concatenate(written))

    def _lookup(self, keys, tick: int):
        """``(embeddings, hit, hits, slots, misses)``: float32 embeddings (decoded),
        ``slots`` the slots read and ``misses`` the positions of the misses, where known
        (else ``None``)."""
        if self.cache_type == "dynamic":
            if self._kernel is not None:
                out, hit, hits = self._kernel.lookup(self._table, keys, tick)
                return self.codec.decode(out, self.xp), hit, hits, None, None
            if self.xp is np:  # the CPU kernel decodes as it copies
                slots = np.empty(keys.size, dtype=np.int64)
                misses = np.empty(keys.size, dtype=np.int64)
                out, hit, hits = self._table.lookup(keys, tick, slots, misses, self.codec)
                return out, hit, hits, slots, misses[: keys.size - hits]
        out, hit, hits = self._table.lookup(keys, tick)
        return self.codec.decode(out, self.xp), hit, hits, None, None

    def _fetch(self, keys: np.ndarray) -> np.ndarray:
        vectors = np.asarray(self._ps.lookup(self.model, self.table, keys), dtype=np.float32)
        if vectors.shape != (keys.size, self.dim):
            raise InvalidInputError(
                f"parameter server returned shape {vectors.shape} for {keys.size} keys of table "
                f"{self.table!r}; expected ({keys.size}, {self.dim})"
            )
        return vectors

    def _encode(self, vectors: np.ndarray) -> np.ndarray:
        """Host float32 vectors as the table's stored rows."""
        return self.codec.encode(vectors, f"vectors of table {self.table!r}")

    def _account(self, n: int, hits: int) -> None:
        with self._stats:
            self._hits += hits
            self._misses += n - hits
            if n:
                rate = hits / n
                first = self._hits + self._misses == n
                self._running = rate if first else (1 - _EMA) * self._running + _EMA * rate

    # --- writes -----------------------------------------------------------------------------

    @contextlib.contextmanager
    def _changing(self, slots=None):
        """Bump the sequence number around a change of the table (the caller holds the
        writer lock), after logging which ``slots`` change (numpy int64; ``None``: maybe
        any), so that readers whose read overlapped only other slots need not retry."""
        if slots is not None and not isinstance(slots, np.ndarray):
            slots = None
        self._written.append((self._seq + 1, slots))
        self._seq += 1
        try:
            yield
        finally:
            self._seq += 1

    @contextlib.contextmanager
    def _writing(self):
        """The writer lock, and a change of any slot."""
        with self._lock, self._changing():
            yield

    def _insert_fetched(self, keys: np.ndarray, vectors: np.ndarray, epoch: int) -> None:
        """Insert fetched ``vectors`` unless an update overtook them (see UpdateLog).

        Earlier keys win where a set cannot take them all (callers pass the hottest first).
        """
        xp = self.xp
        with device_context(self.xp, self._device_id), self._lock:
            fresh = self._log.fresh(keys, epoch)
            if fresh is not None:
                with self._stats:
                    self._stale += int(keys.size - np.count_nonzero(fresh))
                keys, vectors = keys[fresh], vectors[fresh]
            if not keys.size:
                return
            inserted, evicted = self._table.insert(
                xp.asarray(keys), xp.asarray(self._encode(vectors)), self._tick, self._changing
            )
        with self._stats:
            self._inserted += inserted
            self._evicted += evicted

    def on_update(self, model: str, table: str, keys, embeddings=None) -> None:
        """Apply an update the parameter server has just stored (the listener hook).

        Updates of other tables are ignored.  Cached rows of ``keys`` are overwritten with
        ``embeddings`` (or dropped, with ``embeddings=None``, ``on_update_mode
        "invalidate"`` or embeddings of the wrong shape) before this returns; repeated keys
        keep their last vector.  ``keys=None`` means every row changed (a new model
        version was swapped in): the cache is cleared.
        """
        if model != self.model or table != self.table or self._closed:
            return
        if keys is None:  # the whole table changed (a new model version)
            self.clear()
            with self._stats:
                self._updates += 1
            return
        keys_h = self._as_keys(keys, "keys")
        vectors = None
        if embeddings is not None and self.on_update_mode == "overwrite":
            vectors = np.asarray(embeddings, dtype=np.float32)
            if vectors.shape == (keys_h.size, self.dim):
                keys_h, last = np.unique(keys_h[::-1], return_index=True)
                vectors = vectors[::-1][last]
            else:  # cannot take these vectors: dropping the rows is still correct
                log.warning(
                    "update of %s/%s has embeddings of shape %s for %d keys of dim %d; "
                    "dropping the cached rows instead", model, table, vectors.shape,
                    keys_h.size, self.dim,
                )
                vectors = None
        if vectors is None:
            keys_h = np.unique(keys_h)
        xp = self.xp
        with device_context(self.xp, self._device_id), self._lock:
            self._log.record(keys_h)
            keys_d = xp.asarray(keys_h)
            if vectors is None:
                self._table.invalidate(keys_d, self._changing)
            else:
                self._table.overwrite(keys_d, xp.asarray(self._encode(vectors)), self._changing)
        with self._stats:
            self._updates += 1

    def update(self, keys, embeddings) -> None:
        """Write through: store in the parameter server, then in this cache (online update)."""
        keys_h = self._as_keys(keys, "keys")
        vectors = np.asarray(embeddings, dtype=np.float32)
        self._ps.insert(self.model, self.table, keys_h, vectors)
        if not self._listening:
            self.on_update(self.model, self.table, keys_h, vectors)

    def invalidate(self, keys) -> None:
        """Drop ``keys`` from the cache (and treat fetches in flight for them as stale)."""
        self.on_update(self.model, self.table, keys, None)

    def clear(self) -> None:
        """Drop every cached row, e.g. after the parameter server swapped model versions.

        Fetches in flight are treated as stale, so nothing read before the clear is inserted
        after it.  A static cache keeps its keys; its rows miss until refreshed.
        """
        with device_context(self.xp, self._device_id), self._writing():
            self._log.record_all()
            self._table.clear()

    def refresh(self) -> int:
        """Re-pull every cached row from the parameter server; return how many were refreshed."""
        xp = self.xp
        with device_context(self.xp, self._device_id):
            with self._lock:
                cached = to_host(self._table.cached_keys())
                epoch = self._log.epoch
            total = 0
            for start in range(0, cached.size, _REFRESH_CHUNK):
                keys = cached[start : start + _REFRESH_CHUNK]
                vectors = self._fetch(keys)
                with self._lock:
                    fresh = self._log.fresh(keys, epoch)
                    if fresh is not None:  # updated since: the cache already has newer rows
                        keys, vectors = keys[fresh], vectors[fresh]
                    total += self._table.overwrite(
                        xp.asarray(keys), xp.asarray(self._encode(vectors)), self._changing
                    )
        with self._stats:
            self._refreshed += total
        return total

    def _refresh_loop(self, delay: float, interval: float) -> None:
        if self._stop.wait(delay):
            return
        while not self._stop.is_set():
            try:
                self.refresh()
            except Exception:
                log.exception("embedding cache %s/%s: refresh failed", self.model, self.table)
            if self._stop.wait(interval):
                return

    def _fill_static(self) -> None:
        keys = to_host(self._table._keys)
        for start in range(0, keys.size, _REFRESH_CHUNK):
            chunk = keys[start : start + _REFRESH_CHUNK]
            epoch = self._log.epoch
            vectors = self._fetch(chunk)
            with device_context(self.xp, self._device_id), self._writing():
                fresh = self._log.fresh(chunk, epoch)
                if fresh is not None:
                    self._table.invalidate(self.xp.asarray(chunk[~fresh]))
                    chunk, vectors = chunk[fresh], vectors[fresh]
                self._table.overwrite(self.xp.asarray(chunk), self.xp.asarray(self._encode(vectors)))

    # --- housekeeping -----------------------------------------------------------------------

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until queued async inserts are in the table; ``False`` on timeout."""
        return True if self._worker is None else self._worker.flush(timeout)

    def metrics(self) -> CacheMetrics:
        """Hit and miss counts, hit rate, size and insert queue depth."""
        with self._stats:
            total = self._hits + self._misses
            return CacheMetrics(
                model=self.model,
                table=self.table,
                device=self.device,
                cache_type=self.cache_type,
                capacity=self.capacity,
                size=int(self._table.size),
                hits=self._hits,
                misses=self._misses,
                hit_rate=self._hits / total if total else 0.0,
                running_hit_rate=self._running,
                insert_queue_depth=self._worker.depth if self._worker else 0,
                inserted=self._inserted,
                evicted=self._evicted,
                dropped_inserts=self._worker.dropped if self._worker else 0,
                stale_dropped=self._stale,
                updates=self._updates,
                refreshed=self._refreshed,
            )

    def close(self) -> None:
        """Stop the worker and refresher and unregister from the parameter server."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if self._worker is not None:
            self._worker.close()
        if self._refresher is not None:
            self._refresher.join(5.0)
        if self._listening:
            with contextlib.suppress(Exception):
                self._ps.remove_update_listener(self.on_update)
            self._listening = False

    def __enter__(self) -> EmbeddingCache:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- keys -------------------------------------------------------------------------------

    def _as_keys(self, keys, what: str) -> np.ndarray:
        if type(keys) is not np.ndarray:
            keys = to_host(keys)
        return as_keys(keys, 64 if self.i64_input_key else 32, what)

    def _as_device_keys(self, keys):
        """Device keys by :func:`tierserve.ps.keys.as_keys`' rule, without a host copy."""
        keys = keys.reshape(-1)
        if keys.size and keys.dtype.kind not in "iu":
            raise InvalidInputError(f"keys must be integers, got dtype {keys.dtype}")
        if not self.i64_input_key:
            if keys.dtype.itemsize <= 4:
                if keys.dtype.kind == "i":
                    keys = keys.astype(np.int32, copy=False).view(np.uint32)
            elif keys.size and (bool((keys < 0).any()) or bool((keys > MAX_KEY32).any())):
                as_keys(to_host(keys), 32)  # raises, naming the key
        if keys.dtype == np.uint64:
            keys = keys.view(np.int64)
        if keys.dtype != np.int64:
            keys = keys.astype(np.int64)
        return self.xp.ascontiguousarray(keys)
