"""What the data plane serves: a model version behind a uniform tensor interface.

A :class:`Servable` declares its input and output
:class:`~tierserve.server.runtime.tensors.TensorSpec`
and runs in three steps so the dynamic batcher can coalesce requests: ``prepare`` turns one
request's checked arrays into a batch-first unit, ``merge`` joins units, ``execute`` runs one
unit and returns batch-first outputs, which the batcher splits back by batch size.

Two kinds exist:

- :class:`RankingServable`, a CTR model (docs/formats.md, Requests): ``DES`` FP32
  ``[B, dense_dim]``,
  ``CATCOLUMN`` INT64 ``[B, slots]`` (one key per slot) or, with ``ROWINDEX`` INT32, the keys of
  every table flattened with per-table CSR row pointers (``B * slots_t + 1`` per table, table
  after table) -> ``OUTPUT0`` FP32 ``[B, label_dim]``;
- :class:`EmbeddingLookupServable`, the parameter server as an embedding store: ``KEYS`` INT64
  ``[n]`` (the keys of table 0, then table 1, ...) and ``NUMKEYS`` INT32 ``[num_tables]`` (how
  many keys each table gets) -> ``OUTPUT0`` FP32 ``[sum(n_t * dim_t)]``, the embeddings
  row-major, table after table.  Unknown keys get the table's default vector.

What a servable *takes* (its specs, checked on every request) may be wider than what it
*presents* in model metadata and model config (:meth:`Servable.interface`): the presented
signature is the one a Triton client builds requests from without help (``perf_analyzer``,
``model_analyzer``), the same as ``tierserve triton-repo`` writes for tritonserver.  A
one-hot ranking model presents ``DES`` and ``CATCOLUMN`` with a batch dimension (the
``ROWINDEX`` it also takes, as HugeCTR's clients send it, has no per-row shape); a multi-hot
one presents no batch dimension (CSR inputs do not split by row): ``DES`` [-1, dense_dim],
``CATCOLUMN`` [-1], ``ROWINDEX`` [-1].
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from tierserve.core.errors import InvalidInputError
from tierserve.model.batch import Batch, SparseInput
from tierserve.ps.keys import as_keys

from .tensors import TensorSpec, check_finite, check_inputs, check_int_range


@dataclass(frozen=True)
class RequestLimits:
    """What one request may carry besides what its specs say (server settings).

    ``None`` limits are each model's own: ``max_keys_per_row`` is the keys one row may give
    one table (the model's ``maxnum_catfeature_query_per_table_per_sample``, at least its
    slot count), ``max_keys_per_request`` that times ``max_batch_size``, summed over tables.
    Keys over a limit are refused with a 400 naming it, before any work is done on them.
    """

    max_keys_per_request: int | None = None
    max_keys_per_row: int | None = None
    allow_nonfinite: bool = False


NO_LIMITS = RequestLimits()


@dataclass(frozen=True)
class Interface:
    """What model metadata and model config present (Triton's view of a model).

    ``max_batch_size`` > 0: every tensor's first dimension is the batch, which a client
    may fill with up to that many rows; 0: requests carry shapes as the specs say, whole.
    """

    max_batch_size: int
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]


class Servable(ABC):
    """One loaded model version; see the module docstring."""

    name: str
    version: str
    platform: str = "tierserve"
    #: What the model is to its clients (its inputs and outputs); a version of another kind
    #: never replaces it unasked (see :mod:`.repository`).  Empty: not compared.
    kind: str = ""
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    #: Largest batch one request (and one merged execution) may carry; 0: no batch dimension.
    max_batch_size: int = 0

    def check(
        self,
        inputs: dict[str, np.ndarray],
        declared: dict[str, str] | None = None,
        limits: RequestLimits = NO_LIMITS,
    ) -> None:
        """Check names, datatypes, shapes, values and sizes against the specs and ``limits``."""
        check_inputs(self.inputs, inputs, declared)
        if not limits.allow_nonfinite:
            check_finite(inputs)
        self.check_limits(inputs, limits)

    def check_limits(self, inputs: dict[str, np.ndarray], limits: RequestLimits) -> None:  # noqa: B027
        """Refuse requests over ``limits`` (called after the spec checks)."""

    @abstractmethod
    def prepare(self, inputs: dict[str, np.ndarray]) -> Any:
        """One request's checked inputs as a unit with a ``batch_size``."""

    def merge(self, units: Sequence[Any]) -> Any:
        """Several units as one (only called when ``max_batch_size > 0``)."""
        raise NotImplementedError

    @abstractmethod
    def execute(self, unit: Any) -> dict[str, np.ndarray]:
        """Run one unit; outputs are batch-first when ``max_batch_size > 0``."""

    def interface(self) -> Interface:
        """What metadata and config present (see the module docstring): by default every
        spec and ``max_batch_size``."""
        return Interface(self.max_batch_size, tuple(self.inputs), tuple(self.outputs))

    def config(self) -> dict[str, Any]:
        """Extra model-config fields (``parameters``) for the config endpoint."""
        return {}

    def stats(self) -> dict[str, Any]:
        """Statistics for /metrics: ``{"cache_hit_rate": {table: rate}}`` for a version with
        an embedding cache; none by default."""
        return {}

    def warm_up(self) -> None:  # noqa: B027 - optional hook
        """Run what a first request would (see :func:`warm_up`), on the calling thread; the
        server calls it once more on an inference thread before it reports ready."""

    def commit(self) -> None:  # noqa: B027 - optional hook
        """Called by the repository as this version starts serving (tables go live)."""

    def discard(self) -> None:  # noqa: B027 - optional hook
        """Called once this version is refused, replaced or unloaded and no request uses it:
        free what only it holds (its tables), before :meth:`close`."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release what the version holds (tiers, caches, threads)."""


# --- ranking models ------------------------------------------------------------------------


class Predictor(Protocol):
    """What :class:`RankingServable` runs: an ``InferenceModel`` or anything alike."""

    dense_dim: int
    label_dim: int
    slot_nums: list[int]
    max_batchsize: int

    def predict_batch(self, batch: Batch) -> np.ndarray: ...


@dataclass(frozen=True)
class Unit:
    """A batch and its size (the batcher reads ``batch_size``)."""

    batch: Batch

    @property
    def batch_size(self) -> int:
        return self.batch.batch_size


def merge_batches(batches: Sequence[Batch]) -> Batch:
    """Concatenate batches sample-wise (CSR row pointers shifted)."""
    if len(batches) == 1:
        return batches[0]
    sparse = []
    for t in range(len(batches[0].sparse)):
        parts = [b.sparse[t] for b in batches]
        keys = np.concatenate([p.keys for p in parts])
        starts = np.cumsum([0] + [len(p.keys) for p in parts[:-1]])
        offsets = np.concatenate(
            [parts[0].row_offsets[:1]] + [p.row_offsets[1:] + s for p, s in zip(parts, starts)]
        )
        sparse.append(SparseInput(keys=keys, row_offsets=offsets, slot_num=parts[0].slot_num))
    return Batch(
        label=np.concatenate([b.label for b in batches]),
        dense=np.concatenate([b.dense for b in batches]),
        sparse=tuple(sparse),
    )


def _hotness(model: Predictor, slot_nums: list[int]) -> list[int]:
    """Most keys one row gives each sparse input: the graph's ``max_feature_num_per_sample``
    where it has one (as ``maxnum_catfeature_query_per_table_per_sample``), at least one key
    per slot."""
    graph = getattr(model, "graph", None)
    data_layer = getattr(graph, "data_layer", None) or {}
    sparse = data_layer.get("sparse", []) if isinstance(data_layer, dict) else []
    if len(sparse) != len(slot_nums):
        return list(slot_nums)
    return [
        max(int(s.get("max_feature_num_per_sample") or 0), n) for s, n in zip(sparse, slot_nums)
    ]


def key_dtype_check(name: str, keys: np.ndarray, i64_keys: bool) -> np.ndarray:
    """``keys`` as the model's key type, refusing keys that do not fit it (a 400 naming
    ``name``): int64, or for a 32-bit model int32 holding HugeCTR's unsigned 32-bit keys by the
    one key rule (:mod:`tierserve.ps.keys`): INT32 tensors carry the keys' bits, wider ones
    must hold 0 .. 2**32-1."""
    if i64_keys:
        if keys.dtype != np.int64:
            check_int_range(name, keys, np.dtype(np.int64), "")
            keys = keys.astype(np.int64)
        return keys
    if keys.dtype == np.int32:
        return keys
    unsigned = as_keys(keys, 32, f"input {name!r}")
    return unsigned.astype(np.uint32).view(np.int32).reshape(keys.shape)


class RankingServable(Servable):
    """A CTR model: ``DES``, ``CATCOLUMN`` [, ``ROWINDEX``] -> ``OUTPUT0``.

    ``i64_keys`` False (a model with ``supportlonglong`` false) declares ``CATCOLUMN`` INT32
    and also takes INT64 keys that fit in 32 bits; ``None`` reads the model's
    ``i64_input_key`` (True when it has none).  A request of zero rows is answered with
    zero rows without running the model, alone or merged.
    """

    kind = "ranking model"

    def __init__(
        self,
        name: str,
        version: str,
        model: Predictor,
        closer=None,
        i64_keys: bool | None = None,
    ) -> None:
        self.name, self.version, self.model = name, version, model
        self.max_batch_size = int(model.max_batchsize)
        self._closer = closer
        if i64_keys is None:
            i64_keys = bool(getattr(model, "i64_input_key", True))
        self.i64_keys = i64_keys
        self.slot_nums = list(model.slot_nums)
        self.total_slots = sum(self.slot_nums)
        self.hotness = _hotness(model, self.slot_nums)
        keys, other = ("INT64", "INT32") if i64_keys else ("INT32", "INT64")
        self.inputs = [
            TensorSpec("DES", "FP32", (-1, model.dense_dim)),
            TensorSpec(
                "CATCOLUMN", keys, (-1, self.total_slots), alternatives=((-1,), (1, -1)),
                also_datatypes=() if i64_keys else (other,),
            ),
            TensorSpec("ROWINDEX", "INT32", (-1,), optional=True, alternatives=((1, -1),)),
        ]  # fmt: skip
        self.outputs = [TensorSpec("OUTPUT0", "FP32", (-1, model.label_dim))]
        self.multi_hot = self.hotness != self.slot_nums

    def interface(self) -> Interface:
        """One-hot: ``DES``, ``CATCOLUMN`` batched; multi-hot: CSR inputs, no batch dimension
        (the module docstring says why)."""
        if not self.multi_hot:
            return Interface(self.max_batch_size, tuple(self.inputs[:2]), tuple(self.outputs))
        des, catcolumn, _ = self.inputs
        return Interface(
            0,
            (
                des,
                TensorSpec("CATCOLUMN", catcolumn.datatype, (-1,)),
                TensorSpec("ROWINDEX", "INT32", (-1,)),
            ),
            tuple(self.outputs),
        )

    def _check_batch_size(self, batch_size: int) -> None:
        if batch_size > self.max_batch_size:
            raise InvalidInputError(
                f"input 'DES' has batch size {batch_size}, over the model's "
                f"max_batch_size {self.max_batch_size}"
            )

    def check_limits(self, inputs: dict[str, np.ndarray], limits: RequestLimits) -> None:
        batch_size = inputs["DES"].shape[0]
        self._check_batch_size(batch_size)
        keys = inputs["CATCOLUMN"]
        limit = limits.max_keys_per_request
        if limit is None:
            limit = self.max_batch_size * sum(self.hotness)
        if keys.size > limit:
            raise InvalidInputError(
                f"input 'CATCOLUMN' has {keys.size} keys, over the limit of {limit} keys per "
                f"request (max_keys_per_request; the model's default is max_batch_size "
                f"{self.max_batch_size} x {sum(self.hotness)} keys per row)"
            )
        rowindex = inputs.get("ROWINDEX")
        if rowindex is None or batch_size == 0:
            return  # one key per slot; or nothing to count
        rowindex = rowindex.reshape(-1)
        at = 0
        for t, slots in enumerate(self.slot_nums):
            offsets = rowindex[at : at + batch_size * slots + 1].astype(np.int64)
            at += batch_size * slots + 1
            if offsets.shape[0] != batch_size * slots + 1:
                return  # prepare names the wrong length
            most = int(np.diff(offsets[::slots]).max())
            per_row = limits.max_keys_per_row or self.hotness[t]
            if most > per_row:
                raise InvalidInputError(
                    f"input 'ROWINDEX': a row gives table {t} {most} keys, over the limit of "
                    f"{per_row} keys per row and table (max_keys_per_row; the model's default "
                    f"is its maxnum_catfeature_query_per_table_per_sample)"
                )

    def prepare(self, inputs: dict[str, np.ndarray]) -> Unit:
        self._check_batch_size(inputs["DES"].shape[0])
        dense = np.ascontiguousarray(inputs["DES"], dtype=np.float32)
        batch_size = dense.shape[0]
        keys = key_dtype_check("CATCOLUMN", inputs["CATCOLUMN"], self.i64_keys)
        rowindex = inputs.get("ROWINDEX")
        if rowindex is None:
            sparse = self._one_hot(keys, batch_size)
        else:
            sparse = self._csr(keys.reshape(-1), rowindex, batch_size)
        label = np.zeros((batch_size, self.model.label_dim), dtype=np.float32)
        return Unit(Batch(label=label, dense=dense, sparse=tuple(sparse)))

    def _one_hot(self, keys: np.ndarray, batch_size: int) -> list[SparseInput]:
        if keys.shape != (batch_size, self.total_slots):
            raise InvalidInputError(
                f"input 'CATCOLUMN' has shape {list(keys.shape)}; without ROWINDEX it must be "
                f"[{batch_size}, {self.total_slots}] (one key per slot, batch of DES)"
            )
        out, start = [], 0
        for slots in self.slot_nums:
            part = np.ascontiguousarray(keys[:, start : start + slots]).reshape(-1)
            offsets = np.arange(batch_size * slots + 1, dtype=np.int64)
            out.append(SparseInput(keys=part, row_offsets=offsets, slot_num=slots))
            start += slots
        return out

    def _csr(self, keys: np.ndarray, rowindex: np.ndarray, batch_size: int) -> list[SparseInput]:
        lengths = [batch_size * s + 1 for s in self.slot_nums]
        if rowindex.shape[0] != sum(lengths):
            raise InvalidInputError(
                f"input 'ROWINDEX' has {rowindex.shape[0]} row pointers; a batch of "
                f"{batch_size} needs {sum(lengths)} (batch * slots + 1 per table, "
                f"slots per table {self.slot_nums})"
            )
        rowindex = rowindex.astype(np.int64, copy=False)
        out, at, key_start = [], 0, 0
        for t, (slots, n) in enumerate(zip(self.slot_nums, lengths)):
            offsets = rowindex[at : at + n]
            at += n
            if offsets[0] != 0 or np.any(np.diff(offsets) < 0):
                raise InvalidInputError(
                    f"input 'ROWINDEX': the row pointers of table {t} must start at 0 and "
                    f"never decrease"
                )
            nnz = int(offsets[-1])
            if key_start + nnz > keys.shape[0]:
                raise InvalidInputError(
                    f"input 'ROWINDEX': table {t} points past the end of CATCOLUMN "
                    f"({keys.shape[0]} keys)"
                )
            out.append(
                SparseInput(
                    keys=keys[key_start : key_start + nnz],
                    row_offsets=offsets,
                    slot_num=slots,
                )
            )
            key_start += nnz
        if key_start != keys.shape[0]:
            raise InvalidInputError(
                f"input 'CATCOLUMN' has {keys.shape[0]} keys; ROWINDEX accounts for {key_start}"
            )
        return out

    def merge(self, units: Sequence[Unit]) -> Unit:
        return Unit(merge_batches([u.batch for u in units]))

    def execute(self, unit: Unit) -> dict[str, np.ndarray]:
        if unit.batch_size == 0:
            return {"OUTPUT0": np.zeros((0, self.model.label_dim), dtype=np.float32)}
        return {"OUTPUT0": np.asarray(self.model.predict_batch(unit.batch), dtype=np.float32)}

    def close(self) -> None:
        if self._closer is not None:
            self._closer()


# --- embedding lookup ------------------------------------------------------------------------


class EmbeddingSource(Protocol):
    """Looks up embeddings: float32 ``[len(keys), dim]``, default vectors for unknown keys."""

    def lookup(self, table: int, keys: np.ndarray) -> np.ndarray: ...


class EmbeddingLookupServable(Servable):
    """The embedding-lookup model: ``KEYS``, ``NUMKEYS`` -> ``OUTPUT0`` (no batch dimension).

    ``max_keys`` is the model's own limit of keys per request (the loader passes
    ``max_batch_size`` x the sum of ``maxnum_catfeature_query_per_table_per_sample``); the
    server's ``max_keys_per_request`` overrides it.  ``i64_keys`` False: ``KEYS`` is INT32,
    and INT64 keys that fit in 32 bits are taken too (the loader passes the parameter
    server's ``supportlonglong``).
    """

    max_batch_size = 0
    kind = "embedding store"

    def __init__(
        self,
        name: str,
        version: str,
        source: EmbeddingSource,
        table_names: Sequence[str],
        dims: Sequence[int],
        max_keys: int = 1 << 20,
        closer=None,
        i64_keys: bool = True,
    ) -> None:
        self.name, self.version, self.source = name, version, source
        self.table_names, self.dims = list(table_names), [int(d) for d in dims]
        self.max_keys = max_keys
        self.i64_keys = i64_keys
        self._closer = closer
        n = len(self.dims)
        keys, other = ("INT64", "INT32") if i64_keys else ("INT32", "INT64")
        self.inputs = [
            TensorSpec(
                "KEYS",
                keys,
                (-1,),
                alternatives=((1, -1),),
                also_datatypes=() if i64_keys else (other,),
            ),  # fmt: skip
            TensorSpec("NUMKEYS", "INT32", (n,), alternatives=((1, n),)),
        ]
        self.outputs = [TensorSpec("OUTPUT0", "FP32", (-1,))]

    def check_limits(self, inputs: dict[str, np.ndarray], limits: RequestLimits) -> None:
        limit = limits.max_keys_per_request or self.max_keys
        if inputs["KEYS"].size > limit:
            raise InvalidInputError(
                f"input 'KEYS' has {inputs['KEYS'].size} keys, over the limit of {limit} keys "
                "per request (max_keys_per_request)"
            )

    def prepare(self, inputs: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        keys = key_dtype_check("KEYS", inputs["KEYS"].reshape(-1), self.i64_keys)
        counts = inputs["NUMKEYS"].reshape(-1).astype(np.int64)
        if np.any(counts < 0) or int(counts.sum()) != keys.shape[0]:
            raise InvalidInputError(
                f"input 'NUMKEYS' {counts.tolist()} must be non-negative and add up to the "
                f"{keys.shape[0]} entries of KEYS"
            )
        return keys, counts

    def execute(self, unit: tuple[np.ndarray, np.ndarray]) -> dict[str, np.ndarray]:
        keys, counts = unit
        if keys.size == 0:
            return {"OUTPUT0": np.zeros(0, np.float32)}
        bounds = np.concatenate([[0], np.cumsum(counts)])
        parts = [
            np.asarray(
                self.source.lookup(t, keys[bounds[t] : bounds[t + 1]]), dtype=np.float32
            ).reshape(-1)
            for t in range(len(self.dims))
        ]
        return {"OUTPUT0": np.concatenate(parts) if parts else np.zeros(0, np.float32)}

    def config(self) -> dict[str, Any]:
        return {
            "embedding_table_names": ",".join(self.table_names),
            "embedding_vecsize_per_table": ",".join(map(str, self.dims)),
        }

    def close(self) -> None:
        if self._closer is not None:
            self._closer()


def warm_up(servable: Servable) -> None:
    """Run one row of zeros (dense values 0, every key 0) through ``servable`` before it
    serves, so what a first request would compile or load (numba kernels of the tiers and
    caches, first-call paths of the network) is ready, and the first real request is as fast
    as the rest.  The answer is dropped; a lookup of key 0 is what any request may do."""
    if isinstance(servable, RankingServable):
        keys = np.int64 if servable.i64_keys else np.int32
        dense = np.zeros((1, servable.model.dense_dim), np.float32)
        requests = [{"DES": dense, "CATCOLUMN": np.zeros((1, servable.total_slots), keys)}]
        if servable.hotness != servable.slot_nums:  # multi-hot: the ROWINDEX path as well
            offsets = [np.arange(s + 1, dtype=np.int32) for s in servable.slot_nums]
            rowindex = np.concatenate(offsets)
            requests.append({"DES": dense, "CATCOLUMN": np.zeros(servable.total_slots, keys),
                             "ROWINDEX": rowindex})  # fmt: skip
    elif isinstance(servable, EmbeddingLookupServable):
        keys = np.int64 if servable.i64_keys else np.int32
        n = len(servable.dims)
        requests = [{"KEYS": np.zeros(n, keys), "NUMKEYS": np.ones(n, np.int32)}]
    else:
        return
    for inputs in requests:
        servable.execute(servable.prepare(inputs))
