"""Who holds a file lock: for errors that name the other process (RocksDB's ``LOCK`` file).

RocksDB takes a POSIX ``fcntl`` write lock on ``<path>/LOCK`` while a database is open for
writing; a second opener gets only "Resource temporarily unavailable".  Linux lists every
lock in ``/proc/locks`` with the holder's pid and the file's device and inode, which
:func:`lock_holder` matches.  Elsewhere (or when the holder sits in another pid namespace)
it answers None and the caller says less.
"""

from __future__ import annotations

import os
from pathlib import Path


def lock_holder(path: str | os.PathLike, locks_file: str = "/proc/locks") -> int | None:
    """The pid of a process holding a lock on ``path``, or None when it cannot be told."""
    try:
        st = os.stat(path)
        table = Path(locks_file).read_text()
    except OSError:
        return None
    device = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    for line in table.splitlines():
        # "1: POSIX  ADVISORY  WRITE 18121 fe:00:9996113 0 EOF" (blocked waiters: "1: -> ...")
        fields = line.split()
        if len(fields) >= 6 and fields[1] != "->" and fields[5] == device:
            try:
                pid = int(fields[4])
            except ValueError:
                continue
            if pid > 0:
                return pid
    return None


def describe_process(pid: int) -> str:
    """``pid 123 (python -m tierserve ...)``: the pid and, where readable, its command line."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return f"pid {pid}"
    command = " ".join(part.decode(errors="replace") for part in raw.split(b"\0") if part)
    if len(command) > 200:
        command = command[:197] + "..."
    return f"pid {pid} ({command})" if command else f"pid {pid}"
