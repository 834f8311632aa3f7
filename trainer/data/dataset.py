"""``tf.data``-style streaming datasets: lazy, bounded in memory, numpy elements.

A :class:`Dataset` is a recipe; iterating it (``for element in ds``) runs the pipeline and
yields elements as numpy values: an element is a structure (a value, or nested tuples, lists
and dicts of values) of arrays.  After :meth:`Dataset.batch`, an element is a batch whose
arrays have the batch as first dimension, which is what an Estimator ``input_fn`` returns.

Inside, rows travel in blocks (one array per leaf of the structure, first dimension = rows)
and every stage is pulled for at most as many rows as the stage after it needs, so a pipeline
holds at most what its buffers hold: ``shuffle(B).batch(b)`` over a file of any size keeps at
most ``B + b`` rows, ``prefetch(n)`` adds ``n`` elements.  Shuffling, batching, sharding and
slicing are numpy operations on blocks; :meth:`Dataset.map` calls its function once per
element as ``tf.data`` does (batch first, then map, to call it once per batch).

Text lines remember their file and line number, so :func:`decode_csv` errors raised inside a
``map`` name the file and line of the bad record.
"""

from __future__ import annotations

import csv
import glob as globlib
import gzip
import io
import itertools
import os
import queue
import threading
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from tierserve.ps.errors import InvalidInputError

from .errors import DataFileError

AUTOTUNE = -1
"""``tf.data.AUTOTUNE``: let the pipeline pick a buffer size or parallelism."""

_CHUNK = 1024  # rows per block when nothing downstream asks for fewer
_AUTOTUNE_PREFETCH_ROWS = 1024  # prefetch(AUTOTUNE) of unbatched elements
_AUTOTUNE_PREFETCH_BATCHES = 2  # prefetch(AUTOTUNE) of batches


# -- structures ----------------------------------------------------------------------------


class _Tree:
    """The shape of a structure: ``kind`` is leaf, tuple, list or dict."""

    __slots__ = ("kind", "keys", "children")

    def __init__(self, kind: str, keys: tuple = (), children: tuple = ()) -> None:
        self.kind, self.keys, self.children = kind, keys, children

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, _Tree)
            and self.kind == other.kind
            and self.keys == other.keys
            and self.children == other.children
        )

    def __hash__(self) -> int:
        return hash((self.kind, self.keys, self.children))


_LEAF = _Tree("leaf")
_NONE = _Tree("none")  # None in a structure (labels of unlabelled data): no arrays


def _flatten(structure: Any, lists_are_values: bool = False) -> tuple[list[Any], _Tree]:
    """Leaves and shape of a structure; ``lists_are_values``: a list is one value, as
    ``from_tensor_slices`` takes it (TensorFlow converts lists to tensors there)."""
    if structure is None:
        return [], _NONE
    if isinstance(structure, dict):
        keys = tuple(structure)
        parts = [_flatten(structure[k], lists_are_values) for k in keys]
        return [x for p in parts for x in p[0]], _Tree("dict", keys, tuple(p[1] for p in parts))
    sequence = (tuple,) if lists_are_values else (tuple, list)
    if isinstance(structure, sequence) and not _is_namedtuple(structure):
        parts = [_flatten(s, lists_are_values) for s in structure]
        kind = "tuple" if isinstance(structure, tuple) else "list"
        return [x for p in parts for x in p[0]], _Tree(kind, (), tuple(p[1] for p in parts))
    return [structure], _LEAF


def _is_namedtuple(value: Any) -> bool:
    return isinstance(value, tuple) and hasattr(value, "_fields")


def _unflatten(tree: _Tree, leaves: Sequence[Any]) -> Any:
    it = iter(leaves)

    def build(t: _Tree) -> Any:
        if t.kind == "leaf":
            return next(it)
        if t.kind == "none":
            return None
        values = [build(c) for c in t.children]
        if t.kind == "dict":
            return dict(zip(t.keys, values))
        return tuple(values) if t.kind == "tuple" else values

    return build(tree)


def _as_array(value: Any) -> np.ndarray:
    if isinstance(value, np.ndarray):
        return value
    if hasattr(value, "to_numpy"):  # pandas Series / DataFrame
        value = value.to_numpy()
    array = np.asarray(value)
    if array.dtype.kind == "S":  # bytes -> str, as our string columns are str
        array = np.char.decode(array, "utf-8")
    return array


# -- blocks: rows of a structure, one array per leaf ---------------------------------------


class _Block:
    """``n`` elements of one structure; ``prov``: (file, line) arrays of text rows, or None."""

    __slots__ = ("tree", "leaves", "prov")

    def __init__(self, tree: _Tree, leaves: list[np.ndarray], prov=None) -> None:
        self.tree, self.leaves, self.prov = tree, leaves, prov

    def __len__(self) -> int:
        return int(self.leaves[0].shape[0]) if self.leaves else 0

    def _arrays(self) -> list[np.ndarray]:
        return self.leaves + (list(self.prov) if self.prov is not None else [])

    def _rebuild(self, arrays: list[np.ndarray]) -> _Block:
        n = len(self.leaves)
        prov = tuple(arrays[n:]) if self.prov is not None else None
        return _Block(self.tree, arrays[:n], prov)

    def slice(self, start: int, stop: int) -> _Block:
        return self._rebuild([a[start:stop] for a in self._arrays()])

    def take(self, index: np.ndarray) -> _Block:
        return self._rebuild([a[index] for a in self._arrays()])

    def element(self, i: int) -> Any:
        return _unflatten(self.tree, [leaf[i] for leaf in self.leaves])

    def element_prov(self, i: int) -> tuple[np.ndarray, np.ndarray] | None:
        return None if self.prov is None else (self.prov[0][i], self.prov[1][i])

    @staticmethod
    def concat(blocks: Sequence[_Block]) -> _Block:
        if len(blocks) == 1:
            return blocks[0]
        tree = blocks[0].tree
        for b in blocks[1:]:
            if b.tree != tree:
                raise InvalidInputError(
                    "dataset elements do not all have the same structure "
                    f"({_describe(tree)} and {_describe(b.tree)})"
                )
        leaves = []
        for j in range(len(blocks[0].leaves)):
            parts = [b.leaves[j] for b in blocks]
            shapes = {p.shape[1:] for p in parts}
            if len(shapes) > 1:
                raise InvalidInputError(
                    f"dataset elements have different shapes {sorted(shapes)} in component "
                    f"{j}; batch needs elements of one shape"
                )
            leaves.append(np.concatenate(parts))
        prov = None
        if all(b.prov is not None for b in blocks):
            prov = tuple(np.concatenate([b.prov[k] for b in blocks]) for k in range(2))
        return _Block(tree, leaves, prov)


def _describe(tree: _Tree) -> str:
    if tree.kind == "leaf":
        return "a value"
    if tree.kind == "none":
        return "None"
    if tree.kind == "dict":
        return (
            "{"
            + ", ".join(f"{k!r}: {_describe(c)}" for k, c in zip(tree.keys, tree.children))
            + "}"
        )
    inner = ", ".join(_describe(c) for c in tree.children)
    return f"({inner})" if tree.kind == "tuple" else f"[{inner}]"


def _block_from_elements(
    elements: Sequence[Any], prov=None, lists_are_values: bool = False
) -> _Block:
    """Stack per-element structures into one block."""
    flats = [_flatten(e, lists_are_values) for e in elements]
    tree = flats[0][1]
    for _, t in flats[1:]:
        if t != tree:
            raise InvalidInputError(
                "dataset elements do not all have the same structure "
                f"({_describe(tree)} and {_describe(t)})"
            )
    leaves = []
    for j in range(len(flats[0][0])):
        values = [_as_array(f[0][j]) for f in flats]
        shapes = {v.shape for v in values}
        if len(shapes) > 1:
            raise InvalidInputError(
                f"dataset elements have different shapes {sorted(shapes)} in component {j}"
            )
        leaves.append(np.stack(values) if values else np.empty((0,)))
    return _Block(tree, leaves, prov)


def _block_from_slices(structure: Any) -> _Block:
    leaves, tree = _flatten(structure, lists_are_values=True)
    arrays = [_as_array(x) for x in leaves]
    if not arrays:
        raise InvalidInputError("from_tensor_slices needs at least one tensor")
    for a in arrays:
        if a.ndim == 0:
            raise InvalidInputError("from_tensor_slices needs tensors of rank >= 1, got a scalar")
    lengths = {int(a.shape[0]) for a in arrays}
    if len(lengths) > 1:
        raise InvalidInputError(
            f"from_tensor_slices: the tensors' first dimensions differ: {sorted(lengths)}"
        )
    return _Block(tree, arrays)


# -- block iterators -----------------------------------------------------------------------


class _BlockIter:
    """Pull-based block stream: :meth:`pull` returns at most ``max_rows`` rows, None at end."""

    def pull(self, max_rows: int) -> _Block | None:
        raise NotImplementedError

    def close(self) -> None:
        pass


class _Exact:
    """Exactly ``k`` rows per :meth:`pull` (fewer only at the end) from an upstream stream."""

    def __init__(self, upstream: _BlockIter) -> None:
        self.upstream = upstream
        self.pending: _Block | None = None

    def pull(self, k: int) -> _Block | None:
        parts, need = [], k
        while need > 0:
            if self.pending is not None:
                block, self.pending = self.pending, None
            else:
                block = self.upstream.pull(need)
                if block is None:
                    break
            if len(block) > need:
                block, self.pending = block.slice(0, need), block.slice(need, len(block))
            if len(block):
                parts.append(block)
                need -= len(block)
        return _Block.concat(parts) if parts else None

    def close(self) -> None:
        self.pending = None
        self.upstream.close()


class _SliceIter(_BlockIter):
    def __init__(self, block: _Block) -> None:
        self.block, self.pos = block, 0

    def pull(self, max_rows: int) -> _Block | None:
        if self.pos >= len(self.block):
            return None
        stop = min(len(self.block), self.pos + max_rows)
        out, self.pos = self.block.slice(self.pos, stop), stop
        return out


class _GenIter(_BlockIter):
    """Blocks from a generator of blocks, re-cut to what is pulled."""

    def __init__(self, blocks: Iterator[_Block]) -> None:
        self.blocks = blocks
        self.pending: _Block | None = None

    def pull(self, max_rows: int) -> _Block | None:
        block, self.pending = self.pending, None
        while block is None or len(block) == 0:
            block = next(self.blocks, None)
            if block is None:
                return None
        if len(block) > max_rows:
            block, self.pending = block.slice(0, max_rows), block.slice(max_rows, len(block))
        return block

    def close(self) -> None:
        close = getattr(self.blocks, "close", None)
        if close is not None:
            close()


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
        return _ListFilesDataset(file_pattern, True if shuffle is None else bool(shuffle), seed)

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
        return 1 if self._element_rows > 1 else _CHUNK

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
        """TF1's iterator: :meth:`OneShotIterator.get_next` gives the next element."""
        return OneShotIterator(self)


class OneShotIterator:
    """One pass over a dataset.  ``get_next()`` is the next element; returned from an
    ``input_fn``, it stands for the whole rest of the pass, as TF1's ``get_next`` tensors
    did (``estimator.inputs.batches`` carries on from it)."""

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset
        self._it = iter(dataset)

    def get_next(self) -> Any:
        """The next element.  Its features dict (a (features, labels) element's first part, or
        a features-only element) is a :class:`NextFeatures` that remembers this iterator, so
        ``features, labels = it.get_next(); return features, labels`` keeps the stream."""
        try:
            element = next(self._it)
        except StopIteration:
            raise OutOfRangeError("End of sequence") from None
        if isinstance(element, tuple) and len(element) == 2 and isinstance(element[0], dict):
            return NextFeatures(element[0], self), element[1]
        if isinstance(element, dict):
            return NextFeatures(element, self)
        return element

    def __iter__(self) -> Iterator[Any]:
        return self._it

    def __next__(self) -> Any:
        return next(self._it)


class NextFeatures(dict):
    """A features dict taken by :meth:`OneShotIterator.get_next`; ``.iterator`` gives the
    elements after it."""

    def __init__(self, element: dict, iterator: OneShotIterator) -> None:
        super().__init__(element)
        self.iterator = iterator


class OutOfRangeError(InvalidInputError):
    """The iterator has no more elements (``tf.errors.OutOfRangeError``)."""


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
            # a shape is a tuple of ints/None: flatten down to tuples, not into them
            self.shapes = _flatten_shapes(output_shapes)

    def _blocks(self) -> _BlockIter:
        source = iter(self.generator(*self.args))

        def blocks() -> Iterator[_Block]:
            while True:
                chunk = list(itertools.islice(source, _CHUNK))
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
                got = leaf.shape[1:]
                if len(got) != len(shape) or any(
                    s is not None and s != g for s, g in zip(shape, got)
                ):
                    raise InvalidInputError(
                        f"from_generator: component {j} has shape {got}, output_shapes says {shape}"
                    )
        return block


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


class _ListFilesDataset(Dataset):
    def __init__(self, pattern, shuffle: bool, seed: int | None) -> None:
        patterns = [pattern] if isinstance(pattern, (str, os.PathLike)) else list(pattern)
        files: set[str] = set()
        for p in patterns:
            files.update(globlib.glob(os.fspath(p)))
        if not files:
            raise InvalidInputError(
                f"list_files: no files matched pattern {patterns if len(patterns) > 1 else os.fspath(patterns[0])!r}"
            )
        self.files = np.array(sorted(files))
        self.shuffle = shuffle
        self.rng = np.random.default_rng(seed)
        self.lock = threading.Lock()

    def _blocks(self) -> _BlockIter:
        files = self.files
        if self.shuffle:
            with self.lock:
                files = files[self.rng.permutation(len(files))]
        return _SliceIter(_Block(_LEAF, [files]))


class TextLineDataset(Dataset):
    """The lines of text files (``tf.data.TextLineDataset``), as str without the newline.

    ``filenames``: a path, a list of paths, or a dataset of paths; files are read one after
    the other.  ``compression_type``: ``""``/None, ``"GZIP"`` or ``"ZLIB"``; ``buffer_size``:
    read buffer in bytes.  ``num_parallel_reads`` above 1 is refused (files are read in turn).
    """

    def __init__(
        self,
        filenames: Any,
        compression_type: str | None = None,
        buffer_size: int | None = None,
        num_parallel_reads: int | None = None,
    ) -> None:
        if compression_type not in (None, "", "GZIP", "ZLIB"):
            raise InvalidInputError(
                f"TextLineDataset: compression_type must be '', 'GZIP' or 'ZLIB', got {compression_type!r}"
            )
        if num_parallel_reads not in (None, 1):
            raise InvalidInputError(
                "TextLineDataset: num_parallel_reads is not supported (files are read one after "
                "the other); use prefetch() to read ahead"
            )
        if buffer_size is not None and int(buffer_size) < 1:
            raise InvalidInputError(f"TextLineDataset: buffer_size must be >= 1, got {buffer_size}")
        self.compression = compression_type or ""
        self.buffer_size = None if buffer_size is None else int(buffer_size)
        if isinstance(filenames, Dataset):
            self.names: Dataset | list[str] = filenames
        else:
            array = _as_array(filenames)
            self.names = [os.fspath(str(x)) for x in array.reshape(-1)]

    def _open(self, path: str):
        buffering = self.buffer_size or io.DEFAULT_BUFFER_SIZE
        try:
            if self.compression == "GZIP":
                raw = io.BufferedReader(gzip.GzipFile(path, "rb"), buffering)
            elif self.compression == "ZLIB":
                raw = io.BufferedReader(_ZlibReader(open(path, "rb")), buffering)  # noqa: SIM115
            else:
                raw = open(path, "rb", buffering=buffering)  # noqa: SIM115 - closed by the iterator
        except OSError as exc:
            raise DataFileError(path, f"cannot open: {exc.strerror or exc}") from None
        return io.TextIOWrapper(raw, encoding="utf-8", newline=None)

    def _file_blocks(self, path: str) -> _BlockIter:
        return _TextFileIter(self, path)

    def _blocks(self) -> _BlockIter:
        names = self.names
        if isinstance(names, Dataset):
            return _FlatMapIter(names._blocks(), lambda name: _OneFile(self, str(name)))
        return _FlatMapIter(
            _SliceIter(_Block(_LEAF, [np.array(names, dtype=object)])),
            lambda name: _OneFile(self, str(name)),
        )


class _OneFile(Dataset):
    def __init__(self, owner: TextLineDataset, path: str) -> None:
        self.owner, self.path = owner, path

    def _blocks(self) -> _BlockIter:
        return _TextFileIter(self.owner, self.path)


class _TextFileIter(_BlockIter):
    """Reads exactly as many lines as are pulled."""

    def __init__(self, owner: TextLineDataset, path: str) -> None:
        self.owner, self.path = owner, path
        self.file = None
        self.line = 0  # lines read so far
        self.done = False

    def pull(self, max_rows: int) -> _Block | None:
        if self.done:
            return None
        if self.file is None:
            self.file = self.owner._open(self.path)
        try:
            lines = list(itertools.islice(self.file, max_rows))
        except (OSError, EOFError, zlib.error, UnicodeDecodeError) as exc:
            raise DataFileError(self.path, f"line {self.line + 1}: cannot read: {exc}") from None
        if not lines:
            self.close()
            return None
        text = "".join(lines)
        parts = text.split("\n")
        if text.endswith("\n"):
            parts.pop()
        values = np.empty(len(parts), dtype=object)
        values[:] = parts
        lines_no = np.arange(self.line + 1, self.line + 1 + len(parts), dtype=np.int64)
        self.line += len(parts)
        files = np.empty(len(parts), dtype=object)
        files[:] = self.path
        return _Block(_LEAF, [values], (files, lines_no))

    def close(self) -> None:
        self.done = True
        if self.file is not None:
            self.file.close()
            self.file = None


class _ZlibReader(io.RawIOBase):
    """A readable raw stream of a zlib-compressed file."""

    def __init__(self, file) -> None:
        self.file, self.z, self.buf = file, zlib.decompressobj(), b""

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        while not self.buf:
            data = self.file.read(65536)
            if not data:
                self.buf = self.z.flush()
                if not self.buf:
                    return 0
                break
            self.buf = self.z.decompress(data)
        n = min(len(b), len(self.buf))
        b[:n], self.buf = self.buf[:n], self.buf[n:]
        return n

    def close(self) -> None:
        self.file.close()
        super().close()


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

    def pull(self, max_rows: int) -> _Block | None:
        if self.draining is not None:
            if self.pos >= len(self.draining):
                self.draining = None
                return None
            out = self.draining.slice(self.pos, self.pos + max_rows)
            self.pos += len(out)
            return out
        if self.buf is None:  # fill the buffer first
            self.buf = self.upstream.pull(self.size)
            if self.buf is None:
                return None
            self.buf = self.buf.take(np.arange(len(self.buf)))  # own copy, writable
        incoming = None if len(self.buf) < self.size else self.upstream.pull(max_rows)
        if incoming is None:
            self.draining = self.buf.take(self.rng.permutation(len(self.buf)))
            self.buf, self.pos = _Block(self.buf.tree, []), 0
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
                    block = upstream.pull(min(_CHUNK, count - self.seen))
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
    def __init__(self, parts: list[Dataset], tree: _Tree) -> None:
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


def _graft(tree: _Tree, subtrees: list[_Tree]) -> _Tree:
    it = iter(subtrees)

    def build(t: _Tree) -> _Tree:
        if t.kind == "leaf":
            return next(it)
        if t.kind == "none":
            return t
        return _Tree(t.kind, t.keys, tuple(build(c) for c in t.children))

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
        per_item = 1 if batched else min(size, _CHUNK)
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


# -- CSV decoding --------------------------------------------------------------------------


class DecodeCSVError(InvalidInputError):
    """A record that :func:`decode_csv` cannot decode; ``record`` is its flat index in the
    records given (None for a single record), ``column`` the CSV column (0-based)."""

    def __init__(self, problem: str, *, record: int | None = None, column: int | None = None):
        where = []
        if record is not None:
            where.append(f"record {record}")
        if column is not None:
            where.append(f"column {column}")
        super().__init__(f"decode_csv: {', '.join(where) + ': ' if where else ''}{problem}")
        self.problem, self.record, self.column = problem, record, column


class CSVRecordError(DataFileError):
    """A CSV line that cannot be decoded, named by file and line (1-based)."""

    def __init__(self, file: str, line: int, problem: str, *, column: int | None = None):
        InvalidInputError.__init__(
            self,
            f"{file}, line {line}{f', column {column}' if column is not None else ''}: {problem}",
        )
        self.file, self.line, self.column, self.problem = str(file), line, column, problem
        self.record, self.slot, self.field = line - 1, None, None if column is None else str(column)


_CSV_DTYPES = {
    np.dtype(np.float32),
    np.dtype(np.float64),
    np.dtype(np.int32),
    np.dtype(np.int64),
}


def _record_default(default: Any, column: int) -> tuple[np.dtype, Any]:
    """(dtype, default value or None when required) of one record default."""
    where = f"record_defaults for column {column}"
    if isinstance(default, np.dtype) or (
        isinstance(default, type)
        and default in (int, float, str, bytes, np.int32, np.int64, np.float32, np.float64, np.str_)
    ):
        return _check_dtype(
            np.dtype(str) if default in (str, bytes, np.str_) else np.dtype(default), where
        ), None
    if isinstance(default, (list, tuple, np.ndarray)):
        values = default if not isinstance(default, np.ndarray) else list(default.reshape(-1))
        if len(values) == 0:
            dtype = default.dtype if isinstance(default, np.ndarray) else np.dtype(np.float32)
            return _check_dtype(np.dtype(str) if dtype.kind in "SUO" else dtype, where), None
        if len(values) != 1:
            raise InvalidInputError(
                f"decode_csv: {where} must hold at most one value, got {len(values)}"
            )
        if isinstance(default, np.ndarray):
            value = default.reshape(-1)[0]
            dtype = np.dtype(str) if default.dtype.kind in "SUO" else default.dtype
            return _check_dtype(dtype, where), value
        default = values[0]
    if isinstance(default, bool) or default is None:
        raise InvalidInputError(
            f"decode_csv: {where} is {default!r}; a default is an int, float or str value "
            "(or an empty list for a required column)"
        )
    if isinstance(default, np.generic):
        dtype = np.dtype(str) if default.dtype.kind in "SU" else default.dtype
        return _check_dtype(dtype, where), default.item() if dtype.kind != "U" else str(default)
    if isinstance(default, int):
        return np.dtype(np.int32), default
    if isinstance(default, float):
        return np.dtype(np.float32), default
    if isinstance(default, (str, bytes)):
        return np.dtype(str), default.decode() if isinstance(default, bytes) else default
    raise InvalidInputError(
        f"decode_csv: {where} has type {type(default).__name__}; a default is an int, float "
        "or str value (or an empty list for a required column)"
    )


def _check_dtype(dtype: np.dtype, where: str) -> np.dtype:
    if dtype.kind == "U" or dtype in _CSV_DTYPES:
        return np.dtype(str) if dtype.kind == "U" else dtype
    raise InvalidInputError(
        f"decode_csv: {where} has dtype {dtype}; supported: float32, float64, int32, int64, string"
    )


def decode_csv(
    records: Any,
    record_defaults: Sequence[Any],
    field_delim: str = ",",
    use_quote_delim: bool = True,
    na_value: str = "",
    select_cols: Sequence[int] | None = None,
    name: str | None = None,
) -> list[Any]:
    """The columns of CSV ``records`` (``tf.io.decode_csv``): one array per record default.

    ``records``: one str (columns come back as numpy scalars) or an array of them (columns
    have its shape).  Each of ``record_defaults`` gives a column's type and the value of an
    empty field: ``[0]`` int32, ``[0.0]`` float32, ``["x"]`` str, a numpy value its dtype, and
    an empty list (float32) or empty typed array a required column.  ``select_cols`` picks the
    columns (sorted indices) the defaults are for.  A record with the wrong number of fields,
    an empty required field or a field of the wrong type raises :class:`DecodeCSVError`
    (inside :meth:`Dataset.map` over text lines: :class:`CSVRecordError` naming file and line).
    """
    del name
    if len(field_delim) != 1:
        raise InvalidInputError(
            f"decode_csv: field_delim must be one character, got {field_delim!r}"
        )
    n_defaults = len(record_defaults)
    if select_cols is not None:
        cols = [int(c) for c in select_cols]
        if len(cols) != n_defaults:
            raise InvalidInputError(
                f"decode_csv: select_cols has {len(cols)} columns, record_defaults {n_defaults}"
            )
        if any(c < 0 for c in cols) or any(b <= a for a, b in zip(cols, cols[1:])):
            raise InvalidInputError(
                f"decode_csv: select_cols must be increasing non-negative indices, got {cols}"
            )
    else:
        cols = list(range(n_defaults))
    specs = [_record_default(d, c) for d, c in zip(record_defaults, cols)]
    scalar = isinstance(records, (str, bytes, np.str_, np.bytes_)) or (
        isinstance(records, np.ndarray) and records.ndim == 0
    )
    array = _as_array(records)
    shape = array.shape
    flat = array.reshape(-1).tolist()
    if flat and not all(isinstance(r, str) for r in (flat[0], flat[-1])):
        flat = [r.decode() if isinstance(r, bytes) else str(r) for r in flat]
    quoting = csv.QUOTE_MINIMAL if use_quote_delim else csv.QUOTE_NONE
    reader = csv.reader(flat, delimiter=field_delim, quoting=quoting, strict=True)
    try:
        rows = list(reader)
    except csv.Error as exc:
        raise DecodeCSVError(
            f"malformed quoting: {exc}", record=None if scalar else reader.line_num - 1
        ) from None
    # csv gives [] for an empty line: one empty field as TensorFlow counts it
    lengths = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
    counts = np.maximum(lengths, 1)
    if select_cols is None:
        bad = np.flatnonzero(counts != n_defaults)
        expect = f"{n_defaults} fields"
    else:
        bad = np.flatnonzero(counts <= cols[-1])
        expect = f"at least {cols[-1] + 1} fields (select_cols {cols})"
    if len(bad):
        i = int(bad[0])
        raise DecodeCSVError(
            f"expected {expect}, got {int(counts[i])}: {flat[i]!r}", record=None if scalar else i
        )
    width = max(cols[-1] + 1, 1) if cols else 1
    padded = rows
    if (lengths < width).any():  # empty lines of a one-column CSV
        padded = [r if len(r) >= width else r + [""] * (width - len(r)) for r in rows]
    columns = list(zip(*padded)) if padded else [()] * width
    out = []
    for (dtype, default), c in zip(specs, cols):
        raw = np.array(columns[c], dtype=str) if columns[c] else np.empty(0, dtype=str)
        empty = raw == ""
        if na_value:
            empty |= raw == na_value
        if empty.any() and default is None:
            i = int(np.flatnonzero(empty)[0])
            raise DecodeCSVError(
                "the field is empty and the column has no default (required)",
                record=None if scalar else i,
                column=c,
            )
        if dtype.kind == "U":
            values = np.where(empty, str(default), raw) if empty.any() else raw
        else:
            filled = np.where(empty, "0", raw) if empty.any() else raw
            try:
                values = filled.astype(np.float64 if dtype.kind == "f" else np.int64)
            except (ValueError, OverflowError):
                i = _first_bad(filled, dtype)
                raise DecodeCSVError(
                    f"field {str(raw[i])!r} is not a valid {dtype.name} (the column's record default "
                    f"is {dtype.name})",
                    record=None if scalar else i,
                    column=c,
                ) from None
            if dtype.kind == "i":
                info = np.iinfo(dtype)
                outside = (values < info.min) | (values > info.max)
                if outside.any():
                    i = int(np.flatnonzero(outside)[0])
                    raise DecodeCSVError(
                        f"field {str(raw[i])!r} is out of range for {dtype.name}",
                        record=None if scalar else i,
                        column=c,
                    )
            values = values.astype(dtype)
            if empty.any():
                values[empty] = default
        values = values.reshape(shape)
        out.append(values[()] if scalar else values)
    return out


def _first_bad(values: np.ndarray, dtype: np.dtype) -> int:
    kind = float if dtype.kind == "f" else int
    for i, v in enumerate(values.tolist()):  # the error path only
        try:
            kind(v)
        except ValueError:
            return i
    return 0


# -- readers of the trainer's Norm, Raw and Parquet files ----------------------------------


class _ReaderDataset(Dataset):
    """(features, label) elements from the trainer's data reader.

    ``features``: ``"dense"`` float32 [dense_dim] and, per sparse input, its keys under its
    name: int64 [slot_num] when each slot holds one key (``nnz_per_slot=1``), else int64
    [slot_num, nnz_per_slot]; a slot's missing keys are -1.  ``label``: float32 [label_dim].
    Reader options (``check_type``, ``slot_size_array``, ``num_workers``, ...) are
    :class:`~tierserve.trainer.data.reader.DataReader`'s.
    """

    reader_type = ""

    def __init__(
        self,
        source: Any,
        label_dim: int,
        dense_dim: int,
        sparse_params: Sequence[Any],
        **options: Any,
    ) -> None:
        from .reader import DataReader

        if "repeat_dataset" in options:
            raise InvalidInputError(
                f"{type(self).__name__}: repeat_dataset is not an option here; use .repeat()"
            )
        self.args = (self.reader_type, source, _CHUNK, label_dim, dense_dim, list(sparse_params))
        self.options = options
        DataReader(*self.args, **self.options).close()  # check the settings now

    def _blocks(self) -> _BlockIter:
        from .reader import DataReader

        reader = DataReader(*self.args, **self.options)
        params = self.args[5]

        def blocks() -> Iterator[_Block]:
            try:
                for batch in reader:
                    features = {"dense": batch.dense}
                    for p, sparse in zip(params, batch.sparse):
                        features[p.sparse_name] = _padded_keys(sparse, p.nnz_per_slot)
                    leaves, tree = _flatten((features, batch.label))
                    yield _Block(tree, leaves)
            finally:
                reader.close()

        return _GenIter(blocks())


def _padded_keys(sparse: Any, nnz: int) -> np.ndarray:
    n, s = sparse.batch_size, sparse.slot_num
    counts = np.diff(sparse.row_offsets)
    out = np.full((n * s, nnz), -1, dtype=np.int64)
    rows = np.repeat(np.arange(n * s), counts)
    pos = np.arange(len(sparse.keys)) - np.repeat(sparse.row_offsets[:-1], counts)
    out[rows, pos] = sparse.keys
    return out.reshape(n, s) if nnz == 1 else out.reshape(n, s, nnz)


class NormDataset(_ReaderDataset):
    """Samples of a Norm file list (see :class:`_ReaderDataset` for the elements)."""

    reader_type = "Norm"


class RawDataset(_ReaderDataset):
    """Samples of a Raw file (see :class:`_ReaderDataset` for the elements)."""

    reader_type = "Raw"


class ParquetDataset(_ReaderDataset):
    """Samples of a Parquet file list (see :class:`_ReaderDataset` for the elements)."""

    reader_type = "Parquet"
