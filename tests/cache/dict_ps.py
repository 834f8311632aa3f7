"""A test double of the parameter server: in-process dict of numpy vectors, with listeners.

``DictParameterServer`` follows the contract of
``tierserve.ps.hierarchy.HierarchicalParameterServer`` that the cache relies on: ``lookup``
returns float32 ``[n, dim]`` with the table's default vector for unknown keys and never
raises for them; ``insert`` stores vectors and then calls every registered update listener
before it returns.  It counts lookups so tests can check batching.
"""

from __future__ import annotations

import threading

import numpy as np


class DictParameterServer:
    def __init__(self, tables: dict[tuple[str, str], int], default: float = 0.0) -> None:
        self._dims = dict(tables)
        self._rows: dict[tuple[str, str], dict[int, np.ndarray]] = {t: {} for t in tables}
        self._default = default
        self._lock = threading.Lock()
        self._listeners: list = []
        self.lookups = 0
        self.looked_up_keys = 0

    def lookup(self, model: str, table: str, keys: np.ndarray) -> np.ndarray:
        dim = self._dims[(model, table)]
        rows = self._rows[(model, table)]
        keys = np.asarray(keys, dtype=np.int64)
        out = np.full((keys.size, dim), self._default, dtype=np.float32)
        with self._lock:
            self.lookups += 1
            self.looked_up_keys += keys.size
            for i, k in enumerate(keys.tolist()):
                v = rows.get(k)
                if v is not None:
                    out[i] = v
        return out

    def insert(self, model: str, table: str, keys: np.ndarray, embeddings: np.ndarray) -> None:
        rows = self._rows[(model, table)]
        keys = np.asarray(keys, dtype=np.int64)
        embeddings = np.asarray(embeddings, dtype=np.float32)
        with self._lock:
            for k, v in zip(keys.tolist(), embeddings):
                rows[k] = v.copy()
            listeners = list(self._listeners)
        for listener in listeners:  # after the write, outside the lock, before returning
            listener(model, table, keys, embeddings)

    def add_update_listener(self, listener) -> None:
        with self._lock:
            self._listeners.append(listener)

    def remove_update_listener(self, listener) -> None:
        with self._lock:
            self._listeners.remove(listener)

    def fill(self, model: str, table: str, keys: np.ndarray, seed: int = 0) -> np.ndarray:
        """Store random vectors for ``keys`` without notifying anyone (initial load)."""
        dim = self._dims[(model, table)]
        vectors = np.random.default_rng(seed).standard_normal((len(keys), dim)).astype(np.float32)
        rows = self._rows[(model, table)]
        with self._lock:
            for k, v in zip(np.asarray(keys).tolist(), vectors):
                rows[k] = v
        return vectors
