"""HugeCTR's ``InferenceModel`` and ``InferenceSession``: the server's model runtime
(:class:`tierserve.server.inference_model.InferenceModel`) with what HugeCTR's Python API adds
on top: ``predict`` and ``evaluate`` read a Norm, Raw or Parquet dataset in batches of
``max_batchsize`` and wrap around to its start, as HugeCTR does; ``InferenceSession`` is the
older single-table API over raw lists.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from tierserve.core.errors import ConfigError, InvalidInputError
from tierserve.model.batch import Batch, SparseInput
from tierserve.ps.config import PSConfig
from tierserve.ps.config_base import DisabledConfig
from tierserve.ps.hash_map import HashMapConfig
from tierserve.server import inference_model as runtime


class InferenceModel(runtime.InferenceModel):
    """HugeCTR's ``InferenceModel(model_config_path, inference_params)``: the server's
    runtime (``predict_batch``, ``check_out_tensor``, the cache and tiers) plus ``predict`` and
    ``evaluate`` over a dataset."""

    def _batches(
        self, num_batches: int, source, data_reader_type, check_type, slot_size_array
    ) -> Iterator[Batch]:
        from .inference_data import wrapped_batches

        return wrapped_batches(
            self.graph,
            source,
            data_reader_type,
            check_type,
            slot_size_array,
            batch_size=self.max_batchsize,
            num_batches=num_batches,
            i64_input_key=self.i64_input_key,
        )

    def predict(
        self,
        num_batches: int,
        source: str | Sequence[str],
        data_reader_type: Any = "Norm",
        check_type: Any = "Sum",
        slot_size_array: Sequence[int] | None = None,
    ) -> np.ndarray:
        """Predictions ``(max_batchsize * num_batches, label_dim)``, wrapping over the data."""
        outs = [
            self.predict_batch(b)
            for b in self._batches(
                num_batches, source, data_reader_type, check_type, slot_size_array
            )
        ]
        if not outs:
            return np.zeros((0, self.label_dim), dtype=np.float32)
        return np.concatenate(outs)

    def evaluate(
        self,
        num_batches: int,
        source: str | Sequence[str],
        data_reader_type: Any = "Norm",
        check_type: Any = "Sum",
        slot_size_array: Sequence[int] | None = None,
    ) -> float:
        """AUC over ``max_batchsize * num_batches`` samples (wrapping over the data)."""
        preds, labels = [], []
        for b in self._batches(num_batches, source, data_reader_type, check_type, slot_size_array):
            preds.append(self.predict_batch(b))
            labels.append(b.label)
        from ..evaluation import auc

        return auc(np.concatenate(labels), np.concatenate(preds))


class InferenceSession:
    """HugeCTR's older ``InferenceSession(config_file, device_id, embedding_cache)``.

    ``config_file`` is the older document's inference JSON: the graph's ``layers`` and an
    ``inference`` clause naming ``dense_model_file`` and ``sparse_model_file`` (or the keyword
    arguments give them).  ``embedding_cache`` is what ``CreateEmbeddingCache`` returned (the
    session reads the model's tables through it), a parameter server already holding the
    model, or None (the session loads the files into a hash map of its own).  The key width is
    the clause's ``input_key_type`` ("I64" / "I32"), else the cache's, else 64 bits.
    ``predict(dense_features, embeddingcolumns, row_ptrs)`` takes flat lists: ``B *
    dense_dim`` floats, the keys, and CSR row pointers ``B * slot_num + 1`` per table.
    :meth:`from_model` wraps an :class:`InferenceModel` (``CreateInferenceSession``).
    """

    def __init__(
        self,
        config_file: str | os.PathLike,
        device_id: int = 0,
        embedding_cache: Any = None,
        model_name: str | None = None,
        dense_model_file: str | None = None,
        sparse_model_files: Sequence[str] | None = None,
        max_batchsize: int | None = None,
    ) -> None:
        from tierserve.ps.inference_json import input_key_bits, model_config_from_inference_json

        if model_name is None and embedding_cache is not None:
            model_name = getattr(embedding_cache, "model", None)
        config = model_config_from_inference_json(config_file, model_name)
        changes: dict[str, Any] = {"deployed_device_list": [device_id]}
        if sparse_model_files:
            changes["sparse_files"] = list(sparse_model_files)
        if dense_model_file:
            changes["dense_file"] = dense_model_file
        if max_batchsize:
            changes["max_batch_size"] = max_batchsize
        config = config.updated("InferenceSession", **changes)
        bits = input_key_bits(config_file)
        if bits is None:
            bits = 64 if getattr(embedding_cache, "i64_input_key", True) else 32
        ps_config = None
        if embedding_cache is None:  # the files in a hash map of the session's own
            ps_config = PSConfig(supportlonglong=bits == 64, volatile_db=HashMapConfig(),
                                 persistent_db=DisabledConfig(), models=[])  # fmt: skip
        self.model = InferenceModel.open(config, embedding_cache, ps_config,
                                         i64_input_key=bits == 64,
                                         use_gpu_embedding_cache=False)  # fmt: skip

    @classmethod
    def from_model(cls, model: InferenceModel) -> InferenceSession:
        """A session that predicts with ``model``."""
        self = cls.__new__(cls)
        self.model = model
        return self

    def refresh_embedding_cache(self) -> int:
        """HugeCTR's ``refresh_embedding_cache``: re-read every row the embedding cache holds
        from the parameter server's tiers (rows changed there since they were cached); the
        number of rows refreshed, 0 without an embedding cache."""
        cache = self.model.cache
        return 0 if cache is None else int(cache.refresh())

    def evaluate(self, num_batches: int, source: str | Sequence[str], data_reader_type: Any,
                 check_type: Any, slot_size_array: Sequence[int] | None = None,
                 num_samples: int = 0) -> float:
        """HugeCTR's ``InferenceSession.evaluate``: :meth:`InferenceModel.evaluate` (AUC).
        ``num_samples`` (v4.1's binding) is accepted; the batches are what they count."""
        return self.model.evaluate(num_batches, source, data_reader_type, check_type,
                                   slot_size_array)

    def predict(self, *args: Any, **kwargs: Any) -> Any:
        """Both of HugeCTR's overloads: ``predict(dense_feature, embeddingcolumns, row_ptrs)``
        (flat lists in, a flat list out; see :meth:`predict_samples`) and ``predict(num_batches,
        source, data_reader_type, check_type, slot_size_array=[], num_samples=0)`` (a dataset:
        :meth:`InferenceModel.predict`, ``[num_batches * max_batchsize, label_dim]``, flat
        ``[num_batches * max_batchsize]`` for one label, as HugeCTR's session returns it)."""
        first = args[0] if args else kwargs.get("num_batches", kwargs.get("dense_feature"))
        if "num_batches" in kwargs or "source" in kwargs or (
                isinstance(first, (int, np.integer)) and not isinstance(first, bool)):
            kwargs.pop("num_samples", None)
            if len(args) > 5:
                args = args[:5]  # num_samples: the batches are what they count
            preds = self.model.predict(*args, **kwargs)
            # HugeCTR's session returns [N] for one label (its InferenceModel: [N, 1])
            return preds.reshape(-1) if preds.shape[1] == 1 else preds
        if "dense_feature" in kwargs:
            kwargs["dense_features"] = kwargs.pop("dense_feature")
        return self.predict_samples(*args, **kwargs)

    def predict_samples(
        self,
        dense_features: Sequence[float],
        embeddingcolumns: Sequence[int],
        row_ptrs: Sequence[int],
        i64_input_key: bool | None = None,
    ) -> list[float]:
        """Predictions for the samples in the flat lists, as a flat list.  ``i64_input_key``,
        when given, must agree with the session's key width."""
        m = self.model
        if i64_input_key is not None and bool(i64_input_key) != m.i64_input_key:
            raise ConfigError(
                f"predict: i64_input_key={i64_input_key} but the session has "
                f"{64 if m.i64_input_key else 32}-bit keys"
            )
        dense = np.asarray(dense_features, dtype=np.float32)
        if m.dense_dim == 0 or dense.size % m.dense_dim:
            raise InvalidInputError(
                f"dense_features has {dense.size} values, not a multiple of dense_dim {m.dense_dim}"
            )
        batch_size = dense.size // m.dense_dim
        keys = np.asarray(embeddingcolumns, dtype=np.int64)
        ptrs = np.asarray(row_ptrs, dtype=np.int64)
        sparse, at, key_at = [], 0, 0
        for t, slots in enumerate(m.slot_nums):
            n = batch_size * slots + 1
            offsets = ptrs[at : at + n]
            if offsets.shape[0] != n:
                raise InvalidInputError(
                    f"row_ptrs has {ptrs.size} entries; {batch_size} samples need "
                    f"{sum(batch_size * s + 1 for s in m.slot_nums)}"
                )
            offsets = offsets - offsets[0]
            nnz = int(offsets[-1])
            sparse.append(SparseInput(keys[key_at : key_at + nnz], offsets, slots))
            at, key_at = at + n, key_at + nnz
            del t
        batch = Batch(
            label=np.zeros((batch_size, m.label_dim), np.float32),
            dense=dense.reshape(batch_size, m.dense_dim),
            sparse=tuple(sparse),
        )
        return m.predict_batch(batch).reshape(-1).tolist()
