"""Reading a cluster's topology again, in the background, when a call suggests it changed.

A Redis Cluster client routes each key by its slot map.  When a master dies, the cluster
promotes one of its replicas a few seconds later; when slots move, nodes answer ``MOVED``.
Either way the client's map is stale until it is read again, and with a per-node circuit
breaker (:mod:`tierserve.ps.breaker`) the calls that would have noticed are skipped.  A
:class:`TopologyRefresher` is how the tier reads it again without making a request wait:

- every failed or skipped call to a node :meth:`requests <TopologyRefresher.request>` a
  refresh (a flag: no call waits for it);
- a daemon thread runs the refresh as soon as one is requested, then at most once per
  ``interval_s`` while requests keep coming (a node down for minutes costs one refresh per
  interval, not one per request);
- a refresh that fails (no node answered) is logged and tried again at the next request.

So a promoted replica is followed within ``interval_s`` (plus one refresh) of the cluster
announcing it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)


class TopologyRefresher:
    """Runs ``refresh()`` in a background thread when requested, at most once per
    ``interval_s``; ``name`` appears in its thread's name and log lines."""

    def __init__(self, refresh: Callable[[], None], interval_s: float, name: str) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be positive, got {interval_s}")
        self.refresh = refresh
        self.interval_s = float(interval_s)
        self.name = name
        self.refreshes = 0  # refreshes run (successful or not)
        self.failures = 0  # refreshes that raised
        self.last_error: str | None = None
        self._wanted = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._last = -float("inf")  # time.monotonic() of the last refresh's start

    def request(self) -> None:
        """Ask for a refresh (returns at once); the first request starts the thread."""
        if self._stop.is_set():
            return
        self._wanted.set()
        if self._thread is None:
            with self._lock:
                if self._thread is None and not self._stop.is_set():
                    self._thread = threading.Thread(
                        target=self._run, name=f"tierserve-topology-{self.name}", daemon=True
                    )
                    self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wanted.wait()
            if self._stop.is_set():
                return
            # Requests that arrive until the interval has passed are served by this refresh.
            if self._stop.wait(max(0.0, self._last + self.interval_s - time.monotonic())):
                return
            self._wanted.clear()
            self._last = time.monotonic()
            self.refreshes += 1
            try:
                self.refresh()
            except Exception as exc:  # the thread must outlive any one failure
                self.failures += 1
                self.last_error = f"{type(exc).__name__}: {exc}"[:500]
                log.warning("%s: reading the cluster topology failed (tried again on the next "
                            "failed call): %s", self.name, exc)  # fmt: skip

    def close(self, timeout: float = 5.0) -> None:
        """Stop the thread (waits at most ``timeout`` s for a refresh in progress)."""
        self._stop.set()
        self._wanted.set()
        with self._lock:
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
