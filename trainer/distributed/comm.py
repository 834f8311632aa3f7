"""The communicator the distributed trainer uses: mpi4py's ``COMM_WORLD``, or one process.

:func:`world` returns :class:`MpiComm` when the process was started by ``mpiexec`` / ``mpirun``
with more than one rank (read from the launcher's environment, so a plain ``python train.py``
never imports mpi4py), else :class:`LocalComm`, whose collectives are identities.  Both offer
the few collectives the trainer needs on numpy arrays: ``allreduce_sum``, ``alltoallv``,
``allgatherv`` and ``barrier``.

No collective waits forever.  Each is started non-blocking and polled; while waiting, the
ranks on this host are checked to be alive (a rank killed on this host is named within a
second), and a collective that has not finished after ``TIERSERVE_COLLECTIVE_TIMEOUT_S``
seconds (default 600: a rank may legitimately be writing a large model meanwhile) raises
:class:`RankLostError`.  Launchers (MPICH's hydra, Open MPI's mpirun) kill the remaining
ranks as soon as one dies, so each rank also leaves a small watcher process behind it that
reports, on the job's stderr, a rank that ended without finishing (killed, crashed) by its
number, pid and host.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np

from tierserve.core.errors import ConfigError, TierserveError

#: Environment variables in which launchers give the world size and this process's rank
#: (MPICH/hydra, Open MPI, PMIx, Slurm's PMI2).
_SIZE_VARS = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE")
_RANK_VARS = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")
TIMEOUT_VAR = "TIERSERVE_COLLECTIVE_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 600.0
_LIVENESS_PERIOD_S = 0.5
#: how long a wait polls the collective back to back (yielding the core) before it sleeps
_YIELD_S = 0.05
#: how long a rank that failed waits, after printing why, before it aborts the job
_ABORT_GRACE_S = 0.5


class RankLostError(TierserveError):
    """A rank of the job died or stopped answering: the collective cannot complete."""



def _launcher_value(names: tuple[str, ...], default: int) -> int:
    """The first of the launcher's environment variables ``names`` that holds a number."""
    for var in names:
        value = os.environ.get(var)
        if value and value.isdigit():
            return int(value)
    return default


def launched_size() -> int:
    """The number of ranks the MPI launcher started (1 when not started by one)."""
    return _launcher_value(_SIZE_VARS, 1)


def launched_rank() -> int:
    """This process's rank in the MPI job (0 when not started by a launcher)."""
    return _launcher_value(_RANK_VARS, 0)


class LocalComm:
    """One process: every collective returns its input."""

    rank = 0
    size = 1
    host = socket.gethostname()
    bytes_sent = 0

    def allreduce_sum(self, buf: np.ndarray, what: str = "allreduce") -> np.ndarray:
        return buf

    def alltoallv(self, send: np.ndarray, counts: np.ndarray, what: str = "alltoallv",
                  row_shape: tuple[int, ...] = ()) -> tuple[np.ndarray, np.ndarray]:
        return send, np.asarray(counts, dtype=np.int64).copy()

    def alltoallv_known(self, send: np.ndarray, counts: np.ndarray, recv_counts: np.ndarray,
                        what: str, row_shape: tuple[int, ...] = ()) -> np.ndarray:
        return send

    def allgatherv(self, send: np.ndarray, what: str = "allgatherv") -> tuple[np.ndarray,
                                                                               np.ndarray]:
        return send, np.asarray([len(send)], dtype=np.int64)

    def barrier(self, what: str = "barrier") -> None:
        pass

    def finish(self) -> None:
        pass


class MpiComm:
    """``MPI.COMM_WORLD`` with timed, liveness-checked collectives on numpy arrays."""

    def __init__(self) -> None:
        try:
            from mpi4py import MPI
        except ImportError:
            raise ConfigError(
                f"this process was started by an MPI launcher with {launched_size()} ranks but "
                "mpi4py is not installed: pip install 'tierserve[mpi]'") from None
        self.MPI = MPI
        self.comm = MPI.COMM_WORLD
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        self.host = socket.gethostname()
        self.timeout_s = _timeout()
        peers = self.comm.allgather((self.host, os.getpid()))
        self.peers = peers
        self._local_peers = [(r, pid) for r, (h, pid) in enumerate(peers)
                             if h == self.host and r != self.rank]
        self._watcher = _start_watcher(self.rank, self.size, self.host)
        #: bytes this rank handed to MPI for other ranks (benchmarks read it)
        self.bytes_sent = 0

    # -- waiting -------------------------------------------------------------------------

    def _wait(self, request: Any, what: str) -> None:
        start = time.monotonic()
        next_check = start + _LIVENESS_PERIOD_S
        yield_until = start + _YIELD_S
        while not request.Test():
            # MPI progresses a non-blocking collective only inside Test: keep calling it, but
            # hand the core to any other runnable process (more ranks than cores) meanwhile;
            # a long wait (a rank writing a model) sleeps between tests instead
            now = time.monotonic()
            if now < yield_until:
                os.sched_yield()
            else:
                time.sleep(0.001)
            if now >= next_check:
                next_check = now + _LIVENESS_PERIOD_S
                dead = [r for r, pid in self._local_peers if not _alive(pid)]
                if dead:
                    raise RankLostError(
                        f"rank {dead[0]} (pid {self.peers[dead[0]][1]} on {self.host}) is gone: "
                        f"rank {self.rank} cannot finish {what}; the job stops (resume from "
                        "the last snapshot, with any number of ranks)")
                if now - start > self.timeout_s:
                    raise RankLostError(
                        f"rank {self.rank}: {what} did not complete within {self.timeout_s:g} s "
                        f"({TIMEOUT_VAR}); a rank on another host died or hangs")

    # -- collectives ---------------------------------------------------------------------

    def allreduce_sum(self, buf: np.ndarray, what: str = "allreduce") -> np.ndarray:
        """The elementwise sum of ``buf`` over all ranks (in place; ``buf`` is returned)."""
        buf = np.ascontiguousarray(buf)
        # counted as the bandwidth-optimal algorithm sends (reduce-scatter + allgather, what
        # MPICH runs for large buffers); the all-to-all counts below are exact
        self.bytes_sent += buf.nbytes * 2 * (self.size - 1) // self.size
        self._wait(self.comm.Iallreduce(self.MPI.IN_PLACE, buf, op=self.MPI.SUM), what)
        return buf

    def alltoallv(self, send: np.ndarray, counts: np.ndarray, what: str = "alltoallv",
                  row_shape: tuple[int, ...] = ()) -> tuple[np.ndarray, np.ndarray]:
        """Send rows ``send[displ[r]:displ[r] + counts[r]]`` to rank ``r``; returns the rows
        received (in rank order) and how many came from each rank.  ``row_shape`` is the
        shape of one row (the counts are in rows)."""
        counts = np.asarray(counts, dtype=np.int64)
        recv_counts = np.empty(self.size, dtype=np.int64)
        self._wait(self.comm.Ialltoall(counts, recv_counts), what + " (counts)")
        return self.alltoallv_known(send, counts, recv_counts, what, row_shape), recv_counts

    def alltoallv_known(self, send: np.ndarray, counts: np.ndarray, recv_counts: np.ndarray,
                        what: str, row_shape: tuple[int, ...] = ()) -> np.ndarray:
        """:meth:`alltoallv` when each rank already knows what it will receive."""
        per_row = int(np.prod(row_shape)) if row_shape else 1
        send = np.ascontiguousarray(send)
        recv = np.empty((int(recv_counts.sum()), *row_shape), dtype=send.dtype)
        sc = (np.asarray(counts, dtype=np.int64) * per_row)
        rc = (np.asarray(recv_counts, dtype=np.int64) * per_row)
        sd = np.concatenate(([0], np.cumsum(sc)[:-1]))
        rd = np.concatenate(([0], np.cumsum(rc)[:-1]))
        mpi_type = self.MPI._typedict[send.dtype.char]
        self.bytes_sent += int(sc.sum() - sc[self.rank]) * send.dtype.itemsize
        self._wait(self.comm.Ialltoallv([send, (sc, sd), mpi_type],
                                        [recv, (rc, rd), mpi_type]), what)
        return recv

    def allgatherv(self, send: np.ndarray, what: str = "allgatherv") -> tuple[np.ndarray,
                                                                               np.ndarray]:
        """Every rank's rows of ``send`` concatenated in rank order, and the rows per rank."""
        send = np.ascontiguousarray(send)
        n = np.asarray([len(send)], dtype=np.int64)
        counts = np.empty(self.size, dtype=np.int64)
        self._wait(self.comm.Iallgather(n, counts), what + " (counts)")
        row_shape = send.shape[1:]
        per_row = int(np.prod(row_shape)) if row_shape else 1
        recv = np.empty((int(counts.sum()), *row_shape), dtype=send.dtype)
        rc = counts * per_row
        rd = np.concatenate(([0], np.cumsum(rc)[:-1]))
        mpi_type = self.MPI._typedict[send.dtype.char]
        self._wait(self.comm.Iallgatherv([send, mpi_type], [recv, (rc, rd), mpi_type]), what)
        return recv, counts

    def barrier(self, what: str = "barrier") -> None:
        self._wait(self.comm.Ibarrier(), what)

    def finish(self) -> None:
        """Tell this rank's watcher that the rank ended normally."""
        if self._watcher is not None:
            try:
                self._watcher.stdin.write(b"done\n")
                self._watcher.stdin.close()
            except OSError:
                pass
            self._watcher = None


def _timeout() -> float:
    raw = os.environ.get(TIMEOUT_VAR)
    if raw is None:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{TIMEOUT_VAR} must be a number of seconds, got {raw!r}") from None
    if value <= 0:
        raise ConfigError(f"{TIMEOUT_VAR} must be positive, got {raw!r}")
    return value


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, killed but not yet reaped by the launcher, is not)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
        return state not in (b"Z", b"X")
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


# The watcher: reads its stdin (a pipe from the rank) until EOF.  "done" means the rank
# finished; EOF without it means the rank ended abnormally.  The first watcher of this host's
# job to notice claims a marker file (named after the launcher's process, which the ranks of
# one host share) and names its rank as the one that died; the ranks the launcher stops after
# it say so and name that rank.
_WATCHER = r"""
import os, sys, time
rank, size, pid, host, marker = sys.argv[1:6]
data = sys.stdin.buffer.read()
if b"done" not in data:
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        time.sleep(0.05)
        try:
            with open(marker) as f:
                first = f.read().strip() or "?"
        except OSError:
            first = "?"
        sys.stderr.write("[tierserve] rank %s of %s (pid %s on %s) was stopped by the launcher "
                         "after rank %s died\n" % (rank, size, pid, host, first))
    else:
        os.write(fd, rank.encode())
        os.close(fd)
        sys.stderr.write("[tierserve] rank %s of %s (pid %s on %s) died before finishing "
                         "(killed or crashed); the launcher stops the other ranks. Resume "
                         "from the last snapshot with any number of ranks.\n"
                         % (rank, size, pid, host))
        sys.stderr.flush()
        os.close(2)  # the launcher waits for the job's stderr to close
        time.sleep(10)
        try:
            os.unlink(marker)
        except OSError:
            pass
"""


def _start_watcher(rank: int, size: int, host: str) -> subprocess.Popen | None:
    marker = os.path.join(tempfile.gettempdir(), f"tierserve-rank-lost-{os.getppid()}")
    try:
        return subprocess.Popen(
            [sys.executable, "-S", "-c", _WATCHER, str(rank), str(size), str(os.getpid()), host,
             marker],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, start_new_session=True,
            close_fds=True)
    except OSError:
        return None


_WORLD: LocalComm | MpiComm | None = None


def world() -> LocalComm | MpiComm:
    """This process's communicator (created once): MPI when launched with several ranks."""
    global _WORLD
    if _WORLD is None:
        _WORLD = MpiComm() if launched_size() > 1 else LocalComm()
        if isinstance(_WORLD, MpiComm):
            _install_abort_on_error(_WORLD)
    return _WORLD


def _install_abort_on_error(comm: MpiComm) -> None:
    """An uncaught exception on one rank aborts the job (MPI_Finalize would wait for the others
    forever); a normal exit tells the watcher the rank finished."""
    import atexit

    previous = sys.excepthook

    def hook(kind, value, tb):
        previous(kind, value, tb)
        sys.stderr.flush()
        comm.finish()
        # the launcher forwards a rank's stderr from a pipe it stops reading once a rank
        # aborts: give it a moment to pass the traceback on (on a loaded machine the job once
        # ended with none of its ranks' messages)
        time.sleep(_ABORT_GRACE_S)
        comm.comm.Abort(1)

    sys.excepthook = hook
    atexit.register(comm.finish)
