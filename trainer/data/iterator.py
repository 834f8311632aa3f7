"""TF1's one-shot iterator: ``get_next()`` values that stand for every later element.

In TensorFlow 1, ``it.get_next()`` is a set of symbolic tensors: an ``input_fn`` may unpack
them and rearrange them (``x, y = it.get_next(); return {"x": x}, y``), and each training
step reads the *next* element through that arrangement.  Here ``get_next()`` returns the
next element's values themselves, each leaf a :class:`NextValue` (an ndarray that remembers
its iterator and its place in the element) and each dict a :class:`NextFeatures`.
:func:`stream_of` finds those in what an ``input_fn`` returned and gives the rest of the pass
arranged the same way, so the input ends when the data ends.

A value *computed* from a ``get_next()`` value (``x * 2``, ``x[:, 0]``) is refused: TF1
would recompute it for every element, which numpy cannot replay; do it in
``Dataset.map`` before the iterator.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from tierserve.core.errors import InvalidInputError

Path = tuple  # keys / indices from the element's root to a leaf


class OutOfRangeError(InvalidInputError):
    """The iterator has no more elements (``tf.errors.OutOfRangeError``)."""


class NextValue(np.ndarray):
    """A leaf of an element ``get_next()`` gave: the array, its iterator and its path.
    Arrays numpy derives from it (arithmetic, slices) lose the path (``path`` None)."""

    iterator: OneShotIterator | None = None
    path: Path | None = None

    def __array_finalize__(self, obj: Any) -> None:
        # every array numpy makes from a NextValue is derived: it has no place in the element
        self.iterator = getattr(obj, "iterator", None)
        self.path = None

    def __reduce__(self):  # pickles (and copies for other processes) as a plain array
        return np.asarray(self).__reduce__()


class NextFeatures(dict):
    """A dict of an element ``get_next()`` gave; ``.iterator`` gives the elements after it."""

    def __init__(self, element: dict, iterator: OneShotIterator, path: Path = ()) -> None:
        super().__init__(element)
        self.iterator = iterator
        self.path = path


class OneShotIterator:
    """One pass over a dataset (``dataset.make_one_shot_iterator()``); see the module doc."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset
        self._it = iter(dataset)

    def get_next(self) -> Any:
        """The next element, its leaves :class:`NextValue` and its dicts :class:`NextFeatures`.
        Raises :class:`OutOfRangeError` after the last one."""
        try:
            element = next(self._it)
        except StopIteration:
            raise OutOfRangeError("End of sequence") from None
        return self._mark(element, ())

    def _mark(self, value: Any, path: Path) -> Any:
        if isinstance(value, dict):
            return NextFeatures({k: self._mark(v, (*path, k)) for k, v in value.items()},
                                self, path)
        if isinstance(value, (tuple, list)):
            return type(value)(self._mark(v, (*path, i)) for i, v in enumerate(value))
        leaf = np.asarray(value).view(NextValue)
        leaf.iterator, leaf.path = self, path
        return leaf

    def __iter__(self) -> Iterator[Any]:
        return self._it

    def __next__(self) -> Any:
        return next(self._it)


def make_one_shot_iterator(dataset: Any) -> OneShotIterator:
    """``tf.compat.v1.data.make_one_shot_iterator(dataset)``."""
    return OneShotIterator(dataset)


def _template(value: Any, found: list) -> Any:
    """``value`` with every get_next() leaf replaced by ``("__next__", path)``; the
    iterators met are appended to ``found``."""
    if isinstance(value, NextValue):
        if value.path is None:
            raise InvalidInputError(
                "the input_fn returned a value computed from iterator.get_next() values "
                "(arithmetic, slicing, ...): TF1 recomputed it for each element, this runtime "
                "cannot; compute it in Dataset.map(...) before make_one_shot_iterator")
        found.append(value.iterator)
        return ("__next__", value.path)
    if isinstance(value, dict):
        if isinstance(value, NextFeatures):
            found.append(value.iterator)
        return {k: _template(v, found) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return type(value)(_template(v, found) for v in value)
    return ("__const__", value)


def _fill(template: Any, element: Any) -> Any:
    if isinstance(template, tuple) and len(template) == 2 and template[0] == "__next__":
        leaf = element
        for key in template[1]:
            leaf = leaf[key]
        return leaf
    if isinstance(template, tuple) and len(template) == 2 and template[0] == "__const__":
        return template[1]
    if isinstance(template, dict):
        return {k: _fill(v, element) for k, v in template.items()}
    return type(template)(_fill(v, element) for v in template)


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return type(value)(_plain(v) for v in value)
    return np.asarray(value) if isinstance(value, NextValue) else value


def stream_of(result: Any) -> Iterator[Any] | None:
    """What an ``input_fn``'s return value stands for when it holds ``get_next()`` values:
    that element, then every later element of the same iterator arranged the same way.
    None when it holds none (constant arrays: one batch)."""
    found: list = []
    template = _template(result, found)
    iterators = {id(it): it for it in found}
    if not iterators:
        return None
    if len(iterators) > 1:
        raise InvalidInputError("the input_fn returned values of several iterators' "
                                "get_next(); zip the datasets (Dataset.zip) into one iterator")
    iterator = next(iter(iterators.values()))

    def rest() -> Iterator[Any]:
        yield _plain(result)
        for element in iterator:
            yield _fill(template, element)

    return rest()


__all__ = ["NextFeatures", "NextValue", "OneShotIterator", "OutOfRangeError",
           "make_one_shot_iterator", "stream_of"]
