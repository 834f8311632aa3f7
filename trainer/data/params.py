"""HugeCTR's data-reader parameter objects: ``DataReaderType_t``, ``Check_t``,
``DataReaderSparseParam`` and ``DataReaderParams``.

Names, argument order and defaults follow HugeCTR's Python API, so HugeCTR scripts build them
unchanged (keyword or positional).  Invalid values raise :class:`ConfigError` at once.
"""

from __future__ import annotations

import os
from enum import Enum
from typing import Annotated, Any

from pydantic import Field, field_validator

from tierserve.core.errors import ConfigError
from tierserve.ps.params import ParamsModel


class DataReaderType_t(str, Enum):  # noqa: N801 - HugeCTR's name
    """Dataset formats.  ``RawAsync`` (HugeCTR's MLPerf reader) is read like ``Raw`` here."""

    Norm = "Norm"
    Raw = "Raw"
    Parquet = "Parquet"
    RawAsync = "RawAsync"


class Check_t(str, Enum):  # noqa: N801 - HugeCTR's name
    """Per-record error detection of Norm files: ``Sum`` (checksum byte) or ``Non``."""

    Sum = "Sum"
    Non = "Non"


class DataReaderSparseParam(ParamsModel):
    """One sparse input of the ``Input`` layer: ``slot_num`` consecutive slots.

    ``nnz_per_slot`` as an int is the average number of keys per slot (a sample holds at most
    ``nnz_per_slot * slot_num`` keys of this input); as a list it is each slot's maximum.
    Either way it is a maximum: a slot may hold fewer keys, also with ``is_fixed_length``, which
    in HugeCTR only selects a faster host-to-device copy (accepted, no effect on the values).
    """

    sparse_name: str
    nnz_per_slot: Annotated[int, Field(ge=1)] | list[Annotated[int, Field(ge=1)]]
    is_fixed_length: bool
    slot_num: Annotated[int, Field(ge=1)]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if "name" in kwargs:  # tierserve's one-name-per-concept alias
            kwargs["sparse_name"] = kwargs.pop("name")
        super().__init__(*args, **kwargs)
        if isinstance(self.nnz_per_slot, list) and len(self.nnz_per_slot) != self.slot_num:
            raise ConfigError(
                f"DataReaderSparseParam {self.sparse_name!r}: nnz_per_slot has "
                f"{len(self.nnz_per_slot)} entries but slot_num is {self.slot_num}"
            )

    @property
    def name(self) -> str:
        """The sparse input's name (``sparse_name``)."""
        return self.sparse_name

    @property
    def max_nnz(self) -> int:
        """The most keys one sample can hold in this input."""
        if isinstance(self.nnz_per_slot, list):
            return sum(self.nnz_per_slot)
        return self.nnz_per_slot * self.slot_num

    def nnz_list(self) -> list[int]:
        """``nnz_per_slot`` per slot, as HugeCTR's graph JSON writes it (an int argument
        becomes ``slot_num`` copies)."""
        if isinstance(self.nnz_per_slot, list):
            return list(self.nnz_per_slot)
        return [self.nnz_per_slot] * self.slot_num

    @classmethod
    def from_graph(cls, s: dict[str, Any]) -> DataReaderSparseParam:
        """The param of a graph JSON Data layer's ``sparse`` entry.  A ``nnz_per_slot`` list of
        equal values reads as that int (HugeCTR writes an int argument so, and bounds the
        input's keys per sample by the list's sum either way); without one, the
        ``max_feature_num_per_sample`` spread over the slots."""
        slot_num = int(s["slot_num"])
        nnz = s.get("nnz_per_slot")
        if nnz is None:
            nnz = max(1, int(s.get("max_feature_num_per_sample", slot_num)) // slot_num)
        elif isinstance(nnz, list) and len(nnz) == slot_num and len(set(nnz)) == 1:
            nnz = int(nnz[0])
        return cls(s["top"], nnz, bool(s.get("is_fixed_length", False)), slot_num)


class Alignment_t(str, Enum):  # noqa: N801 - HugeCTR's name
    """Dense-input alignment of HugeCTR's async raw reader: ``Auto`` pads to 8, ``Non``."""

    Auto = "Auto"
    Non = "Non"


class AsyncParam(ParamsModel):
    """HugeCTR's MLPerf-only async raw reader settings (``AsyncParam(32, 4, 716800, 2, 512,
    True, Alignment_t.Non)``).  Given to ``DataReaderParams(async_param=...)`` it warns once:
    the data is read by the Raw reader, with ``num_workers`` threads, in file order."""

    num_threads: Annotated[int, Field(ge=1)]
    num_batches_per_thread: Annotated[int, Field(ge=1)]
    io_block_size: Annotated[int, Field(ge=1)]
    io_depth: Annotated[int, Field(ge=1)]
    io_alignment: Annotated[int, Field(ge=1)]
    shuffle: bool
    aligned_type: Alignment_t = Alignment_t.Non


Source = str | list[str]


class DataReaderParams(ParamsModel):
    """HugeCTR's ``DataReaderParams``: the format, the train and eval sources and reading options.

    ``source`` / ``eval_source``: for Norm and Parquet a file list (first line the number of
    files, then one path per line), for Raw a single data file.  A list of sources is read one
    after the other as one dataset.  ``num_samples`` / ``eval_num_samples`` (Raw only): records to
    read, 0 = as many as the file holds.  ``slot_size_array``: when non-empty, the key of slot
    ``s`` must lie in ``[0, slot_size_array[s])`` and the reader adds
    ``sum(slot_size_array[:s])`` to it; an entry of 0 shares the next non-zero entry's
    vocabulary (its keys lie in that range and get the same offset).  ``num_workers``: reading
    threads (HugeCTR's default 12; capped at the number of CPU cores and of files).
    ``float_label_dense`` (Raw only, default False as in HugeCTR's binding): True reads label
    and dense as float32; False reads int32 values and ``log(x + 1)`` of the dense ones.  A
    file whose values cannot be what the setting says is refused naming it (see
    :mod:`~tierserve.trainer.data.raw`).

    ``keyset``: read by the embedding training cache of a ``Model`` built with ``etc``; the
    ``Model`` warns when it has none.

    Not honoured, each warns once when set: ``cache_eval_data`` (evaluation data is read from
    the files at every evaluation), ``async_param`` (the Raw reader reads the data).
    ``data_source_params``: local
    (``use_hdfs=False``) is read as given; ``use_hdfs=True`` is refused, naming
    ``DataSource.move_to_local``.
    """

    data_reader_type: DataReaderType_t
    source: Source
    keyset: Source = Field(default_factory=list)
    eval_source: str = ""
    check_type: Check_t = Check_t.Non
    cache_eval_data: Annotated[int, Field(ge=0)] = 0
    num_samples: Annotated[int, Field(ge=0)] = 0
    eval_num_samples: Annotated[int, Field(ge=0)] = 0
    float_label_dense: bool = False
    num_workers: Annotated[int, Field(ge=1)] = 12
    slot_size_array: list[Annotated[int, Field(ge=0)]] = Field(default_factory=list)
    data_source_params: Any = None
    async_param: Any = None

    @field_validator("source", "keyset", "eval_source", mode="before")
    @classmethod
    def _paths(cls, value: Any) -> Any:
        if isinstance(value, os.PathLike):
            return os.fspath(value)
        if isinstance(value, (list, tuple)):
            return [os.fspath(v) if isinstance(v, os.PathLike) else v for v in value]
        return value

    def model_post_init(self, context: Any) -> None:
        from tierserve.core.compat import warn_once

        if self.cache_eval_data:
            warn_once("DataReaderParams.cache_eval_data",
                      "evaluation data is not cached on the device; it is read from the files "
                      "at every evaluation", stacklevel=5)
        if self.data_source_params is not None:
            from .source import check_data_source

            dsp = check_data_source(self.data_source_params, "DataReaderParams")
            if dsp.use_hdfs:
                raise ConfigError(
                    "DataReaderParams.data_source_params with use_hdfs: the readers read local "
                    "files; call hugectr.data.DataSource(params).move_to_local() and give the "
                    "local file lists as source / eval_source"
                )
        if self.async_param is not None:
            if not isinstance(self.async_param, AsyncParam):
                raise ConfigError("DataReaderParams.async_param must be an AsyncParam")
            warn_once("DataReaderParams.async_param",
                      "HugeCTR's MLPerf async reader is not used; the data is read by the Raw "
                      "reader with num_workers threads, in file order", stacklevel=5)
