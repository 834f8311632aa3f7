"""``tf.data``-style streaming datasets: lazy, bounded in memory, numpy elements.

A :class:`Dataset` is a recipe; iterating it (``for element in ds``) runs the pipeline and
yields elements as numpy values: an element is a structure (a value, or nested tuples, lists
and dicts of values) of arrays.  After :meth:`Dataset.batch`, an element is a batch whose
arrays have the batch as first dimension, which is what an Estimator ``input_fn`` returns.

Inside, rows travel in blocks (one array per leaf of the structure, first dimension = rows)
and every stage is pulled for at most as many rows as the stage after it needs, so a pipeline
holds at most what its buffers hold: ``shuffle(B).batch(b)`` over a file of any size keeps at
most ``B + b`` rows; ``prefetch(n)`` adds up to ``n + 1`` elements (its queue and the one
waiting to go in).  Shuffling, batching, sharding and slicing are numpy operations on
blocks; :meth:`Dataset.map` calls its function once per element as ``tf.data`` does (batch
first, then map, to call it once per batch).

Text lines remember their file and line number, so :func:`decode_csv` errors raised inside a
``map`` name the file and line of the bad record.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from tierserve.core.errors import InvalidInputError

from .dataset_blocks import (
    _LEAF,
    CHUNK,
    Tree,
    _as_array,
    _batched,
    _Block,
    _block_from_slices,
    _BlockIter,
    _Exact,
    _flatten,
    _GenIter,
    _graft,
    _SliceIter,
    _stack,
)
from .iterator import (  # noqa: F401 - NextFeatures, NextValue, OutOfRangeError re-exported
    NextFeatures,
    NextValue,
    OneShotIterator,
    OutOfRangeError,
)
from .sources import GeneratorSource, ListFiles
from .stages import (
    DatasetBase,
    _FlatMapIter,
    _InterleaveIter,
    _MapIter,
    _PrefetchIter,
    _ShuffleIter,
)
from .structure import _call

AUTOTUNE = -1
"""``tf.data.AUTOTUNE``: let the pipeline pick a buffer size or parallelism."""

_AUTOTUNE_PREFETCH_ROWS = 1024  # prefetch(AUTOTUNE) of unbatched elements
_AUTOTUNE_PREFETCH_BATCHES = 2  # prefetch(AUTOTUNE) of batches

# -- datasets ------------------------------------------------------------------------------


class Dataset(DatasetBase):
    """A lazy sequence of elements (``tf.data.Dataset``); iterate it for numpy elements."""

    _element_rows = 1  # input rows per element (batch sizes multiply), to size pulls

    # construction ----------------------------------------------------------------------

    @staticmethod
    def from_tensor_slices(tensors: Any) -> Dataset:
        """One element per row of ``tensors`` (arrays, lists, or tuples/dicts of them)."""
        return _SlicesDataset(_block_from_slices(tensors))

    @staticmethod
    def from_tensors(tensors: Any) -> Dataset:
        """A dataset of the single element ``tensors``."""
        leaves, tree = _flatten(tensors, lists_are_values=True)
        return _SlicesDataset(_Block(tree, [_as_array(x)[None] for x in leaves]))

    @staticmethod
    def range(*args: int) -> Dataset:
        """int64 elements as Python's ``range(start, stop, step)``."""
        return _SlicesDataset(_Block(_LEAF, [np.arange(*args, dtype=np.int64)]))

    @staticmethod
    def from_generator(
        generator: Callable[..., Iterable[Any]],
        output_types: Any = None,
        output_shapes: Any = None,
        args: Sequence[Any] | None = None,
    ) -> Dataset:
        """Elements of ``generator(*args)``, called anew for each iteration.

        ``output_types`` (numpy dtypes, in the elements' structure) casts each component;
        ``output_shapes`` (tuples with None for any size) checks each element's shapes.
        """
        return _CallableDataset(
            GeneratorSource(generator, output_types, output_shapes, tuple(args or ())).blocks)

    @staticmethod
    def from_batches(generator: Callable[[], Iterable[Any]]) -> Dataset:
        """The rows of the batches ``generator()`` yields (structures of arrays sharing a first
        dimension), called anew for each iteration; no per-row Python work."""
        if not callable(generator):
            raise InvalidInputError("from_batches needs a callable that returns an iterable")

        def blocks() -> Iterator[_Block]:
            for batch in generator():
                yield _block_from_slices(batch)

        return _CallableDataset(lambda: _GenIter(blocks()))

    @staticmethod
    def list_files(
        file_pattern: str | os.PathLike | Sequence[str | os.PathLike],
        shuffle: bool | None = None,
        seed: int | None = None,
    ) -> Dataset:
        """The files matching ``file_pattern`` (a glob or a list of globs), as str elements.

        ``shuffle`` (default True, as in TensorFlow) orders the files anew on each iteration;
        ``False`` gives them sorted.  No matching file is an error naming the pattern.
        """
        return _CallableDataset(
            ListFiles(file_pattern, True if shuffle is None else bool(shuffle), seed).blocks)

    @staticmethod
    def zip(datasets: Any) -> Dataset:
        """Elements of several datasets side by side, in their structure; ends with the shortest."""
        parts, tree = _flatten(datasets)
        for p in parts:
            if not isinstance(p, Dataset):
                raise InvalidInputError(f"Dataset.zip takes datasets, got {type(p).__name__}")
        return _ZipDataset(parts, tree)

    # transformations -------------------------------------------------------------------

    def map(
        self,
        map_func: Callable[..., Any],
        num_parallel_calls: int | None = None,
        deterministic: bool | None = None,
    ) -> Dataset:
        """``map_func(element)`` for each element (a tuple element is passed as arguments).

        ``num_parallel_calls`` (an int or ``AUTOTUNE``) calls it from that many threads,
        keeping the order whatever ``deterministic`` says.
        """
        if num_parallel_calls not in (None, AUTOTUNE) and int(num_parallel_calls) < 1:
            raise InvalidInputError(
                f"map: num_parallel_calls must be >= 1 or AUTOTUNE, got {num_parallel_calls}"
            )
        return _MapDataset(self, map_func, num_parallel_calls)

    def flat_map(self, map_func: Callable[..., Dataset]) -> Dataset:
        """The elements of the dataset ``map_func(element)`` returns, for each element in turn."""
        return _FlatMapDataset(self, map_func)

    def interleave(
        self,
        map_func: Callable[..., Dataset],
        cycle_length: int | None = None,
        block_length: int | None = None,
        num_parallel_calls: int | None = None,
        deterministic: bool | None = None,
    ) -> Dataset:
        """The datasets ``map_func(element)`` returns, ``cycle_length`` of them open at once,
        ``block_length`` elements from each in turn (TensorFlow's order).

        ``cycle_length`` None or ``AUTOTUNE``: the number of CPUs.  ``num_parallel_calls``
        (an int or ``AUTOTUNE``) reads each open dataset ahead in its own thread, a block at a
        time; the order stays TensorFlow's deterministic one whatever ``deterministic`` says.
        """
        cycle = os.cpu_count() or 1 if cycle_length in (None, AUTOTUNE) else int(cycle_length)
        block = 1 if block_length is None else int(block_length)
        if cycle < 1:
            raise InvalidInputError(f"interleave: cycle_length must be >= 1, got {cycle_length}")
        if block < 1:
            raise InvalidInputError(f"interleave: block_length must be >= 1, got {block_length}")
        if num_parallel_calls not in (None, AUTOTUNE) and int(num_parallel_calls) < 1:
            raise InvalidInputError(
                f"interleave: num_parallel_calls must be >= 1 or AUTOTUNE, got {num_parallel_calls}"
            )
        parallel = num_parallel_calls is not None and num_parallel_calls != 1
        return _InterleaveDataset(self, map_func, cycle, block, parallel)

    def filter(self, predicate: Callable[..., Any]) -> Dataset:
        """The elements for which ``predicate(element)`` is true."""
        return _FilterDataset(self, predicate)

    def shuffle(
        self,
        buffer_size: int,
        seed: int | None = None,
        reshuffle_each_iteration: bool | None = None,
    ) -> Dataset:
        """Elements drawn at random from a buffer of the next ``buffer_size`` elements."""
        if int(buffer_size) < 1:
            raise InvalidInputError(f"shuffle: buffer_size must be >= 1, got {buffer_size}")
        reshuffle = True if reshuffle_each_iteration is None else bool(reshuffle_each_iteration)
        return _ShuffleDataset(self, int(buffer_size), seed, reshuffle)

    def repeat(self, count: int | None = None) -> Dataset:
        """The elements ``count`` times over (None or -1: forever)."""
        if count is not None and int(count) < -1:
            raise InvalidInputError(f"repeat: count must be >= -1, got {count}")
        return _RepeatDataset(self, None if count is None or int(count) == -1 else int(count))

    def batch(self, batch_size: int, drop_remainder: bool = False) -> Dataset:
        """Consecutive elements stacked into batches; the last, smaller one is kept unless
        ``drop_remainder``."""
        if int(batch_size) < 1:
            raise InvalidInputError(f"batch: batch_size must be >= 1, got {batch_size}")
        return _BatchDataset(self, int(batch_size), bool(drop_remainder))

    def unbatch(self) -> Dataset:
        """Each batch split back into its elements."""
        return _UnbatchDataset(self)

    def prefetch(self, buffer_size: int) -> Dataset:
        """Elements prepared ahead by a background thread, at most ``buffer_size`` of them
        (``AUTOTUNE``: two batches, or 1024 unbatched elements)."""
        if buffer_size != AUTOTUNE and int(buffer_size) < 0:
            raise InvalidInputError(
                f"prefetch: buffer_size must be >= 0 or AUTOTUNE, got {buffer_size}"
            )
        if buffer_size == 0:
            return self
        return _PrefetchDataset(self, int(buffer_size))

    def take(self, count: int) -> Dataset:
        """The first ``count`` elements (-1: all)."""
        return _TakeSkipDataset(self, int(count), take=True)

    def skip(self, count: int) -> Dataset:
        """All but the first ``count`` elements (-1: none)."""
        return _TakeSkipDataset(self, int(count), take=False)

    def shard(self, num_shards: int, index: int) -> Dataset:
        """Every ``num_shards``-th element starting at ``index`` (worker ``index``'s part)."""
        num_shards, index = int(num_shards), int(index)
        if num_shards < 1:
            raise InvalidInputError(f"shard: num_shards must be >= 1, got {num_shards}")
        if not 0 <= index < num_shards:
            raise InvalidInputError(
                f"shard: index must be in [0, num_shards={num_shards}), got {index}"
            )
        return _ShardDataset(self, num_shards, index)

    def concatenate(self, dataset: Dataset) -> Dataset:
        """This dataset's elements, then ``dataset``'s."""
        return _ConcatDataset(self, dataset)

    # iteration -------------------------------------------------------------------------

    def _blocks(self) -> _BlockIter:
        raise NotImplementedError

    def _demand(self) -> int:
        return 1 if self._element_rows > 1 else CHUNK

    def __iter__(self) -> Iterator[Any]:
        stream = self._blocks()
        demand = self._demand()
        try:
            while True:
                block = stream.pull(demand)
                if block is None:
                    return
                for i in range(len(block)):
                    yield block.element(i)
        finally:
            stream.close()

    def as_numpy_iterator(self) -> Iterator[Any]:
        """An iterator over the elements (they are numpy values already)."""
        return iter(self)

    def make_one_shot_iterator(self) -> OneShotIterator:
        """TF1's iterator: :meth:`OneShotIterator.get_next` gives the next element (see
        :mod:`.iterator`)."""
        return OneShotIterator(self)


class _SlicesDataset(Dataset):
    def __init__(self, block: _Block) -> None:
        self.block = block

    def _blocks(self) -> _BlockIter:
        return _SliceIter(self.block)


class _CallableDataset(Dataset):
    def __init__(self, make: Callable[[], _BlockIter]) -> None:
        self.make = make

    def _blocks(self) -> _BlockIter:
        return self.make()


class _MapDataset(Dataset):
    def __init__(self, upstream: Dataset, fn, num_parallel_calls) -> None:
        self.upstream, self.fn = upstream, fn
        self.threads = None
        if num_parallel_calls is not None:
            n = os.cpu_count() or 1 if num_parallel_calls == AUTOTUNE else int(num_parallel_calls)
            self.threads = n if n > 1 else None
        self._element_rows = upstream._element_rows

    def _blocks(self) -> _BlockIter:
        return _MapIter(self, self.upstream._blocks())


class _FilterDataset(Dataset):
    def __init__(self, upstream: Dataset, predicate) -> None:
        self.upstream, self.predicate = upstream, predicate
        self._element_rows = upstream._element_rows

    def _blocks(self) -> _BlockIter:
        upstream, predicate = self.upstream._blocks(), self.predicate

        class It(_BlockIter):
            def pull(self, max_rows: int) -> _Block | None:
                while True:
                    block = upstream.pull(max_rows)
                    if block is None:
                        return None
                    keep = np.array(
                        [bool(_call(predicate, block.element(i))) for i in range(len(block))],
                        dtype=bool,
                    )
                    if keep.any():
                        return block.take(np.flatnonzero(keep))

            def close(self) -> None:
                upstream.close()

        return It()


class _InterleaveDataset(Dataset):
    def __init__(self, upstream: Dataset, fn, cycle: int, block: int, parallel: bool) -> None:
        self.upstream, self.fn = upstream, fn
        self.cycle, self.block, self.parallel = cycle, block, parallel

    def _blocks(self) -> _BlockIter:
        return _InterleaveIter(
            self.upstream._blocks(), self.fn, self.cycle, self.block, self.parallel
        )


class _FlatMapDataset(Dataset):
    def __init__(self, upstream: Dataset, fn) -> None:
        self.upstream, self.fn = upstream, fn

    def _blocks(self) -> _BlockIter:
        return _FlatMapIter(self.upstream._blocks(), self.fn)


class _ShuffleDataset(Dataset):
    def __init__(self, upstream: Dataset, buffer_size: int, seed, reshuffle: bool) -> None:
        self.upstream, self.buffer_size = upstream, buffer_size
        self.seed, self.reshuffle = seed, reshuffle
        self.seeds = np.random.default_rng(seed)
        self.fixed = int(self.seeds.integers(2**63))
        self.iterations = 0
        self.lock = threading.Lock()
        self._element_rows = upstream._element_rows

    def _blocks(self) -> _BlockIter:
        with self.lock:  # the first iteration uses the first seed drawn, later ones the next
            seed = self.fixed
            if self.reshuffle and self.iterations:
                seed = int(self.seeds.integers(2**63))
            self.iterations += 1
        return _ShuffleIter(self.upstream._blocks(), self.buffer_size, np.random.default_rng(seed))


class _RepeatDataset(Dataset):
    def __init__(self, upstream: Dataset, count: int | None) -> None:
        self.upstream, self.count = upstream, count
        self._element_rows = upstream._element_rows

    def _blocks(self) -> _BlockIter:
        upstream, count = self.upstream, self.count

        class It(_BlockIter):
            def __init__(self) -> None:
                self.epoch, self.rows, self.cur = 0, 0, None

            def pull(self, max_rows: int) -> _Block | None:
                while count is None or self.epoch < count:
                    if self.cur is None:
                        self.cur, self.rows = upstream._blocks(), 0
                    block = self.cur.pull(max_rows)
                    if block is not None:
                        self.rows += len(block)
                        return block
                    self.cur.close()
                    self.cur = None
                    self.epoch += 1
                    if self.rows == 0:  # an empty dataset repeated is empty
                        return None
                return None

            def close(self) -> None:
                if self.cur is not None:
                    self.cur.close()

        return It()


class _BatchDataset(Dataset):
    def __init__(self, upstream: Dataset, batch_size: int, drop_remainder: bool) -> None:
        self.upstream, self.batch_size, self.drop = upstream, batch_size, drop_remainder
        self._element_rows = upstream._element_rows * batch_size

    def _blocks(self) -> _BlockIter:
        upstream, b, drop = _Exact(self.upstream._blocks()), self.batch_size, self.drop

        class It(_BlockIter):
            def __init__(self) -> None:
                self.tail: _Block | None = None

            def pull(self, max_rows: int) -> _Block | None:
                if self.tail is not None:
                    out, self.tail = self.tail, None
                    return out
                rows = upstream.pull(max_rows * b)
                if rows is None:
                    return None
                full = len(rows) // b * b
                if full < len(rows) and not drop:
                    self.tail = _stack(rows.slice(full, len(rows)))
                if full == 0:
                    out, self.tail = self.tail, None
                    return out
                return _batched(rows.slice(0, full), b)

            def close(self) -> None:
                upstream.close()

        return It()


class _UnbatchDataset(Dataset):
    def __init__(self, upstream: Dataset) -> None:
        self.upstream = upstream

    def _blocks(self) -> _BlockIter:
        upstream = self.upstream._blocks()

        class It(_BlockIter):
            def __init__(self) -> None:
                self.rows: _Block | None = None
                self.pos = 0

            def pull(self, max_rows: int) -> _Block | None:
                while self.rows is None or self.pos >= len(self.rows):
                    block = upstream.pull(1)
                    if block is None:
                        return None
                    for a in block.leaves:
                        if a.ndim < 2:
                            raise InvalidInputError(
                                "unbatch: every component must have a batch dimension"
                            )
                    self.rows = block._rebuild(
                        [a.reshape((-1,) + a.shape[2:]) for a in block._arrays()]
                    )
                    self.pos = 0
                out = self.rows.slice(self.pos, self.pos + max_rows)
                self.pos += len(out)
                return out

            def close(self) -> None:
                upstream.close()

        return It()


class _TakeSkipDataset(Dataset):
    def __init__(self, upstream: Dataset, count: int, take: bool) -> None:
        self.upstream, self.count, self.is_take = upstream, count, take
        self._element_rows = upstream._element_rows

    def _blocks(self) -> _BlockIter:
        upstream, count, is_take = self.upstream._blocks(), self.count, self.is_take

        class It(_BlockIter):
            def __init__(self) -> None:
                self.seen = 0

            def pull(self, max_rows: int) -> _Block | None:
                if is_take:
                    if count >= 0:
                        if self.seen >= count:
                            return None
                        max_rows = min(max_rows, count - self.seen)
                    block = upstream.pull(max_rows)
                    if block is not None:
                        self.seen += len(block)
                    return block
                if count < 0:
                    return None
                while self.seen < count:
                    block = upstream.pull(min(CHUNK, count - self.seen))
                    if block is None:
                        return None
                    self.seen += len(block)
                return upstream.pull(max_rows)

            def close(self) -> None:
                upstream.close()

        return It()


class _ShardDataset(Dataset):
    def __init__(self, upstream: Dataset, num_shards: int, index: int) -> None:
        self.upstream, self.num_shards, self.index = upstream, num_shards, index
        self._element_rows = upstream._element_rows

    def _blocks(self) -> _BlockIter:
        upstream, n, index = self.upstream._blocks(), self.num_shards, self.index

        class It(_BlockIter):
            def __init__(self) -> None:
                self.seen = 0

            def pull(self, max_rows: int) -> _Block | None:
                while True:
                    block = upstream.pull(max_rows * n)
                    if block is None:
                        return None
                    first = (index - self.seen) % n
                    self.seen += len(block)
                    if first < len(block):
                        return block.take(np.arange(first, len(block), n))

            def close(self) -> None:
                upstream.close()

        return It()


class _ConcatDataset(Dataset):
    def __init__(self, first: Dataset, second: Dataset) -> None:
        self.parts = (first, second)
        self._element_rows = max(first._element_rows, second._element_rows)

    def _blocks(self) -> _BlockIter:
        parts = self.parts
        return _FlatMapIter(_SliceIter(_Block(_LEAF, [np.arange(2)])), lambda i: parts[int(i)])


class _ZipDataset(Dataset):
    def __init__(self, parts: list[Dataset], tree: Tree) -> None:
        self.parts, self.tree = parts, tree
        self._element_rows = max(p._element_rows for p in parts)

    def _blocks(self) -> _BlockIter:
        streams = [_Exact(p._blocks()) for p in self.parts]
        tree = self.tree

        class It(_BlockIter):
            def pull(self, max_rows: int) -> _Block | None:
                blocks = [s.pull(max_rows) for s in streams]
                if any(b is None for b in blocks):
                    return None
                n = min(len(b) for b in blocks)
                leaves, subtrees = [], []
                for b in blocks:
                    leaves.extend(a[:n] for a in b.leaves)
                    subtrees.append(b.tree)
                return _Block(_graft(tree, subtrees), leaves)

            def close(self) -> None:
                for s in streams:
                    s.close()

        return It()


class _PrefetchDataset(Dataset):
    def __init__(self, upstream: Dataset, buffer_size: int) -> None:
        self.upstream, self.buffer_size = upstream, buffer_size
        self._element_rows = upstream._element_rows

    def _blocks(self) -> _BlockIter:
        batched = self._element_rows > 1
        if self.buffer_size == AUTOTUNE:
            size = _AUTOTUNE_PREFETCH_BATCHES if batched else _AUTOTUNE_PREFETCH_ROWS
        else:
            size = self.buffer_size
        per_item = 1 if batched else min(size, CHUNK)
        return _PrefetchIter(self.upstream._blocks(), per_item, max(1, size // per_item))


