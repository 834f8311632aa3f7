"""``multi_process_hash_map``: the hash map tier in shared memory, one copy per host, and
its ``ps.json`` config.

Every process of a host that opens this tier with the same ``shared_memory_name`` sees the
same tables: a table's slots (the index of keys, the vector rows and the per-slot statistics
of :class:`~tierserve.ps.hash_table.HashTable`, in that order) live in a file under
``/dev/shm/<shared_memory_name>/`` that each process memory-maps.  Lookups take no lock, as
in the in-process map: a writer fills a slot's vector before its key, and a rebuild
(growth, eviction) fills a new file and then publishes it in the table's header, which
readers check on every lookup.  Writers, whichever process they run in, take the header's
file lock (``flock``), so online updates may be applied by any one process of the host and
every other process reads them at once.

Versions: a table is named by its storage name and a fingerprint of the rows it was loaded
with, so processes that load the same version of a table share one copy (the first loads,
the others find it complete and attach) and processes that happen to give different content
the same storage name never write into each other's copy.  Each process records itself in
the header while it uses a table; dropping or closing removes it, and the last one (processes
that died are pruned) removes the files when ``auto_remove`` is set.

A table with ``ttl_seconds`` keeps its rows' access times on one clock for the host, and one
process sweeps it for every process (:mod:`tierserve.ps.shm_expiry`).  Processes sharing a
table must give it the same TTL (another is refused, naming ``ttl_seconds``).

A table that does not fit is refused before anything is written: a :class:`ConfigError`
naming the bytes it needs and either ``/dev/shm``'s free space (a container's is 64 MiB by
default: docker's ``shm_size``) or the tier's ``shared_memory_size``.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import mmap
import os
import time
from glob import escape as glob_escape
from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import quote

import numpy as np
from pydantic import Field, model_validator

from tierserve.core.errors import ConfigError, InvalidInputError

from . import hash_kernels as _k
from . import shm_expiry as _x
from .config_base import (
    UNBOUNDED,
    DatabaseType_t,
    InProcessConfig,
    PositiveInt,
)
from .eviction import check_ttl_policy
from .hash_map import HashMapTier
from .hash_table import _MAX_FILL, _TICK_REBASE, CLOCK_TICKS_PER_S, HashTable, _slots, _State
from .partition import GOLDEN

#: Where the tier's folders live.
SHM_ROOT = Path("/dev/shm")


class MultiProcessHashMapConfig(InProcessConfig):
    """The hash map in shared memory (``/dev/shm``): one copy per host that every process of
    the host reads (HugeCTR's ``multi_process_hash_map``).  ``shared_memory_size`` caps the
    bytes its tables may take, ``shared_memory_name`` names its folder under ``/dev/shm``;
    ``auto_remove`` removes a table's memory when the last process using it drops it or
    closes."""

    type: Literal[DatabaseType_t.multi_process_hash_map] = DatabaseType_t.multi_process_hash_map
    num_partitions: PositiveInt = 1
    shared_memory_size: PositiveInt = 16 * 1024**3
    shared_memory_name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{1,100}$")] = (
        "hctr_mp_hash_map_database"
    )
    auto_remove: bool = True

    @model_validator(mode="after")
    def _loads_itself(self):
        if not self.initialize_after_startup:
            raise ValueError(
                "initialize_after_startup false is not available for multi_process_hash_map: "
                "the first process that loads a version fills its tables and the others attach "
                "to them; there are no tables of an earlier run to attach to"
            )
        return self

# Header: int64 fields (9 to 12: shm_expiry's), then the pids of the processes using the
# table, then each one's read position in the expiry log.
_EPOCH, _NEXT, _CAP, _SEED, _LIVE, _USED, _DIM, _TRACK, _COMPLETE = range(9)
_PIDS, _MAX_PIDS = 16, 240
_READ = _PIDS + _MAX_PIDS
_HEADER_BYTES = 8 * (_READ + _MAX_PIDS)


def _layout(cap: int, dim: int, track: bool) -> tuple[int, int, int]:
    """Slots, and the byte offsets of the rows and of the end of the file.  The index starts
    the file (a page boundary) and fills whole cache lines, so the rows start on one too."""
    nslots = _slots(cap)
    rows_at = nslots * 8
    stats_at = rows_at + nslots * dim * 4
    return nslots, rows_at, stats_at + (nslots * 4 if track else 0)


class _SharedState(_State):
    """A :class:`_State` whose arrays are views of a shared-memory file."""

    def __init__(self, path: Path, cap: int, dim: int, track: bool, seed: int, create: bool,
                 check_space=None) -> None:  # fmt: skip
        nslots, rows_at, size = _layout(cap, dim, track)
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        fd = os.open(path, flags, 0o600)
        try:
            if create:
                if check_space is not None:
                    check_space(size)
                try:
                    os.posix_fallocate(fd, 0, size)  # no SIGBUS later: the pages are reserved
                except OSError as exc:
                    os.unlink(path)
                    raise ConfigError(
                        f"multi_process_hash_map: cannot reserve {size / 2**20:,.1f} MiB in "
                        f"{path.parent}: {exc.strerror}"
                    ) from None
            self.mm = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        buf = np.frombuffer(self.mm, dtype=np.uint8)
        self.cap = cap
        self.seed = seed
        self.index = buf[:rows_at].view(np.int64)
        self.rows = buf[rows_at : rows_at + nslots * dim * 4].view(np.float32).reshape(nslots, dim)
        self.stats = buf[rows_at + nslots * dim * 4 : size].view(np.int32)
        if create:
            self.index.fill(_k.EMPTY_KEY)
        self.live = 0
        self.used = 0
        self.limit = int(_MAX_FILL * cap)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class SharedHashTable(HashTable):
    """A :class:`HashTable` in shared memory (see the module docstring): ``folder/name.hdr``
    holds the header, ``folder/name.<epoch>`` the slots of each published generation and,
    with a TTL (``ttl`` seconds), ``folder/name.xlog`` the expiry log."""

    def __init__(self, folder: Path, name: str, dim: int, track: str | None = None,
                 check_space=None, ttl: float | None = None) -> None:  # fmt: skip
        self.folder, self.name = folder, name
        self.removed = 0  # rows the last expire() removed (in any process: see shm_expiry)
        if ttl is not None:
            track = "recency"
        self._check_space = check_space
        path = folder / f"{name}.hdr"
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if os.fstat(fd).st_size < _HEADER_BYTES:
                os.ftruncate(fd, _HEADER_BYTES)
            self._header_mm = mmap.mmap(fd, _HEADER_BYTES)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        self.header = np.frombuffer(self._header_mm, dtype=np.int64)
        self._epoch = -1
        try:
            h = self.header
            if h[_DIM] and int(h[_DIM]) != dim:
                raise InvalidInputError(
                    f"shared table {name} exists with dim {int(h[_DIM])}, not {dim}"
                )
            fresh = self._fresh = not h[_DIM]
            if fresh:
                h[_DIM], h[_TRACK], h[_NEXT] = dim, track is not None, 1
                h[_x.TTL_MS], h[_x.CLOCK] = _x.ttl_ms(ttl), time.monotonic_ns()
            elif int(h[_x.TTL_MS]) != _x.ttl_ms(ttl):
                theirs = int(h[_x.TTL_MS]) / 1000 or None
                raise ConfigError(
                    f"multi_process_hash_map: ttl_seconds {ttl} differs from the {theirs} of "
                    f"the processes sharing table {name}; give every process the same"
                )
            # a fresh table publishes its first (empty) state
            super().__init__(dim, track, clock=ttl is not None)
            self._fresh = True
            if fresh:
                self._publish()
            else:
                self._sync()
            self._attach()
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)

    # --- header ------------------------------------------------------------------------------

    def _attach(self) -> None:
        live = self._live_users()
        if os.getpid() not in dict(live):  # a new user has read nothing it must forget
            live.append((os.getpid(), int(self.header[_x.LOG_END])))
        if len(live) > _MAX_PIDS:
            raise InvalidInputError(f"shared table {self.name}: more than {_MAX_PIDS} processes")
        self._set_users(live)

    def _live_users(self) -> list[tuple[int, int]]:
        """``(pid, read position in the expiry log)`` of the live users, oldest first."""
        h = self.header
        return [(int(h[_PIDS + i]), int(h[_READ + i])) for i in range(_MAX_PIDS)
                if h[_PIDS + i] and _pid_alive(int(h[_PIDS + i]))]  # fmt: skip

    def _set_users(self, users: list[tuple[int, int]]) -> None:
        h = self.header
        h[_PIDS:] = 0
        for i, (pid, pos) in enumerate(users):
            h[_PIDS + i], h[_READ + i] = pid, pos

    def users(self) -> list[int]:
        """The live processes using the table, the one that has used it longest first."""
        return [pid for pid, _ in self._live_users()]

    @contextlib.contextmanager
    def _writing(self):
        fcntl.flock(self._fd, fcntl.LOCK_EX)  # releases the GIL while it waits
        try:
            self._sync()
            yield
            self._publish()
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _data_path(self, epoch: int) -> Path:
        return self.folder / f"{self.name}.{epoch}"

    def _sync(self) -> None:
        """Map the published generation if another process published a newer one."""
        h = self.header
        for _ in range(100):
            epoch = int(h[_EPOCH])
            if epoch == self._epoch:
                break
            cap, seed = int(h[_CAP]), int(h[_SEED])
            if int(h[_EPOCH]) != epoch:
                continue  # published again meanwhile
            try:
                st = _SharedState(self._data_path(epoch), cap, self.dim, bool(h[_TRACK]), seed,
                                  create=False)  # fmt: skip
            except FileNotFoundError:
                continue  # replaced (and removed) since the header was read: read it again
            st.epoch = epoch
            self._state, self._epoch = st, epoch
        st = self._state
        st.live, st.used = int(h[_LIVE]), int(h[_USED])

    def _publish(self) -> None:
        """Make this process's current generation the one every process reads, and remove
        the older generations' files (processes still mapping one keep its pages until they
        map the new one)."""
        h, st = self.header, self._state
        h[_CAP], h[_SEED], h[_LIVE], h[_USED] = st.cap, st.seed, st.live, st.used
        h[_EPOCH] = st.epoch  # last: readers see the new generation whole
        self._epoch = st.epoch
        for path in self.folder.glob(f"{glob_escape(self.name)}.*"):
            suffix = path.name[len(self.name) + 1 :]
            if suffix.isdigit() and int(suffix) < st.epoch:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()

    def _new_state(self, cap: int) -> _State:
        if not self._fresh:  # attaching: the published state is mapped instead
            return _State(cap, self.dim, False, 0)
        h = self.header
        epoch = int(h[_NEXT])
        h[_NEXT] = epoch + 1
        seed = (epoch * GOLDEN + 2**63) % 2**64 - 2**63
        st = _SharedState(self._data_path(epoch), cap, self.dim, self.track is not None, seed,
                          create=True, check_space=self._check_space)  # fmt: skip
        st.epoch = epoch
        return st

    # --- reads ---------------------------------------------------------------------------------

    def __len__(self) -> int:
        return int(self.header[_LIVE])

    def lookup_into(self, keys, pos, out, found, refresh: bool = True, layout: int = 0) -> int:
        if int(self.header[_EPOCH]) != self._epoch:
            with self._lock:
                if int(self.header[_EPOCH]) != self._epoch:
                    self._sync()
        return super().lookup_into(keys, pos, out, found, refresh, layout)

    def keys(self) -> np.ndarray:
        with self._lock:
            self._sync()
            return super().keys()

    # --- writes --------------------------------------------------------------------------------

    def insert(self, keys, embeddings) -> int:
        with self._writing():
            return super().insert(keys, embeddings)

    def load(self, keys, embeddings) -> None:
        with self._writing():
            super().load(keys, embeddings)

    def remove(self, keys) -> int:
        with self._writing():
            return super().remove(keys)

    def evict_to(self, target, policy, rng) -> int:
        with self._writing():
            return super().evict_to(target, policy, rng)

    def clear(self) -> None:
        with self._writing():
            super().clear()

    # --- expiry (see shm_expiry) ----------------------------------------------------------------

    def expire(self, seconds: float) -> np.ndarray:
        """The keys this process has to forget: the rows expired since its last call, by
        whichever process swept.  Sweeps (removes the rows unused for ``seconds``, counted
        in :attr:`removed`) when this process is the table's oldest live user."""
        with self._writing():
            users = self._live_users()
            me = os.getpid()
            self.removed = 0
            if users and users[0][0] == me:
                gone = super().expire(seconds)
                self.removed = int(gone.size)
                _x.append(self._log_path(), self.header, min(pos for _, pos in users), gone)
            pos = dict(users).get(me, int(self.header[_x.LOG_END]))
            keys = _x.read(self._log_path(), self.header, pos)
            self._set_users([(pid, int(self.header[_x.LOG_END]) if pid == me else p)
                             for pid, p in users])  # fmt: skip
            return keys

    def _log_path(self) -> Path:
        return self.folder / f"{self.name}.xlog"

    def _now(self) -> int:
        # The host's clock from the start recorded in the header: the same in every process.
        ns = time.monotonic_ns() - int(self.header[_x.CLOCK])
        return ns * CLOCK_TICKS_PER_S // 10**9 + 2

    def _advance(self) -> int:
        if not self.clocked:
            return super()._advance()
        self._tick = self._now()  # every process stamps times, not its own count
        return self._tick

    def _rebase(self) -> None:
        if not self.clocked:
            return super()._rebase()
        half = _TICK_REBASE // 2
        with self._writing():  # the stamps and the clock's start move together, for all
            if self._now() < _TICK_REBASE:
                return  # another process rebased
            s = self._state.stats
            np.subtract(s, half, out=s)
            np.maximum(s, 0, out=s)
            self.header[_x.CLOCK] += half * 10**9 // CLOCK_TICKS_PER_S

    def mark_loaded(self, fingerprint: int) -> None:
        """Record that the table holds the rows of ``fingerprint`` (see :meth:`loaded`)."""
        self.header[_COMPLETE] = fingerprint

    def loaded(self, fingerprint: int) -> bool:
        """Whether some process loaded the rows of ``fingerprint`` into the table whole."""
        return int(self.header[_COMPLETE]) == fingerprint

    # --- life ----------------------------------------------------------------------------------

    def detach(self, remove: bool) -> None:
        """Stop using the table; the last process to do so removes its files (``remove``)."""
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            live = [(p, pos) for p, pos in self._live_users() if p != os.getpid()]
            self._set_users(live)
            if remove and not live:
                for path in self.folder.glob(f"{glob_escape(self.name)}.*"):
                    with contextlib.suppress(FileNotFoundError):
                        path.unlink()
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = -1


#: The slot layout of the files (see hash_kernels), part of every fingerprint: a process
#: built with another layout never attaches to this one's copy of a table, nor the reverse.
SLOT_LAYOUT = b"int64 index in 8-slot buckets, rows of dim float32; header with expiry log"


def fingerprint(keys: np.ndarray, embeddings: np.ndarray) -> int:
    """A 63-bit digest of a table's rows (their count, shape, sums and a sample) and of the
    slot layout."""
    n = keys.shape[0]
    step = max(1, n // 4096)
    digest = hashlib.blake2b(digest_size=8)
    digest.update(SLOT_LAYOUT)
    digest.update(np.asarray([n, embeddings.shape[-1] if n else 0], np.int64).tobytes())
    if n:
        digest.update(np.ascontiguousarray(keys[::step]).tobytes())
        digest.update(np.ascontiguousarray(embeddings[::step]).tobytes())
        digest.update(np.asarray([keys.sum(dtype=np.int64)], np.int64).tobytes())
        # the rows' bits, not their values: compact rows' words read as floats hold NaNs
        bits = np.ascontiguousarray(embeddings, dtype=np.float32).view(np.uint32)
        digest.update(np.asarray([bits.sum(dtype=np.uint64)], np.uint64).tobytes())
    return int.from_bytes(digest.digest(), "little") >> 1 or 1


class SharedHashMapTier(HashMapTier):
    """``multi_process_hash_map``: see the module docstring."""

    configs = (MultiProcessHashMapConfig,)
    # every process of the host reads and writes the same tables: one process per host
    # applies each Kafka update (consumer group hps.<level>.<host>), the others' caches hear
    shared = "host"

    def __init__(self, config: MultiProcessHashMapConfig) -> None:
        super().__init__(config)
        self.folder = SHM_ROOT / config.shared_memory_name
        if not SHM_ROOT.is_dir():
            raise ConfigError(f"multi_process_hash_map needs {SHM_ROOT}, which does not exist")
        self.folder.mkdir(mode=0o700, exist_ok=True)
        self.limit = int(config.shared_memory_size)
        self.auto_remove = bool(config.auto_remove)
        self._names: dict[str, str] = {}  # storage name -> file name prefix in use here

    def _check_space(self, size: int) -> None:
        used = 0
        for path in self.folder.iterdir():  # files come and go as other threads rebuild
            with contextlib.suppress(FileNotFoundError):
                used += path.stat().st_size
        if used + size > self.limit:
            raise ConfigError(
                f"multi_process_hash_map: a table needs {size / 2**20:,.1f} MiB more; its tables "
                f"already take {used / 2**20:,.1f} MiB of shared_memory_size "
                f"{self.limit / 2**20:,.1f} MiB (raise shared_memory_size in ps.json)"
            )
        free = os.statvfs(self.folder)
        free_bytes = free.f_bavail * free.f_frsize
        if size > free_bytes:
            raise ConfigError(
                f"multi_process_hash_map: a table needs {size / 2**20:,.1f} MiB of shared memory "
                f"but {SHM_ROOT} has {free_bytes / 2**20:,.1f} MiB free (in a container, raise "
                "its shm size: docker-compose's shm_size)"
            )

    def _open(self, tag: str, dim: int, prefix: str) -> list[HashTable]:
        track = self.policy.track if self.overflow_margin < UNBOUNDED else None
        ttl = self._ttl.get(tag)
        return [
            SharedHashTable(self.folder, f"{prefix}.p{i}", dim, track, self._check_space, ttl)
            for i in range(self.num_partitions)
        ]

    def set_ttl(self, tag: str, seconds: float | None) -> None:
        """:meth:`Tier.set_ttl` (before the table's rows load): its tables keep access times
        on the host's clock; one process sweeps for all (:mod:`tierserve.ps.shm_expiry`)."""
        if seconds is None:
            return
        check_ttl_policy(self.policy, self.kind)
        parts = self._parts(tag)
        with self._lock:
            if any(len(p) for p in parts):
                raise ConfigError(f"ttl_seconds must be set on {tag} before its rows load")
            self._ttl[tag] = float(seconds)
            if not parts[0].clocked:  # reopen this process's own (empty) copy, clocked
                for p in parts:
                    p.detach(True)
                self._tables[tag] = self._open(tag, parts[0].dim, self._names[tag])

    def expire(self, tag: str, keep=None) -> np.ndarray:
        """:meth:`Tier.expire`: the keys every process must forget (its caches are told);
        ``stats.expired`` counts the rows this process removed."""
        seconds = self._ttl.get(tag)
        parts = self._tables.get(tag)
        if seconds is None or parts is None:
            return np.empty(0, dtype=np.int64)
        gone = np.concatenate([p.expire(seconds) for p in parts])
        self.stats.expired += sum(p.removed for p in parts)
        return gone

    def create_table(self, tag: str, dim: int) -> None:
        with self._lock:
            parts = self._tables.get(tag)
            if parts is not None:
                if parts[0].dim != dim:
                    raise InvalidInputError(
                        f"table {tag} exists with dim {parts[0].dim}, not {dim}"
                    )
                return
            # this process's own copy until rows are loaded (load_table names the shared one)
            prefix = f"{quote(tag, safe='')}#new-{os.getpid()}-{id(self)}"
            self._tables[tag] = self._open(tag, dim, prefix)
            self._names[tag] = prefix

    def load_table(self, tag: str, keys, embeddings, chunk: int = 0) -> None:
        """Fill ``tag`` with a version's rows, or attach to the copy another process of the
        host loaded with the same rows."""
        dim = self._require_dim(tag)
        keys = np.asarray(keys)
        embeddings = np.asarray(embeddings, dtype=np.float32).reshape(-1, dim)
        fp = fingerprint(keys, embeddings)
        prefix = f"{quote(tag, safe='')}#{fp:016x}"
        # one process loads; the others wait on the load lock, then attach
        lock = os.open(self.folder / f"{prefix}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            parts = self._open(tag, dim, prefix)
            first = parts[0]
            if not first.loaded(fp):
                super_parts, self._tables[tag] = self._tables.get(tag), parts
                try:
                    HashMapTier.load_table(self, tag, keys, embeddings)
                finally:
                    self._tables[tag] = super_parts
                first.mark_loaded(fp)
        finally:
            os.close(lock)  # unlocks
        with self._lock:
            old, self._tables[tag] = self._tables.get(tag), parts
            self._names[tag] = prefix
        for p in old or ():
            p.detach(self.auto_remove)

    def drop_table(self, tag: str) -> None:
        with self._lock:
            parts = self._tables.pop(tag, None)
            prefix = self._names.pop(tag, None)
            self._ttl.pop(tag, None)
        for p in parts or ():
            p.detach(self.auto_remove)
        if (
            prefix is not None
            and self.auto_remove
            and not any(self.folder.glob(f"{glob_escape(prefix)}.p*"))
        ):
            with contextlib.suppress(FileNotFoundError):
                (self.folder / f"{prefix}.lock").unlink()

    def close(self) -> None:
        for tag in list(self._tables):
            self.drop_table(tag)
        super().close()
        if self.auto_remove:
            with contextlib.suppress(OSError):  # not empty: other processes' tables
                self.folder.rmdir()
