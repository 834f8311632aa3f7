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

import itertools
import os
import queue
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from tierserve.core.errors import InvalidInputError

from .csv_decode import CSVRecordError, DecodeCSVError
from .dataset_blocks import (
    _LEAF,
    CHUNK,
    Tree,
    _as_array,
    _Block,
    _block_from_elements,
    _block_from_slices,
    _BlockIter,
    _Exact,
    _flatten,
    _GenIter,
    _SliceIter,
)
from .iterator import (  # noqa: F401 - NextFeatures, NextValue, OutOfRangeError re-exported
    NextFeatures,
    NextValue,
    OneShotIterator,
    OutOfRangeError,
)

AUTOTUNE = -1
"""``tf.data.AUTOTUNE``: let the pipeline pick a buffer size or parallelism."""

_AUTOTUNE_PREFETCH_ROWS = 1024  # prefetch(AUTOTUNE) of unbatched elements
_AUTOTUNE_PREFETCH_BATCHES = 2  # prefetch(AUTOTUNE) of batches

# -- datasets ------------------------------------------------------------------------------


class Dataset:
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
        return _GeneratorDataset(generator, output_types, output_shapes, tuple(args or ()))

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
        from .text_lines import ListFilesDataset

        return ListFilesDataset(file_pattern, True if shuffle is None else bool(shuffle), seed)

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


class _GeneratorDataset(Dataset):
    def __init__(self, generator, output_types, output_shapes, args) -> None:
        if not callable(generator):
            raise InvalidInputError("from_generator needs a callable that returns an iterable")
        self.generator, self.args = generator, args
        self.types = None if output_types is None else _flatten(output_types)[0]
        self.shapes = None
        if output_shapes is not None:
            self.shapes = (_flatten_shapes(output_shapes) if output_types is None
                           else _shapes_up_to(output_types, output_shapes))

    def _blocks(self) -> _BlockIter:
        source = iter(self.generator(*self.args))

        def blocks() -> Iterator[_Block]:
            while True:
                chunk = list(itertools.islice(source, CHUNK))
                if not chunk:
                    return
                block = _block_from_elements(chunk, lists_are_values=True)
                yield self._checked(block)

        return _GenIter(blocks())

    def _checked(self, block: _Block) -> _Block:
        if self.types is not None:
            if len(self.types) != len(block.leaves):
                raise InvalidInputError(
                    f"from_generator: output_types has {len(self.types)} components, the "
                    f"generator's elements have {len(block.leaves)}"
                )
            block.leaves = [
                leaf.astype(_numpy_dtype(t, "output_types"))
                for leaf, t in zip(block.leaves, self.types)
            ]
        if self.shapes is not None:
            for j, (leaf, shape) in enumerate(zip(block.leaves, self.shapes)):
                if shape is None:
                    continue
                got = leaf.shape[1:]
                if len(got) != len(shape) or any(
                    s is not None and s != g for s, g in zip(shape, got)
                ):
                    raise InvalidInputError(
                        f"from_generator: component {j} has shape {got}, output_shapes says {shape}"
                    )
        return block


def _as_shape(x: Any, where: str) -> tuple | None:
    """One component's shape as TensorFlow reads it: an int is a 1-D shape (``4`` ->
    ``(4,)``), None any shape, a tuple/list of ints and Nones the shape itself."""
    if x is None:
        return None
    if isinstance(x, (int, np.integer)) and not isinstance(x, bool):
        return (int(x),)
    if isinstance(x, (tuple, list)) and all(v is None or isinstance(v, (int, np.integer))
                                           for v in x):
        return tuple(None if v is None else int(v) for v in x)
    raise InvalidInputError(f"output_shapes{where}: {x!r} is not a shape")


def _shapes_up_to(types: Any, shapes: Any, where: str = "") -> list[tuple | None]:
    """``shapes`` read in the structure of ``types`` (TensorFlow's ``map_structure_up_to``):
    with ``output_types=(tf.float32, tf.int32)``, ``output_shapes=(4, 1)`` is two shapes,
    ``(4,)`` and ``(1,)``."""
    if isinstance(types, dict):
        if not isinstance(shapes, dict) or set(shapes) != set(types):
            raise InvalidInputError(f"output_shapes{where} must be a dict with the keys of "
                                    f"output_types {sorted(types)}, got {shapes!r}")
        return [s for k in types for s in _shapes_up_to(types[k], shapes[k], f"{where}[{k!r}]")]
    if isinstance(types, (tuple, list)):
        if not isinstance(shapes, (tuple, list)) or len(shapes) != len(types):
            raise InvalidInputError(f"output_shapes{where} must have {len(types)} components "
                                    f"as output_types does, got {shapes!r}")
        return [s for i, (t, sh) in enumerate(zip(types, shapes))
                for s in _shapes_up_to(t, sh, f"{where}[{i}]")]
    return [_as_shape(shapes, where)]


def _flatten_shapes(shapes: Any) -> list[tuple]:
    def is_shape(x: Any) -> bool:
        return isinstance(x, (tuple, list)) and all(v is None or isinstance(v, int) for v in x)

    out: list[tuple] = []

    def walk(x: Any) -> None:
        if is_shape(x):
            out.append(tuple(x))
        elif isinstance(x, dict):
            for v in x.values():
                walk(v)
        elif isinstance(x, (tuple, list)):
            for v in x:
                walk(v)
        else:
            raise InvalidInputError(f"output_shapes: {x!r} is not a shape")

    walk(shapes)
    return out


def _numpy_dtype(value: Any, what: str) -> np.dtype:
    if value in (str, "string"):
        return np.dtype(str)
    try:
        return np.dtype(getattr(value, "as_numpy_dtype", value))
    except TypeError:
        raise InvalidInputError(f"{what}: {value!r} is not a dtype") from None


def _call(fn: Callable[..., Any], element: Any) -> Any:
    if isinstance(element, tuple):
        return fn(*element)
    return fn(element)


def _located(exc: DecodeCSVError, prov) -> BaseException:
    """``exc`` with the file and line of the bad record, when the element came from text."""
    if prov is None:
        return exc
    files, lines = prov
    files, lines = np.asarray(files, dtype=object), np.asarray(lines)
    i = 0 if exc.record is None else exc.record
    if lines.ndim == 0:
        path, line = files.item(), int(lines)
    elif i < lines.size:
        path, line = files.reshape(-1)[i], int(lines.reshape(-1)[i])
    else:
        return exc
    return CSVRecordError(path, line, exc.problem, column=exc.column)


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


class _MapIter(_BlockIter):
    def __init__(self, ds: _MapDataset, upstream: _BlockIter) -> None:
        self.ds, self.upstream = ds, upstream
        self.pool = ThreadPoolExecutor(ds.threads, "dataset-map") if ds.threads else None

    def _one(self, block: _Block, i: int) -> Any:
        try:
            return _call(self.ds.fn, block.element(i))
        except DecodeCSVError as exc:
            raise _located(exc, block.element_prov(i)) from None

    def pull(self, max_rows: int) -> _Block | None:
        block = self.upstream.pull(max_rows)
        if block is None:
            return None
        if self.pool is not None:
            outs = list(self.pool.map(lambda i: self._one(block, i), range(len(block))))
        else:
            outs = [self._one(block, i) for i in range(len(block))]
        return _block_from_elements(outs, block.prov)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=False)
        self.upstream.close()


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


class _FlatMapIter(_BlockIter):
    def __init__(self, outer: _BlockIter, fn: Callable[[Any], Dataset], where: str = "flat_map"):
        self.outer, self.fn, self.where = outer, fn, where
        self.inner: _BlockIter | None = None

    def pull(self, max_rows: int) -> _Block | None:
        while True:
            if self.inner is None:
                block = self.outer.pull(1)
                if block is None:
                    return None
                ds = _call(self.fn, block.element(0))
                if not isinstance(ds, Dataset):
                    raise InvalidInputError(
                        f"{self.where}: the function must return a Dataset, got {type(ds).__name__}"
                    )
                self.inner = ds._blocks()
            out = self.inner.pull(max_rows)
            if out is not None:
                return out
            self.inner.close()
            self.inner = None

    def close(self) -> None:
        if self.inner is not None:
            self.inner.close()
        self.outer.close()


class _InterleaveDataset(Dataset):
    def __init__(self, upstream: Dataset, fn, cycle: int, block: int, parallel: bool) -> None:
        self.upstream, self.fn = upstream, fn
        self.cycle, self.block, self.parallel = cycle, block, parallel

    def _blocks(self) -> _BlockIter:
        return _InterleaveIter(
            self.upstream._blocks(), self.fn, self.cycle, self.block, self.parallel
        )


class _InterleaveIter(_BlockIter):
    """TensorFlow's interleave: slots opened as the cycle reaches them, ``block`` rows from
    the current slot, then the next slot; an exhausted slot is left, and refilled from the
    input when the cycle comes back to it.  While every slot is open and has whole rounds
    of rows, several rounds are cut at once with one reshape."""

    def __init__(self, outer: _BlockIter, fn, cycle: int, block: int, parallel: bool) -> None:
        self.outer, self.fn, self.cycle, self.block, self.parallel = (
            outer,
            fn,
            cycle,
            block,
            parallel,
        )
        self.slots: list[_Exact | None] = [None] * cycle
        self.index = 0  # the current slot
        self.taken = 0  # rows taken from it in this turn
        self.input_done = False

    def _open(self, i: int) -> bool:
        block = self.outer.pull(1)
        if block is None:
            self.input_done = True
            return False
        ds = _call(self.fn, block.element(0))
        if not isinstance(ds, Dataset):
            raise InvalidInputError(
                f"interleave: the function must return a Dataset, got {type(ds).__name__}"
            )
        inner = ds._blocks()
        if self.parallel:
            inner = _PrefetchIter(inner, ds._demand(), 1)
        self.slots[i] = _Exact(inner)
        return True

    def _advance(self) -> None:
        self.index, self.taken = (self.index + 1) % self.cycle, 0

    def pull(self, max_rows: int) -> _Block | None:
        parts, need = [], max_rows
        while need > 0:
            if self.taken == 0 and self.index == 0 and need >= self.cycle * self.block:
                rounds = self._rounds(need // (self.cycle * self.block))
                if rounds is not None:
                    parts.append(rounds)
                    need -= len(rounds)
                    continue
            slot = self.slots[self.index]
            if slot is None:
                if self.input_done or not self._open(self.index):
                    if all(s is None for s in self.slots):
                        break
                    self._advance()
                continue
            rows = slot.pull(min(self.block - self.taken, need))
            if rows is None:  # this dataset ended: leave the slot, go on
                slot.close()
                self.slots[self.index] = None
                self._advance()
                continue
            parts.append(rows)
            need -= len(rows)
            self.taken += len(rows)
            if self.taken == self.block:
                self._advance()
        return _Block.concat(parts) if parts else None

    def _rounds(self, k: int) -> _Block | None:
        """``k`` whole rounds at once, or None (rows pulled go back) when a slot is not open
        or has fewer rows."""
        if any(s is None for s in self.slots):
            return None
        got = []
        for slot in self.slots:
            rows = slot.pull(k * self.block)
            got.append(rows)
            if rows is None or len(rows) < k * self.block:
                break
        else:
            first = got[0]
            if all(g.tree == first.tree for g in got):
                arrays = []
                for parts in zip(*(g._arrays() for g in got)):
                    if len({p.shape[1:] for p in parts}) > 1:
                        break
                    stacked = np.stack(parts).reshape(
                        (self.cycle, k, self.block) + parts[0].shape[1:]
                    )
                    arrays.append(stacked.swapaxes(0, 1).reshape((-1,) + parts[0].shape[1:]))
                else:
                    if all((g.prov is None) == (first.prov is None) for g in got):
                        return first._rebuild(arrays)
        for slot, rows in zip(self.slots, got):  # give back what was pulled
            if rows is not None:
                slot.pending = rows if slot.pending is None else _Block.concat([rows, slot.pending])
        return None

    def close(self) -> None:
        for slot in self.slots:
            if slot is not None:
                slot.close()
        self.outer.close()


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


class _ShuffleIter(_BlockIter):
    """TensorFlow's shuffle buffer, a block of rows at a time.

    Each input row takes the place of a row drawn uniformly from the buffer, which is output;
    when several rows of one block draw the same place, the later one outputs the earlier
    one's row, exactly as one row at a time would.
    """

    def __init__(self, upstream: _BlockIter, size: int, rng: np.random.Generator) -> None:
        self.upstream, self.size, self.rng = _Exact(upstream), size, rng
        self.buf: _Block | None = None
        self.draining: _Block | None = None
        self.pos = 0
        self.done = False

    def pull(self, max_rows: int) -> _Block | None:
        if self.done:
            return None
        if self.draining is not None:  # the input ended: the buffer in a random order
            if self.pos >= len(self.draining):
                self.done, self.draining = True, None
                return None
            out = self.draining.slice(self.pos, self.pos + max_rows)
            self.pos += len(out)
            return out
        if self.buf is None:  # fill the buffer first
            self.buf = self.upstream.pull(self.size)
            if self.buf is None:
                self.done = True
                return None
            self.buf = self.buf.take(np.arange(len(self.buf)))  # own copy, writable
        incoming = None if len(self.buf) < self.size else self.upstream.pull(max_rows)
        if incoming is None:
            self.draining = self.buf.take(self.rng.permutation(len(self.buf)))
            self.pos = 0
            return self.pull(max_rows)
        return self._exchange(incoming)

    def _exchange(self, incoming: _Block) -> _Block:
        buf, m = self.buf, len(incoming)
        if incoming.tree != buf.tree:
            _Block.concat([buf.slice(0, 0), incoming.slice(0, 0)])  # raises the structure error
        slots = self.rng.integers(0, self.size, m)
        order = np.argsort(slots, kind="stable")
        sorted_slots = slots[order]
        first = np.empty(m, dtype=bool)
        first[0] = True
        first[1:] = sorted_slots[1:] != sorted_slots[:-1]
        last = np.empty(m, dtype=bool)
        last[-1] = True
        last[:-1] = first[1:]
        if (buf.prov is None) != (incoming.prov is None):  # mixed sources: no line numbers
            buf = _Block(buf.tree, buf.leaves)
            incoming = _Block(incoming.tree, incoming.leaves)
        b_arrays, i_arrays = buf._arrays(), incoming._arrays()
        out_arrays = []
        for j, (b, a) in enumerate(zip(b_arrays, i_arrays)):
            if b.shape[1:] != a.shape[1:]:
                raise InvalidInputError(
                    f"shuffle: elements have different shapes {b.shape[1:]} and {a.shape[1:]}"
                )
            if b.dtype != a.dtype:  # e.g. str columns of a wider width
                dtype = (
                    np.result_type(b.dtype, a.dtype) if object not in (a.dtype, b.dtype) else object
                )
                if dtype != b.dtype:
                    b = b_arrays[j] = b.astype(dtype)
            out = np.empty((m,) + a.shape[1:], dtype=b.dtype)
            out[order[first]] = b[sorted_slots[first]]
            repeated = ~first[1:]  # a later row of a repeated slot outputs the earlier row
            out[order[1:][repeated]] = a[order[:-1][repeated]]
            b[sorted_slots[last]] = a[order[last]]
            out_arrays.append(out)
        self.buf = buf._rebuild(b_arrays)
        return incoming._rebuild(out_arrays)

    def close(self) -> None:
        self.buf = self.draining = None
        self.upstream.close()


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


def _batched(block: _Block, b: int) -> _Block:
    return block._rebuild([a.reshape((len(block) // b, b) + a.shape[1:]) for a in block._arrays()])


def _stack(block: _Block) -> _Block:
    return block._rebuild([a[None] for a in block._arrays()])


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


def _graft(tree: Tree, subtrees: list[Tree]) -> Tree:
    it = iter(subtrees)

    def build(t: Tree) -> Tree:
        if t.kind == "leaf":
            return next(it)
        if t.kind == "none":
            return t
        return Tree(t.kind, t.keys, tuple(build(c) for c in t.children))

    return build(tree)


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


class _End:
    pass


class _Failure:
    def __init__(self, error: BaseException) -> None:
        self.error = error


class _PrefetchIter(_BlockIter):
    """A background thread pulling ``per_item`` elements at a time into a bounded queue."""

    def __init__(self, upstream: _BlockIter, per_item: int, items: int) -> None:
        self.upstream, self.per_item = upstream, per_item
        self.queue: queue.Queue = queue.Queue(maxsize=items)
        self.stop = threading.Event()
        self.pending: _Block | None = None
        self.finished = False
        self.thread = threading.Thread(target=self._work, daemon=True, name="dataset-prefetch")
        self.thread.start()

    def _put(self, item: Any) -> bool:
        while not self.stop.is_set():
            try:
                self.queue.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def _work(self) -> None:
        try:
            while not self.stop.is_set():
                block = self.upstream.pull(self.per_item)
                if block is None:
                    self._put(_End())
                    return
                if not self._put(block):
                    return
        except BaseException as exc:  # raised in the consuming thread
            self._put(_Failure(exc))
        finally:
            self.upstream.close()

    def pull(self, max_rows: int) -> _Block | None:
        if self.pending is None:
            if self.finished:
                return None
            item = self.queue.get()
            if isinstance(item, _End):
                self.finished = True
                return None
            if isinstance(item, _Failure):
                self.finished = True
                raise item.error
            self.pending = item
        block = self.pending
        if len(block) > max_rows:
            self.pending = block.slice(max_rows, len(block))
            return block.slice(0, max_rows)
        self.pending = None
        return block

    def close(self) -> None:
        self.stop.set()
        while True:
            try:
                self.queue.get_nowait()
            except queue.Empty:
                break
        self.pending = None
