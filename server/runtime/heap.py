"""The cyclic garbage collector of a serving process.

Once the models are loaded the process holds a few hundred thousand long-lived objects
(FastAPI, pydantic, numpy, grpc, the models).  Python's oldest-generation collection walks
them all: under load it ran every half second for about 45 ms, a pause every request in
flight waited out (the tail) and about a tenth of the server's CPU.  :func:`freeze` moves
what is alive after loading into the permanent generation, which no collection walks, so a
collection only sees the objects of the requests in flight.

A version swap retires a model whose objects may hold reference cycles; frozen, such a cycle
would never be collected.  :class:`Refreezer` unfreezes at once when a version changes (the
retired one becomes collectable) and freezes again a while later, when the new version
serves and the old one is gone.
"""

from __future__ import annotations

import asyncio
import gc

#: Allocations between young-generation collections (CPython's default is 700): each
#: collection has a fixed cost, and a request allocates a few dozen objects.
GEN0_THRESHOLD = 10_000
#: Seconds after a version swap before the heap is frozen again.
REFREEZE_S = 30.0


def freeze() -> None:
    """Collect, then exempt every object alive from later collections (see the module
    docstring); raises the young generation's threshold to :data:`GEN0_THRESHOLD`."""
    gc.collect()
    gc.freeze()
    young, middle, old = gc.get_threshold()
    gc.set_threshold(max(young, GEN0_THRESHOLD), middle, old)


class Refreezer:
    """Unfreezes the heap when a version changes and freezes it again :data:`REFREEZE_S`
    later (one pending freeze at a time), on ``loop``."""

    def __init__(self, loop: asyncio.AbstractEventLoop, delay_s: float = REFREEZE_S) -> None:
        self.loop = loop
        self.delay_s = delay_s
        self._pending: asyncio.TimerHandle | None = None
        self._closed = False

    def version_changed(self) -> None:
        """Call from any thread when a version is committed or retired."""
        gc.unfreeze()
        if not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self._schedule)

    def _schedule(self) -> None:
        if self._closed:
            return
        if self._pending is not None:
            self._pending.cancel()
        self._pending = self.loop.call_later(self.delay_s, self._freeze)

    def _freeze(self) -> None:
        self._pending = None
        freeze()

    def close(self) -> None:
        """Cancel a pending freeze; later swaps schedule none."""
        self._closed = True
        if self._pending is not None:
            self._pending.cancel()
            self._pending = None
