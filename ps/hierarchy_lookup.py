"""The lookup path of :class:`~tierserve.ps.hierarchy.HierarchicalParameterServer`: the
volatile tier, then the persistent tier for what it missed (copied up with
``cache_missed_embeddings``), then the table's default vector; rows decoded from their
stored layout; a tier that cannot be reached counts as a miss."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np

from tierserve.core.errors import (
    BackendSkippedError,
    BackendUnavailableError,
    InvalidInputError,
    NotReadyError,
)

from .config import PSConfig
from .keys import as_keys
from .row_codec import RowCodec
from .served_model import ServedModel, TableSpec
from .tier import Tier

log = logging.getLogger("tierserve.ps.hierarchy")


class LookupPath:
    """Lookups by model name (the committed version) or by :class:`ServedModel` (a part of
    :class:`~tierserve.ps.hierarchy.HierarchicalParameterServer`, which sets the state
    below)."""

    config: PSConfig
    volatile: Tier | None
    persistent: Tier | None
    _cache_missed: bool

    def _acquire(self, model: str | ServedModel) -> ServedModel:
        if isinstance(model, ServedModel):
            if model.acquire():
                return model
            raise NotReadyError(
                f"model {model.name!r} generation {model.generation} has been retired"
            )
        for _ in range(1000):
            m = self.model(model)
            if m.acquire():
                return m
        raise NotReadyError(f"model {model!r} is being replaced")  # pragma: no cover

    def _keys(self, keys) -> np.ndarray:
        """int64 keys by :mod:`tierserve.ps.keys`' rule: 32-bit keys when supportlonglong is
        false (int32 / uint32 arrays, or int64 values in 0 .. 2**32-1)."""
        return as_keys(keys, 64 if self.config.supportlonglong else 32)

    def lookup(self, model: str | ServedModel, table: str, keys) -> np.ndarray:
        """The embeddings ``float32 [n, dim]`` of ``keys`` in ``model``'s ``table``.

        ``model`` is a name (the committed version) or a :class:`ServedModel` (that version).
        """
        m = self._acquire(model)
        try:
            return self._lookup(m.table(table), self._keys(keys))
        finally:
            m.release()

    def lookup_tables(self, model: str | ServedModel, keys_per_table: Sequence) -> list[np.ndarray]:
        """Look up one key array per table (in ``embedding_table_names`` order), one version."""
        m = self._acquire(model)
        try:
            specs = list(m.tables.values())
            if len(keys_per_table) != len(specs):
                raise InvalidInputError(
                    f"model {m.name!r} has {len(specs)} tables, got {len(keys_per_table)} key arrays"
                )
            return [self._lookup(s, self._keys(k)) for s, k in zip(specs, keys_per_table)]
        finally:
            m.release()

    def _tier_lookup(self, tier: Tier, storage: str, keys: np.ndarray, width: int,
                     codec: RowCodec | None = None):  # fmt: skip
        """``(rows [n, width], found)`` from one tier: stored rows, or decoded by ``codec``
        (then ``width`` is its dim); a tier that cannot be reached finds nothing."""
        try:
            if codec is not None and not codec.identity:
                return tier.lookup_decoded(storage, keys, codec)
            return tier.lookup(storage, keys)
        except BackendUnavailableError as exc:
            tier.stats.errors += 1
            log.warning("%s tier unavailable for %s, falling through: %s", tier.kind, storage, exc)
            return np.zeros((keys.size, width), np.float32), np.zeros(keys.size, dtype=bool)

    def _lookup(self, spec: TableSpec, keys: np.ndarray) -> np.ndarray:
        """float32 embeddings: the volatile tier's rows (decoded as they are read), then the
        persistent tier's stored rows (decoded; copied up as they are stored), then defaults."""
        n = keys.size
        codec = spec.codec
        if self.volatile is not None:
            out, found = self._tier_lookup(self.volatile, spec.storage, keys, spec.dim, codec)
            if found.all():
                return out
            missing = np.flatnonzero(~found)
        else:
            out = np.empty((n, spec.dim), dtype=np.float32)
            missing = np.arange(n)
        if self.persistent is not None and missing.size:
            mkeys = keys[missing]
            rows, found = self._tier_lookup(self.persistent, spec.storage, mkeys, codec.words)
            if found.any():
                out[missing[found]] = codec.decode(rows[found])
                if self._cache_missed and self.volatile is not None:
                    try:
                        self.volatile.insert(spec.storage, mkeys[found], rows[found])
                    except BackendSkippedError:
                        pass  # the tier is known to be down: the lookup has its answer
                    except BackendUnavailableError as exc:  # the tier counted the failure
                        log.warning("could not cache missed embeddings of %s: %s", spec.tag, exc)
                missing = missing[~found]
        if missing.size:
            out[missing] = spec.default
        return out
