"""What the cache needs from a parameter server, as structural types.

The cache is coded against :class:`ParameterServerLike` so that it works with
``tierserve.ps.hierarchy.HierarchicalParameterServer`` and with any other object that has
the same two methods (a test double, a remote client).  A parameter server that can tell
listeners about updates implements :class:`UpdateNotifier` as well; the cache then registers
itself and drops or overwrites a cached row as soon as its update has been applied.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Optional, Protocol, runtime_checkable

import numpy as np

#: ``listener(model, table, keys, embeddings)``: called after ``keys`` of ``table`` were
#: updated in the parameter server; ``embeddings`` are the new vectors, or ``None`` when the
#: notifier only knows which keys changed; ``keys=None`` means the whole table changed
#: (a new model version).
UpdateListener = Callable[[str, str, np.ndarray, Optional[np.ndarray]], None]


@runtime_checkable
class ParameterServerLike(Protocol):
    """The parameter server interface the cache uses."""

    def lookup(self, model: str, table: str, keys: np.ndarray) -> np.ndarray:
        """float32 ``[len(keys), dim]``: stored vectors, the table's default where unknown."""
        ...

    def insert(self, model: str, table: str, keys: np.ndarray, embeddings: np.ndarray) -> None:
        """Store (overwrite) ``embeddings[i]`` for ``keys[i]``."""
        ...


@runtime_checkable
class UpdateNotifier(Protocol):
    """A parameter server that calls listeners after it has applied an update.

    ``add_update_listener(fn)`` registers ``fn(model, table, keys, embeddings)``; the
    parameter server calls it after every ``insert`` (API call or Kafka message) has reached
    the tiers that ``lookup`` reads, before the insert returns, and never while holding a lock
    that ``lookup`` needs.  ``remove_update_listener(fn)`` unregisters it.
    """

    def add_update_listener(self, listener: UpdateListener) -> None: ...

    def remove_update_listener(self, listener: UpdateListener) -> None: ...
