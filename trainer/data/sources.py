"""Where a dataset's rows come from when no array holds them: the files a glob matches
(``Dataset.list_files``) and a Python generator (``Dataset.from_generator``).  Each is a plain
object whose ``blocks()`` starts a run; :class:`~.dataset.Dataset` wraps it."""

from __future__ import annotations

import glob as globlib
import itertools
import os
import threading
from collections.abc import Iterator

import numpy as np

from tierserve.core.errors import InvalidInputError

from .dataset_blocks import (
    _LEAF,
    CHUNK,
    _Block,
    _block_from_elements,
    _BlockIter,
    _flatten,
    _GenIter,
    _SliceIter,
)
from .structure import _flatten_shapes, _numpy_dtype, _shapes_up_to


class ListFiles:
    """The files matching a glob pattern (:meth:`Dataset.list_files`): ``blocks()`` gives
    them, shuffled anew on each run when ``shuffle``."""

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

    def blocks(self) -> _BlockIter:
        files = self.files
        if self.shuffle:
            with self.lock:
                files = files[self.rng.permutation(len(files))]
        return _SliceIter(_Block(_LEAF, [files]))


class GeneratorSource:
    """The elements of ``generator(*args)`` (:meth:`Dataset.from_generator`), checked
    against ``output_types`` / ``output_shapes`` when given; ``blocks()`` starts a run."""

    def __init__(self, generator, output_types, output_shapes, args) -> None:
        if not callable(generator):
            raise InvalidInputError("from_generator needs a callable that returns an iterable")
        self.generator, self.args = generator, args
        self.types = None if output_types is None else _flatten(output_types)[0]
        self.shapes = None
        if output_shapes is not None:
            self.shapes = (_flatten_shapes(output_shapes) if output_types is None
                           else _shapes_up_to(output_types, output_shapes))

    def blocks(self) -> _BlockIter:
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
