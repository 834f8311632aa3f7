"""The versions the hierarchical parameter server holds: :class:`TableSpec` (one served
table: names, storage name, dim, default, row layout, TTL), :class:`ServedModel` (one loaded
version of a model, with the count of lookups using it)."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from tierserve.core.errors import NotFoundError

from .config import ModelConfig
from .row_codec import RowCodec


@dataclass(frozen=True)
class TableSpec:
    """One served table: its names, where it is stored, its vector length and default."""

    name: str
    tag: str
    storage: str
    dim: int
    default: float
    #: How the table's rows are stored (float32 unless ``storage_dtype`` says otherwise).
    codec: RowCodec = None
    #: Seconds a row lives after its last write or lookup (``ttl_seconds``; None: forever).
    ttl: float | None = None

    def __post_init__(self) -> None:
        if self.codec is None:
            object.__setattr__(self, "codec", RowCodec("float32", self.dim))


class ServedModel:
    """One loaded version of a model; lookups hold a reference while they run."""

    def __init__(
        self,
        config: ModelConfig,
        generation: int,
        tables: dict[str, TableSpec],
        attached: bool = False,
    ):
        self.config = config
        self.name = config.model
        self.generation = generation
        self.tables = tables
        self.attached = attached  # its tables are another process's (shared tier), not loaded
        self.dropped = False
        self._cond = threading.Condition()
        self._refs = 0
        self._retired = False

    def table(self, name: str) -> TableSpec:
        spec = self.tables.get(name)
        if spec is None:
            raise NotFoundError(
                f"model {self.name!r} has no table {name!r}; it has {list(self.tables)}"
            )
        return spec

    def acquire(self) -> bool:
        with self._cond:
            if self._retired:
                return False
            self._refs += 1
            return True

    def release(self) -> None:
        with self._cond:
            self._refs -= 1
            if self._refs == 0:
                self._cond.notify_all()

    def retire(self, timeout: float) -> bool:
        """Refuse new lookups and wait until running ones finish; False on timeout."""
        with self._cond:
            self._retired = True
            return self._cond.wait_for(lambda: self._refs == 0, timeout)
