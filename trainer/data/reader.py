"""The data reader: batches of any format, read ahead by background threads.

:class:`DataReader` turns a source (Norm or Parquet file list, Raw file) into
:class:`~tierserve.model.batch.Batch` objects of ``batch_size`` samples.  Worker threads
decode whole chunks of records (one task per file, or per run of records for Raw), check them
(nnz limits, ``slot_size_array`` ranges) and add slot offsets; the caller's thread only cuts
batches.  Files are read in file-list order whatever the number of workers.

Epoch mode (``repeat_dataset=False``): one pass over the source, the last batch may hold fewer
than ``batch_size`` samples (as HugeCTR), then :meth:`DataReader.is_eof` is true and
:meth:`DataReader.read_a_batch` returns ``None`` until :meth:`DataReader.set_source` starts a new
pass.  Repeat mode: the source is cycled forever and every batch is full, batches spanning the
end and the start of the source.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial

from tierserve.core.errors import ConfigError
from tierserve.model.batch import Batch

from .errors import DataFileError
from .filelist import read_file_list
from .norm import iter_norm_file, norm_num_records
from .params import Check_t, DataReaderParams, DataReaderSparseParam, DataReaderType_t
from .parquet import ParquetMetadata, find_parquet_metadata, iter_parquet_file, parquet_num_rows
from .raw import raw_num_records, read_raw_records
from .records import Records, SlotLayout
from .shard import BatchShares, Placeholder, take_records

DEFAULT_CHUNK_RECORDS = 16384


@dataclass(frozen=True)
class _Task:
    file: str
    decode: Callable[[], Iterator[tuple[int, Records]]]
    count: Callable[[], int]  # the records decode yields (read from headers, not decoded)
    first: int = 0  # the file's record number of the first of them


class _End:
    pass


_END = _End()


@dataclass(frozen=True)
class _Failure:
    error: BaseException


class _Pipeline:
    """Worker threads decoding tasks ``t`` (worker ``t % W``) into bounded queues."""

    def __init__(
        self,
        tasks: list[_Task],
        layout: SlotLayout,
        workers: int,
        repeat: bool,
        prefetch: int,
        shares: BatchShares | None = None,
    ):
        self.tasks, self.layout, self.repeat, self.shares = tasks, layout, repeat, shares
        self.stop = threading.Event()
        self.queues = [queue.Queue(maxsize=prefetch) for _ in range(workers)]
        self.threads = [
            threading.Thread(target=self._work, args=(w,), daemon=True, name=f"data-reader-{w}")
            for w in range(workers)
        ]
        for thread in self.threads:
            thread.start()

    def _put(self, q: queue.Queue, item) -> bool:
        while not self.stop.is_set():
            try:
                q.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def _work(self, w: int) -> None:
        q, n, step = self.queues[w], len(self.tasks), len(self.queues)
        t = w
        while not self.stop.is_set() and (self.repeat or t < n):
            task = self.tasks[t % n]
            try:
                for first, records in task.decode():
                    records = self.layout.check(records, task.file, first)
                    if self.shares is not None:  # this rank's records only
                        records = take_records(
                            records, self.shares.keep(t, first - task.first, len(records))
                        )
                    if not self._put(q, records):
                        return
            except BaseException as exc:  # handed to the reading thread, raised there
                self._put(q, _Failure(exc))
                return
            if not self._put(q, _END):
                return
            t += step

    def chunks(self) -> Iterator[Records]:
        """Decoded chunks in source order (raises what a worker raised, where it happened)."""
        n, step = len(self.tasks), len(self.queues)
        t = seen = 0
        while self.repeat or t < n:
            q = self.queues[t % step]
            while True:
                item = q.get()
                if item is _END:
                    break
                if isinstance(item, _Failure):
                    raise item.error
                seen += len(item)
                yield item
            t += 1
            if self.repeat and t % n == 0 and self.shares is None:  # (shares: counted up front)
                if not seen:
                    raise DataFileError(self.tasks[0].file, "the source holds no records")
                seen = 0

    def close(self) -> None:
        self.stop.set()
        for q in self.queues:
            while True:
                try:
                    q.get_nowait()
                except queue.Empty:
                    break
        for thread in self.threads:
            thread.join(timeout=5)


_NOT_PEEKED = object()


class DataReader:
    """Reads ``Batch`` objects of ``batch_size`` samples from a Norm, Raw or Parquet source.

    ``source``: a file list (Norm, Parquet) or data file (Raw), or a list of them read one after
    the other.  ``label_dim``, ``dense_dim`` and ``sparse_params`` are the ``Input`` layer's;
    the batch has one :class:`~tierserve.model.batch.SparseInput` per sparse param, over
    consecutive slots.  Keys are always int64 in batches.  Iterating yields the batches of the
    current pass (forever in repeat mode).  Use as a context manager, or call :meth:`close`, to
    stop the reading threads.
    """

    def __init__(
        self,
        data_reader_type: DataReaderType_t | str,
        source: str | os.PathLike | Sequence[str | os.PathLike],
        batch_size: int,
        label_dim: int | Sequence[int],
        dense_dim: int,
        sparse_params: Sequence[DataReaderSparseParam],
        *,
        check_type: Check_t | str = Check_t.Non,
        i64_input_key: bool = False,
        repeat_dataset: bool = False,
        num_samples: int = 0,
        float_label_dense: bool = False,
        slot_size_array: Sequence[int] = (),
        num_workers: int = 12,
        chunk_records: int = DEFAULT_CHUNK_RECORDS,
        prefetch: int = 2,
    ) -> None:
        self.data_reader_type = DataReaderType_t(data_reader_type)
        if self.data_reader_type is DataReaderType_t.RawAsync:
            self.data_reader_type = DataReaderType_t.Raw
        if batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
        if not isinstance(label_dim, int):
            label_dim = sum(label_dim)  # Input's multi-label form: a list of dims
        self.layout = SlotLayout(label_dim, dense_dim, sparse_params, slot_size_array)
        self.batch_size = int(batch_size)
        self.check_type = Check_t(check_type)
        self.i64_input_key = bool(i64_input_key)
        self.repeat_dataset = bool(repeat_dataset)
        self.num_samples = int(num_samples)
        self.float_label_dense = bool(float_label_dense)
        self.num_workers = int(num_workers)
        self.chunk_records = max(1, int(chunk_records))
        self.prefetch = max(1, int(prefetch))
        if self.data_reader_type is DataReaderType_t.Raw:
            for p in self.layout.sparse_params:
                if p.max_nnz != p.slot_num:
                    raise ConfigError(
                        f"Raw data is one-hot; sparse input {p.sparse_name!r} asks for "
                        f"nnz_per_slot {p.nnz_per_slot}"
                    )
        self._source = self._normalize(source)
        self._pipeline: _Pipeline | None = None
        self._shard: tuple[int, int] | None = None
        self._shares: BatchShares | None = None
        self._reset_state()

    # -- public API -----------------------------------------------------------------------

    @property
    def source(self) -> list[str]:
        """The files or file lists of the current source."""
        return list(self._source)

    def shard(self, rank: int, size: int) -> None:
        """Read only rank ``rank`` of ``size``'s share of every global batch of
        ``batch_size`` samples (:mod:`.shard`), from the start of the source: each batch
        holds that share, or a :class:`~.shard.Placeholder` when the share is empty."""
        if not 0 <= rank < size:
            raise ConfigError(f"shard: rank {rank} is not one of {size} ranks")
        self._stop()
        self._shard = None if size == 1 else (int(rank), int(size))
        self._reset_state()

    def start(self) -> None:
        """Start the reading threads now (otherwise the first read starts them)."""
        if self._pipeline is None and self._chunks is None:
            tasks = self._tasks()
            self._shares = None
            if self._shard is not None:
                self._shares = BatchShares(
                    [t.count() for t in tasks], self.batch_size, *self._shard, self.repeat_dataset
                )
                if self.repeat_dataset and not self._shares.total:
                    raise DataFileError(tasks[0].file, "the source holds no records")
            workers = max(1, min(self.num_workers, os.cpu_count() or 1, len(tasks)))
            self._pipeline = _Pipeline(
                tasks, self.layout, workers, self.repeat_dataset, self.prefetch, self._shares
            )
            self._chunks = self._pipeline.chunks()

    def read_a_batch(self) -> Batch | None:
        """The next batch, or ``None`` at the end of the source (epoch mode)."""
        if self._peeked is not _NOT_PEEKED:
            batch, self._peeked = self._peeked, _NOT_PEEKED
            return batch
        return self._next_batch()

    def is_eof(self) -> bool:
        """Whether the current pass is exhausted: the next :meth:`read_a_batch` gives ``None``.

        Always false in repeat mode.
        """
        if self.repeat_dataset:
            return False
        if self._peeked is _NOT_PEEKED:
            self._peeked = self._next_batch()
        return self._peeked is None

    def set_source(self, source: str | os.PathLike | Sequence[str | os.PathLike] = "") -> None:
        """Read ``source`` from its start; ``""`` restarts the current source."""
        self._stop()
        if source not in ("", None, []):
            self._source = self._normalize(source)
        self._reset_state()

    def close(self) -> None:
        """Stop the reading threads and end the pass (:meth:`set_source` starts a new one)."""
        self._stop()
        self._reset_state()
        self._done = True
        self._peeked = None

    def __iter__(self) -> DataReader:
        return self

    def __next__(self) -> Batch:
        batch = self.read_a_batch()
        if batch is None:
            raise StopIteration
        return batch

    def __enter__(self) -> DataReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        pipeline = getattr(self, "_pipeline", None)
        if pipeline is not None:
            pipeline.stop.set()

    # -- internals ------------------------------------------------------------------------

    @staticmethod
    def _normalize(source) -> list[str]:
        items = [source] if isinstance(source, (str, os.PathLike)) else list(source)
        if not items or any(not os.fspath(s) for s in items):
            raise ConfigError("the data source is empty")
        return [os.fspath(s) for s in items]

    def _reset_state(self) -> None:
        self._chunks: Iterator[Records] | None = None
        self._pending: Records | None = None
        self._pos = 0
        self._batches = 0  # global batches handed out this pass (for shares)
        self._done = False
        self._peeked = _NOT_PEEKED

    def _stop(self) -> None:
        if self._pipeline is not None:
            self._pipeline.close()
            self._pipeline = None
        if self._chunks is not None:
            self._chunks.close()

    def _next_batch(self) -> Batch | None:
        if self._done:
            return None
        self.start()
        parts, need, placeholder = [], self.batch_size, False
        if self._shares is not None:
            need, placeholder = self._shares.need(self._batches)
            self._batches += 1
            if not need:  # the pass has ended
                self._done = True
                self._stop()
                return None
        try:
            while need:
                if self._pending is None or self._pos == len(self._pending):
                    self._pending = next(self._chunks, None)
                    self._pos = 0
                    if self._pending is None:
                        break
                take = min(need, len(self._pending) - self._pos)
                parts.append(self._pending.slice(self._pos, self._pos + take))
                self._pos += take
                need -= take
        except BaseException:
            self._done = True
            self._stop()
            raise
        if need:  # the end of the pass
            self._done = True
            self._stop()
            if not parts:
                return None
        batch = self.layout.to_batch(Records.concat(parts))
        if placeholder:
            return Placeholder(batch.label, batch.dense, batch.sparse)
        return batch

    def _tasks(self) -> list[_Task]:
        layout, chunk = self.layout, self.chunk_records
        dims = (layout.label_dim, layout.dense_dim, layout.slot_num)
        tasks: list[_Task] = []
        kind = self.data_reader_type
        for src in self._source:
            if kind is DataReaderType_t.Norm:
                for path in read_file_list(src):
                    decode = partial(
                        iter_norm_file, path, *dims, self.check_type, self.i64_input_key, chunk
                    )
                    tasks.append(_Task(path, decode, partial(norm_num_records, path)))
            elif kind is DataReaderType_t.Parquet:
                by_folder: dict[str, ParquetMetadata] = {}
                for path in read_file_list(src):
                    folder = os.path.dirname(path)
                    if folder not in by_folder:
                        by_folder[folder] = _parquet_metadata(path, src, dims)
                    metadata = by_folder[folder]
                    tasks.append(
                        _Task(
                            path,
                            partial(iter_parquet_file, path, metadata, chunk),
                            partial(parquet_num_rows, path),
                        )
                    )
            else:
                if self.num_samples and len(self._source) > 1:
                    raise ConfigError("num_samples applies to a single Raw file, not a list")
                total = raw_num_records(src, *dims, self.num_samples)
                for start in range(0, total, chunk):
                    stop = min(total, start + chunk)
                    read = partial(
                        read_raw_records, src, start, stop, *dims, self.float_label_dense
                    )
                    tasks.append(
                        _Task(src, partial(_single, start, read), partial(int, stop - start), start)
                    )
        if not tasks:
            raise DataFileError(self._source[0], "the source holds no records")
        return tasks


def _parquet_metadata(data_file: str, file_list: str, dims: tuple[int, int, int]):
    """The ``_metadata.json`` of a data file, checked against the reader's dimensions."""
    metadata = find_parquet_metadata(data_file, file_list)
    found = (len(metadata.labels), len(metadata.conts), len(metadata.cats))
    if found != dims:
        raise DataFileError(
            metadata.source,
            f"labels/conts/cats have {found[0]}/{found[1]}/{found[2]} columns, the "
            f"reader expects label_dim/dense_dim/slots {dims[0]}/{dims[1]}/{dims[2]}",
        )
    return metadata


def _single(first: int, read: Callable[[], Records]) -> Iterator[tuple[int, Records]]:
    yield first, read()


def create_data_reader(
    params: DataReaderParams,
    batch_size: int,
    label_dim: int | Sequence[int],
    dense_dim: int,
    sparse_params: Sequence[DataReaderSparseParam],
    *,
    i64_input_key: bool = False,
    repeat_dataset: bool = False,
    eval: bool = False,
    **options,
) -> DataReader:
    """The train (or, with ``eval=True``, the evaluation) reader that ``params`` describe.

    ``i64_input_key`` and ``repeat_dataset`` are the solver's settings; ``options``
    (``chunk_records``, ``prefetch``, ``num_workers``) override reading details.
    """
    source = params.eval_source if eval else params.source
    if not source:
        raise ConfigError(f"DataReaderParams has no {'eval_source' if eval else 'source'}")
    kwargs = dict(
        check_type=params.check_type,
        i64_input_key=i64_input_key,
        repeat_dataset=repeat_dataset,
        num_samples=params.eval_num_samples if eval else params.num_samples,
        float_label_dense=params.float_label_dense,
        slot_size_array=params.slot_size_array,
        num_workers=params.num_workers,
    )
    kwargs.update(options)
    return DataReader(
        params.data_reader_type, source, batch_size, label_dim, dense_dim, sparse_params, **kwargs
    )
