"""Batches of a dataset for a served model, read with the trainer's ``DataReader``.

The reader's layout (label, dense and sparse inputs) comes from the model's graph JSON, so a
dataset written for training reads the same way for inference.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any

from tierserve.model.batch import Batch
from tierserve.model.graph_json import Graph
from tierserve.model.inference_graph import label_layout
from tierserve.trainer.data.params import DataReaderSparseParam
from tierserve.trainer.data.reader import DataReader


def _enum_name(value: Any) -> str:
    return getattr(value, "name", None) or getattr(value, "value", None) or str(value)


def reader_for(
    graph: Graph,
    source: str | os.PathLike | Sequence[str | os.PathLike],
    data_reader_type: Any,
    check_type: Any,
    slot_size_array: Sequence[int] | None,
    batch_size: int,
    i64_input_key: bool = True,
    repeat: bool = False,
) -> DataReader:
    """A ``DataReader`` over ``source`` laid out as ``graph``'s Data layer."""
    data = graph.data_layer
    _, label_dims = label_layout(data)
    dense = data.get("dense") or {}
    sparse = [DataReaderSparseParam.from_graph(s) for s in data.get("sparse", []) or []]
    if slot_size_array is None or len(slot_size_array) == 0:
        slot_size_array = data.get("slot_size_array") or ()
    return DataReader(
        _enum_name(data_reader_type),
        source,
        batch_size,
        label_dims,
        int(dense.get("dense_dim", 0)),
        sparse,
        check_type=_enum_name(check_type),
        i64_input_key=i64_input_key,
        repeat_dataset=repeat,
        slot_size_array=list(slot_size_array),
        # Raw data as the model was trained on it (default False, as HugeCTR's JSON parser)
        float_label_dense=bool(data.get("float_label_dense", False)),
    )


def wrapped_batches(
    graph: Graph,
    source,
    data_reader_type,
    check_type,
    slot_size_array,
    batch_size: int,
    num_batches: int,
    i64_input_key: bool = True,
) -> Iterator[Batch]:
    """``num_batches`` full batches, cycling over the source as HugeCTR's predict does."""
    with reader_for(
        graph, source, data_reader_type, check_type, slot_size_array, batch_size,
        i64_input_key, repeat=True,
    ) as reader:  # fmt: skip
        for _ in range(num_batches):
            yield reader.read_a_batch()


def epoch_batches(
    graph: Graph,
    source,
    data_reader_type,
    check_type="Non",
    slot_size_array=None,
    batch_size: int = 1024,
    i64_input_key: bool = True,
) -> Iterator[Batch]:
    """Every sample of the source once; the last batch may be smaller."""
    with reader_for(
        graph, source, data_reader_type, check_type, slot_size_array, batch_size,
        i64_input_key, repeat=False,
    ) as reader:  # fmt: skip
        yield from reader
