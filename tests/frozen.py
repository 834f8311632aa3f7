"""Freeze a real service process (SIGSTOP) for a fault test, and always thaw it."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator


@contextlib.contextmanager
def frozen(server) -> Iterator[None]:
    """SIGSTOP ``server`` (a tests/services server with a ``process``) until the block ends.

    A stopped Redis keeps its port open and accepts connections, but answers nothing: every
    call waits for its socket timeout, the fault that connection-refused tests never show.
    """
    pid = server.process.popen.pid
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)
