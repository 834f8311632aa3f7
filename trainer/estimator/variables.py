"""The Estimator's variables, shared by the programs it builds for each mode: dense weights,
non-trainable state, dense optimizer state, embedding tables and the global step.

Variables are created by name the first time a program needs them (TensorFlow's variable
sharing across graphs); a later program asking for a name with another shape is a structure
change (:class:`StructureError`).  :meth:`VariableStore.arrays` / :meth:`load_arrays` move
everything to and from a checkpoint.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from tierserve.core.errors import ConfigError
from tierserve.model.device import to_numpy
from tierserve.ps.sparse_file import SparseTable

from .tables import ColumnTable


class StructureError(ConfigError):
    """A checkpoint (or model_dir) from a model of a different structure."""


@dataclass
class TableInfo:
    """What a table holds: per-slot column names, their key offsets and bucket counts."""

    dim: int
    combiner: str
    columns: list[str]
    offsets: list[int]
    buckets: list[int]
    display: list[str]
    optimizer: str = ""


class VariableStore:
    """Every variable of one Estimator (see the module docstring)."""

    #: Under mpiexec: ``(loss, param_grads, input_grads, n) -> loss`` averaging a step's
    #: gradients over the ranks (:mod:`tierserve.trainer.estimator.distributed`).
    reduce_step: Any = None

    def __init__(self, seed: int = 0) -> None:
        self.seed = int(seed)
        self.dense: dict[str, np.ndarray] = {}
        self.state: dict[str, np.ndarray] = {}
        self.opt: dict[str, dict[str, np.ndarray]] = {}
        self.tables: dict[str, ColumnTable] = {}
        self.table_info: dict[str, TableInfo] = {}
        self.global_step = 0
        self._pending: dict[str, dict[str, np.ndarray]] = {}  # checkpointed, not yet built

    # -- dense ---------------------------------------------------------------------------

    def variable(self, name: str, init: np.ndarray, kind: str = "dense") -> np.ndarray:
        """The array named ``name``, created from ``init`` when absent."""
        pool = self.dense if kind == "dense" else self.state
        have = pool.get(name)
        if have is None:
            have = pool[name] = np.array(init, dtype=np.float32, copy=True)
        elif have.shape != tuple(init.shape):
            raise StructureError(
                f"variable {name!r} has shape {list(have.shape)} in the checkpoint but "
                f"{list(init.shape)} in this model: the model's structure changed")
        return have

    def optimizer_state(self, name: str, optimizer: Any) -> dict[str, np.ndarray]:
        kind = type(optimizer).__name__
        key = f"{kind}:{name}"
        st = self.opt.get(key)
        if st is None:
            st = self.opt[key] = optimizer.init_state(tuple(self.dense[name].shape), np)
        return st

    # -- tables --------------------------------------------------------------------------

    def table(self, name: str, info: TableInfo, params: Any, trains: bool,
              init_scale: float | None, initializer: Any = None, xp: Any = np) -> ColumnTable:
        """The table ``name``, built with optimizer ``params`` (an OptParamsPy); a table a
        training program claims with another optimizer than it was built with is rebuilt
        (vectors kept, optimizer state fresh)."""
        old = self.table_info.get(name)
        if old is not None and (old.dim != info.dim or old.columns != info.columns
                                or old.buckets != info.buckets):
            raise StructureError(
                f"embedding table {name!r} held columns {old.columns} (dimension {old.dim}, "
                f"buckets {old.buckets}); this model has {info.columns} (dimension {info.dim}, "
                f"buckets {info.buckets}): the model's structure changed")
        kind = params.optimizer.value
        table = self.tables.get(name)
        if table is not None:
            if trains and self.table_info[name].optimizer != kind:
                table = self._rebuild(name, info, params, init_scale, xp)
            return table
        rows = max(o + b for o, b in zip(info.offsets, info.buckets))
        table = self._new_table(name, info.dim, rows, params, info.combiner, init_scale, xp)
        self.tables[name] = table
        info.optimizer = kind if trains else (old.optimizer if old else "")
        self.table_info[name] = info
        pending = self._pending.pop(name, None)
        if pending is not None:
            self._load_table(table, pending)
        elif initializer is not None:
            self._initialize(table, info, initializer)
        return table

    def _rebuild(self, name, info, params, init_scale, xp) -> ColumnTable:
        old = self.tables[name]
        data = self._table_arrays(old)
        rows = max(o + b for o, b in zip(info.offsets, info.buckets))
        table = self._new_table(name, info.dim, rows, params, info.combiner, init_scale, xp)
        self._load_table(table, data)
        self.tables[name] = table
        info.optimizer = params.optimizer.value
        self.table_info[name] = info
        return table

    def _new_table(self, name: str, dim: int, rows: int, params: Any, combiner: str,
                   init_scale: float | None, xp: Any = np) -> ColumnTable:
        """A new, empty table (the distributed store shards it)."""
        return ColumnTable(name, dim, rows, params, combiner, self.seed, init_scale, xp)

    @staticmethod
    def _initialize(table: ColumnTable, info: TableInfo, initializer: Any) -> None:
        for off, n in zip(info.offsets, info.buckets):
            values = np.asarray(initializer((n, info.dim)), dtype=np.float32)
            if values.shape != (n, info.dim):
                raise ConfigError(f"embedding initializer returned shape {list(values.shape)} "
                                  f"for [{n}, {info.dim}]")
            table.load(SparseTable(np.arange(off, off + n, dtype=np.int64), values))

    @staticmethod
    def _table_arrays(table: ColumnTable) -> dict[str, np.ndarray]:
        exported = table.export()
        out = {"keys": exported.keys, "values": exported.embeddings}
        for k, v in table.export_optimizer_state().items():
            out[f"opt/{k}"] = v
        return out

    @staticmethod
    def _load_table(table: ColumnTable, data: dict[str, np.ndarray]) -> None:
        keys = np.asarray(data["keys"], dtype=np.int64)
        table.load(SparseTable(keys, np.asarray(data["values"], dtype=np.float32)))
        states = {k[4:]: v for k, v in data.items() if k.startswith("opt/")}
        if states and set(states) == set(table.state):
            table.load_optimizer_state(keys, states)

    def assign(self, name: str, value: Any) -> None:
        """Set variable ``name`` (a dense or non-trainable variable, or a column's embedding
        weights ``[num_buckets, dim]`` by its TensorFlow name) to ``value``; the variable must
        exist (a program built it) and have ``value``'s shape."""
        value = np.asarray(value, dtype=np.float32)
        for pool in (self.dense, self.state):
            if name in pool:
                if pool[name].shape != value.shape:
                    raise ConfigError(f"assign {name!r}: shape {list(value.shape)}, the variable "
                                      f"has {list(pool[name].shape)}")
                pool[name][...] = value
                return
        for tname, info in self.table_info.items():
            if name in info.display and tname in self.tables:
                slot = info.display.index(name)
                off, n = info.offsets[slot], info.buckets[slot]
                if value.shape != (n, info.dim):
                    raise ConfigError(f"assign {name!r}: shape {list(value.shape)}, the column "
                                      f"has [{n}, {info.dim}]")
                keys = np.arange(off, off + n, dtype=np.int64)
                self.tables[tname].load(SparseTable(keys, value))
                return
        raise ConfigError(f"assign: no variable named {name!r} has been built")

    # -- checkpoints ---------------------------------------------------------------------

    def signature(self) -> dict[str, Any]:
        """The structure: every variable's shape and every table's columns."""
        return {
            "dense": {k: list(v.shape) for k, v in sorted(self.dense.items())},
            "state": {k: list(v.shape) for k, v in sorted(self.state.items())},
            "tables": {k: {"dim": i.dim, "columns": i.columns, "buckets": i.buckets}
                       for k, i in sorted(self.table_info.items())},
        }

    def arrays(self) -> dict[str, np.ndarray]:
        """Everything as named host arrays (a checkpoint's content)."""
        out: dict[str, np.ndarray] = {}
        for k, v in self.dense.items():
            out[f"dense/{k}"] = v
        for k, v in self.state.items():
            out[f"state/{k}"] = v
        for k, st in self.opt.items():
            for s, v in st.items():
                out[f"opt/{k}/{s}"] = to_numpy(v)
        for name, table in self.tables.items():
            for k, v in self._table_arrays(table).items():
                out[f"table/{name}/{k}"] = v
        for name, data in self._pending.items():
            for k, v in data.items():
                out[f"table/{name}/{k}"] = v
        info = {k: vars(i) for k, i in self.table_info.items()}
        meta = {"global_step": self.global_step, "signature": self.signature(),
                "table_info": info}
        out["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
        return out

    def load_arrays(self, data: dict[str, np.ndarray], where: str) -> None:
        """Replace every variable with a checkpoint's (checking the structure of what this
        store already built against it)."""
        meta = json.loads(bytes(np.asarray(data["meta"], dtype=np.uint8)).decode())
        sig = meta["signature"]
        self._check_structure(sig, where)
        for key, value in data.items():
            kind, _, rest = key.partition("/")
            if kind in ("dense", "state"):
                pool = self.dense if kind == "dense" else self.state
                if rest in pool:  # programs hold these arrays: update in place
                    pool[rest][...] = value
                else:
                    pool[rest] = np.array(value, dtype=np.float32)
            elif kind == "opt":
                name, _, s = rest.rpartition("/")
                st = self.opt.setdefault(name, {})
                if s in st and st[s].shape == value.shape:
                    st[s][...] = value
                else:
                    st[s] = np.array(value)
        tables: dict[str, dict[str, np.ndarray]] = {}
        for key, value in data.items():
            if key.startswith("table/"):
                _, name, rest = key.split("/", 2)
                tables.setdefault(name, {})[rest] = np.asarray(value)
        for name, arrays in tables.items():
            saved = meta["table_info"].get(name)
            if name in self.tables:
                info = self.table_info[name]
                params = self.tables[name].optimizer.params
                table = self._new_table(name, info.dim, self.tables[name].workspace_rows,
                                        params, info.combiner, self.tables[name].init_scale)
                self._load_table(table, arrays)
                self.tables[name] = table
            else:
                self._pending[name] = arrays
                if saved is not None:
                    self.table_info.setdefault(name, TableInfo(**saved))
        self.global_step = int(meta["global_step"])

    def _check_structure(self, sig: dict[str, Any], where: str) -> None:
        problems = []
        for kind, pool in (("dense", self.dense), ("state", self.state)):
            saved = sig.get(kind, {})
            for name, arr in pool.items():
                if name not in saved:
                    problems.append(f"{name} is not in it")
                elif list(arr.shape) != saved[name]:
                    problems.append(f"{name} has shape {saved[name]} there, "
                                    f"{list(arr.shape)} here")
            for name in saved:
                if pool and name not in pool:
                    problems.append(f"it has {name}, which this model does not")
        for name, info in self.table_info.items():
            saved = sig.get("tables", {}).get(name)
            if saved is None:
                problems.append(f"table {name} is not in it")
            elif saved["dim"] != info.dim or saved["columns"] != info.columns:
                problems.append(f"table {name} holds {saved['columns']} of dimension "
                                f"{saved['dim']} there, {info.columns} of {info.dim} here")
        if problems:
            raise StructureError(
                f"{where} was saved by a model of a different structure ("
                + "; ".join(problems[:5]) + (" ..." if len(problems) > 5 else "")
                + "). Pick a new model_dir (or delete this one) to train the changed model.")

    def check_against(self, data: dict[str, np.ndarray], where: str) -> None:
        meta = json.loads(bytes(np.asarray(data["meta"], dtype=np.uint8)).decode())
        self._check_structure(meta["signature"], where)
