"""DLRover's readers: an elastic reader reads records by index range, shard after shard.

A reader gives records as str lines (CSV-like, decoded by the conf's columns).
:class:`ElasticReader` is the base of readers that can count their records
(:meth:`~ElasticReader.count_data` sets ``self._data_nums``) and read any index range
(:meth:`~ElasticReader.read_data_by_index_range`); its :meth:`~ElasticReader.iterator`
fetches shards from a :class:`~.sharding.ShardDispatcher`, so several workers sharing one
dispatcher read every record once.  :class:`FileReader` is one over a text file.  A
non-elastic reader is any object with an ``iterator()`` method yielding records.
"""

from __future__ import annotations

import abc
import os
from collections.abc import Iterator
from typing import Any

import numpy as np

from tierserve.core.errors import ConfigError, InvalidInputError

from ..data.errors import DataFileError
from .sharding import ShardDispatcher, ShardingClient

_SCAN_BYTES = 1 << 24


class ElasticReader(abc.ABC):
    """Records read by index range.  Subclasses implement :meth:`count_data` (set
    ``self._data_nums``) and :meth:`read_data_by_index_range`.

    ``num_epochs`` passes of ``batch_size``-record batches, handed out in shards of two
    batches (DLRover's ``num_minibatches_per_shard``) when ``enable_dynamic_sharding``;
    otherwise the ranges are read in order.  The conf's ``epoch`` and ``batch_size`` replace
    these through :meth:`configure`.
    """

    def __init__(
        self,
        path: str | None = None,
        num_epochs: int = 1,
        batch_size: int = 64,
        enable_dynamic_sharding: bool = True,
    ) -> None:
        self.path = path
        self._num_epochs = num_epochs
        self._batch_size = batch_size
        self.enable_dynamic_sharding = bool(enable_dynamic_sharding)
        self.data_shard_client: ShardingClient | None = None
        self._data_nums: int | None = None
        self.build_sharding_client()

    @property
    def name(self) -> str:
        """The reader's path, or its class name: how errors and shards name it."""
        return str(self.path) if self.path is not None else type(self).__name__

    def build_sharding_client(self) -> None:
        """Count the records and start handing out their shards from the first one."""
        self.count_data()
        n = self._data_nums
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
            raise ConfigError(
                f"{type(self).__name__}.count_data() must set self._data_nums to the number of "
                f"records (an int >= 0), found {n!r}"
            )
        self._data_nums = int(n)
        if self.enable_dynamic_sharding:
            dispatcher = ShardDispatcher(
                self._data_nums,
                batch_size=self._batch_size,
                num_epochs=self._num_epochs,
                num_minibatches_per_shard=2,
                dataset_name=self.name,
            )
            self.data_shard_client = ShardingClient(dispatcher)

    def configure(self, num_epochs: int | None = None, batch_size: int | None = None) -> None:
        """Read ``num_epochs`` passes of ``batch_size`` batches (None keeps the setting)."""
        if num_epochs is not None:
            self._num_epochs = num_epochs
        if batch_size is not None:
            self._batch_size = batch_size
        self.build_sharding_client()

    def use_dispatcher(self, dispatcher: ShardDispatcher, worker: str) -> None:
        """Read the shards ``dispatcher`` hands to ``worker`` (shared between workers)."""
        if dispatcher.dataset_size != self._data_nums:
            raise ConfigError(
                f"{self.name}: the dispatcher shards {dispatcher.dataset_size} records, the "
                f"reader counts {self._data_nums}"
            )
        self.enable_dynamic_sharding = True
        self.data_shard_client = ShardingClient(dispatcher, worker)

    @abc.abstractmethod
    def count_data(self) -> None:
        """Set ``self._data_nums`` to the number of records."""

    @abc.abstractmethod
    def read_data_by_index_range(self, start_index: int, end_index: int) -> list[Any]:
        """Records ``start_index`` to ``end_index`` (exclusive), as str lines."""

    def read_checked(self, start: int, end: int) -> list[Any]:
        """:meth:`read_data_by_index_range`, checked to give ``end - start`` records."""
        records = self.read_data_by_index_range(start, end)
        if records is None or len(records) != end - start:
            got = "None" if records is None else len(records)
            raise InvalidInputError(
                f"{type(self).__name__}.read_data_by_index_range({start}, {end}) gave {got} "
                f"records, expected {end - start}"
            )
        return records

    def ranges(self) -> Iterator[tuple[int, int]]:
        """The index ranges this reader reads: its shards, or every range in order."""
        client = self.data_shard_client
        if client is not None:
            while True:
                shard = client.fetch_shard()
                if shard is None:
                    if client.report_on_fetch:
                        client.report_all_done()
                    return
                yield shard.start, shard.end
        else:
            n, step = self._data_nums or 0, max(1, self._batch_size) * 2
            epochs = self._num_epochs
            epoch = 0
            while n and (epochs is None or epoch < epochs):
                for start in range(0, n, step):
                    yield start, min(n, start + step)
                epoch += 1

    def iterator(self) -> Iterator[Any]:
        """The records, shard after shard."""
        for start, end in self.ranges():
            yield from self.read_checked(start, end)

    def line_of(self, index: int) -> int | None:
        """The file line (1-based) of record ``index``, where the reader knows it."""
        return None


class FileReader(ElasticReader):
    """The lines of a text file as records (DLRover's ``FileReader``); ``skip_header``
    (default True, as DLRover) leaves the first line out.  Only line offsets are kept in
    memory (8 bytes a line); ranges are read from the file when asked for."""

    def __init__(
        self,
        file_name: str | os.PathLike,
        num_epochs: int = 1,
        batch_size: int = 64,
        enable_dynamic_sharding: bool = True,
        skip_header: bool = True,
    ) -> None:
        self._file_name = os.fspath(file_name)
        self._skip_header = bool(skip_header)
        self._offsets = np.zeros(1, dtype=np.int64)
        super().__init__(self._file_name, num_epochs, batch_size, enable_dynamic_sharding)

    def count_data(self) -> None:
        try:
            size = os.path.getsize(self._file_name)
            ends = []
            with open(self._file_name, "rb") as f:
                pos = 0
                while True:
                    chunk = f.read(_SCAN_BYTES)
                    if not chunk:
                        break
                    ends.append(np.flatnonzero(np.frombuffer(chunk, np.uint8) == 10) + pos + 1)
                    pos += len(chunk)
        except OSError as exc:
            raise DataFileError(self._file_name, f"cannot read: {exc.strerror or exc}") from None
        ends = np.concatenate(ends) if ends else np.zeros(0, dtype=np.int64)
        if size and (not len(ends) or ends[-1] != size):
            ends = np.append(ends, size)  # a last line without a newline
        offsets = np.concatenate([[0], ends]).astype(np.int64)
        if self._skip_header and len(offsets) > 1:
            offsets = offsets[1:]
        self._offsets = offsets
        self._data_nums = len(offsets) - 1

    def read_data_by_index_range(self, start_index: int, end_index: int) -> list[str]:
        if not 0 <= start_index <= end_index <= self._data_nums:
            raise InvalidInputError(
                f"{self._file_name}: index range [{start_index}, {end_index}) is outside "
                f"[0, {self._data_nums})"
            )
        lo, hi = int(self._offsets[start_index]), int(self._offsets[end_index])
        with open(self._file_name, "rb") as f:
            f.seek(lo)
            data = f.read(hi - lo)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise DataFileError(self._file_name, f"not UTF-8 text: {exc}") from None
        if "\r" in text:
            text = text.replace("\r\n", "\n")
        lines = text.split("\n")
        if text.endswith("\n"):
            lines.pop()
        return lines

    def line_of(self, index: int) -> int | None:
        return index + 1 + int(self._skip_header)
