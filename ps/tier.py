"""The one small interface every storage tier implements.

A tier stores embedding tables addressed by a *table tag* (``hps_et.<model>.<table>``, or a
versioned storage name derived from it by the hierarchy).  Keys are int64; embeddings are
float32 ``[n, dim]``.  The hierarchy composes tiers through this interface only; :mod:`tierserve.ps.tier_registry`
builds them from their ``ps.json`` configs (each tier's config model lives beside it and is
listed in :attr:`Tier.configs`).
"""

from __future__ import annotations

import abc
from typing import ClassVar

import numpy as np

from tierserve.core.errors import ConfigError, InvalidInputError, NotFoundError

from .partition import as_keys
from .stats import TierStats


class Tier(abc.ABC):
    """A store of embedding tables.

    ``lookup`` never raises for unknown keys: it reports them in the ``found`` mask.  Tiers
    that talk to a network raise :class:`~tierserve.core.errors.BackendUnavailableError` for
    connection faults on writes; on lookups they may instead report the unreachable keys as
    not found and count an error (the hierarchy then falls through to the next tier).
    """

    #: The config models this tier is built from (``Tier(config)``), one per ``ps.json`` type.
    configs: ClassVar[tuple[type, ...]] = ()
    #: The ``ps.json`` type name of this tier.
    kind: str = ""
    #: Whether writes are refused (:class:`~tierserve.core.errors.ReadOnlyError`); a read-only
    #: tier takes no online updates.
    read_only: bool = False
    #: Whether every replica of a server sees the same data (HugeCTR's ``is_shared``): then
    #: one replica applies each online update for all, and the others only learn of it.
    #: An unshared tier lives in this process or on this machine; each replica updates its own.
    #: ``"host"``: shared by the processes of one host (multi_process_hash_map): one process
    #: per host applies each update.
    shared: bool | str = False

    def __init__(self) -> None:
        self.stats = TierStats(self.kind)
        self._meta: dict[str, str] = {}  # get_meta / set_meta of a tier that keeps it in memory

    # --- tables ----------------------------------------------------------------------------

    @abc.abstractmethod
    def create_table(self, tag: str, dim: int) -> None:
        """Make table ``tag`` with vectors of ``dim`` floats (no-op if it exists with that dim)."""

    @abc.abstractmethod
    def dim(self, tag: str) -> int | None:
        """The vector length of table ``tag``, or None when this tier does not know it."""

    @abc.abstractmethod
    def tables(self) -> list[str]:
        """The tags of the tables this tier holds."""

    @abc.abstractmethod
    def drop_table(self, tag: str) -> None:
        """Delete table ``tag`` and free what it holds (no-op if absent)."""

    # --- data ------------------------------------------------------------------------------

    @abc.abstractmethod
    def lookup(self, tag: str, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(embeddings float32 [n, dim], found bool [n])``; rows not found are unspecified."""

    def lookup_decoded(self, tag: str, keys: np.ndarray, codec) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`lookup` of a table of compact rows, decoded by ``codec``
        (:class:`~tierserve.ps.row_codec.RowCodec`): ``(float32 [n, codec.dim], found)``.
        Tiers whose kernels can decode as they copy override it."""
        rows, found = self.lookup(tag, keys)
        return codec.decode(rows), found

    @abc.abstractmethod
    def insert(self, tag: str, keys: np.ndarray, embeddings: np.ndarray) -> None:
        """Insert or overwrite ``keys``; may evict others when a partition overflows."""

    @abc.abstractmethod
    def evict(self, tag: str, keys: np.ndarray) -> int:
        """Remove ``keys``; returns how many were present."""

    @abc.abstractmethod
    def size(self, tag: str) -> int:
        """How many keys table ``tag`` holds (0 when absent)."""

    @abc.abstractmethod
    def list_keys(self, tag: str) -> np.ndarray:
        """All keys of table ``tag`` as int64 (order unspecified)."""

    def load_table(
        self, tag: str, keys: np.ndarray, embeddings: np.ndarray, chunk: int = 1 << 18
    ) -> None:
        """Fill a new table in bulk from a sparse model (chunked inserts by default)."""
        for start in range(0, keys.shape[0], chunk):
            self.insert(tag, keys[start : start + chunk], embeddings[start : start + chunk])

    # --- expiry ----------------------------------------------------------------------------

    def set_ttl(self, tag: str, seconds: float | None) -> None:
        """Expire the rows of table ``tag`` not written or looked up for ``seconds`` (None:
        never); :meth:`expire` removes them.  Tiers that cannot refuse a TTL naming it."""
        if seconds is not None:
            raise ConfigError(f"ttl_seconds is not supported by the {self.kind} tier")

    def expire(self, tag: str, keep=None) -> np.ndarray:
        """Remove the rows of ``tag`` whose time-to-live passed; returns their keys (int64;
        counted in ``stats.expired``).  ``keep(keys) -> bool mask``, when given, spares
        those of them it marks (their time restarts: a tier in front still serves them).
        Called off the request path (:mod:`tierserve.ps.expiry`)."""
        return np.empty(0, dtype=np.int64)

    def contains(self, tag: str, keys: np.ndarray) -> np.ndarray:
        """A bool mask of the ``keys`` table ``tag`` holds (a lookup that refreshes no
        access time where the tier can avoid it)."""
        return self.lookup(tag, keys)[1]

    def get_meta(self, name: str) -> str | None:
        """A small string this tier keeps beside its tables (None when unset).

        Shared and persistent tiers store it with the data, so another process (or this one
        after a restart) sees it; the hierarchy records which storage name is live there.
        """
        return self._meta.get(name)

    def set_meta(self, name: str, value: str) -> None:
        """Set :meth:`get_meta`'s ``name``."""
        self._meta[name] = value

    def close(self) -> None:  # noqa: B027 - most tiers have nothing to release
        """Release connections, files and threads."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- helpers for implementations --------------------------------------------------------

    def _require_dim(self, tag: str) -> int:
        dim = self.dim(tag)
        if dim is None:
            raise NotFoundError(f"{self.kind} tier has no table {tag!r}")
        return dim

    @staticmethod
    def _check_insert(
        keys, embeddings, dim: int, tag: str
    ) -> tuple[np.ndarray, np.ndarray]:
        keys = as_keys(keys)
        embeddings = np.asarray(embeddings)
        if embeddings.ndim != 2 or embeddings.shape != (keys.shape[0], dim):
            raise InvalidInputError(
                f"embeddings for {tag} must have shape [{keys.shape[0]}, {dim}], "
                f"got {list(embeddings.shape)}"
            )
        if embeddings.dtype != np.float32 or not embeddings.flags.c_contiguous:
            embeddings = np.ascontiguousarray(embeddings, dtype=np.float32)
        return keys, embeddings
