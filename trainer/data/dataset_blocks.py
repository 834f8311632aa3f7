"""The inside of :mod:`.dataset`: element structures and blocks of rows.

A structure is a value or nested tuples, lists and dicts of values; a block holds ``n``
elements of one structure as one array per leaf (first dimension = rows), plus the file and
line of each row when rows are text lines.  Block iterators are pulled for at most as many
rows as the caller asks for, which is what bounds a pipeline's memory.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from tierserve.core.errors import InvalidInputError

CHUNK = 1024  # rows per block when nothing downstream asks for fewer


# -- structures ----------------------------------------------------------------------------


class Tree:
    """The shape of a structure: ``kind`` is leaf, tuple, list or dict."""

    __slots__ = ("kind", "keys", "children")

    def __init__(self, kind: str, keys: tuple = (), children: tuple = ()) -> None:
        self.kind, self.keys, self.children = kind, keys, children

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Tree)
            and self.kind == other.kind
            and self.keys == other.keys
            and self.children == other.children
        )

    def __hash__(self) -> int:
        return hash((self.kind, self.keys, self.children))


_LEAF = Tree("leaf")
_NONE = Tree("none")  # None in a structure (labels of unlabelled data): no arrays


def _flatten(structure: Any, lists_are_values: bool = False) -> tuple[list[Any], Tree]:
    """Leaves and shape of a structure; ``lists_are_values``: a list is one value, as
    ``from_tensor_slices`` takes it (TensorFlow converts lists to tensors there)."""
    if structure is None:
        return [], _NONE
    if isinstance(structure, dict):
        keys = tuple(structure)
        parts = [_flatten(structure[k], lists_are_values) for k in keys]
        return [x for p in parts for x in p[0]], Tree("dict", keys, tuple(p[1] for p in parts))
    sequence = (tuple,) if lists_are_values else (tuple, list)
    if isinstance(structure, sequence) and not _is_namedtuple(structure):
        parts = [_flatten(s, lists_are_values) for s in structure]
        kind = "tuple" if isinstance(structure, tuple) else "list"
        return [x for p in parts for x in p[0]], Tree(kind, (), tuple(p[1] for p in parts))
    return [structure], _LEAF


def _is_namedtuple(value: Any) -> bool:
    return isinstance(value, tuple) and hasattr(value, "_fields")


def _unflatten(tree: Tree, leaves: Sequence[Any]) -> Any:
    it = iter(leaves)

    def build(t: Tree) -> Any:
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

    def __init__(self, tree: Tree, leaves: list[np.ndarray], prov=None) -> None:
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
        if self.tree.kind == "leaf":
            return self.leaves[0][i]
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


def _describe(tree: Tree) -> str:
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
    """Stack per-element structures into one block (level by level, not element by element)."""
    tree = _flatten(elements[0], lists_are_values)[1]
    columns: list[list[Any]] = []
    _gather(tree, list(elements), columns, lists_are_values)
    leaves = []
    for j, values in enumerate(columns):
        try:
            array = np.asarray(values)
        except ValueError:  # ragged
            array = None
        if array is None or (array.dtype == object and len({np.shape(v) for v in values}) > 1):
            shapes = sorted({np.shape(v) for v in values})
            raise InvalidInputError(
                f"dataset elements have different shapes {shapes} in component {j}"
            )
        if array.dtype.kind == "S":
            array = np.char.decode(array, "utf-8")
        leaves.append(array)
    return _Block(tree, leaves, prov)


def _gather(tree: Tree, items: list[Any], out: list[list[Any]], lists_are_values: bool) -> None:
    """Append to ``out`` one list per leaf of ``tree``: that leaf of every item."""
    kind = tree.kind
    if kind == "leaf":
        if not lists_are_values and any(type(it) in (dict, tuple, list) for it in items):
            _mismatch(tree, items)
        out.append(items)
        return
    if kind == "none":
        if any(it is not None for it in items):
            _mismatch(tree, items)
        return
    if kind == "dict":
        keys = tree.keys
        if not all(isinstance(it, dict) and len(it) == len(keys) for it in items):
            _mismatch(tree, items)
        try:
            for k, child in zip(keys, tree.children):
                _gather(child, [it[k] for it in items], out, lists_are_values)
        except KeyError:
            _mismatch(tree, items)
        return
    want = tuple if kind == "tuple" else list
    n = len(tree.children)
    if not all(isinstance(it, want) and len(it) == n for it in items):
        _mismatch(tree, items)
    for i, child in enumerate(tree.children):
        _gather(child, [it[i] for it in items], out, lists_are_values)


def _mismatch(tree: Tree, items: list[Any]) -> None:
    for it in items:
        other = _flatten(it)[1]
        if other != tree:
            raise InvalidInputError(
                "dataset elements do not all have the same structure "
                f"({_describe(tree)} and {_describe(other)})"
            )
    raise InvalidInputError(f"dataset elements do not all have the structure {_describe(tree)}")


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


def _batched(block: _Block, b: int) -> _Block:
    return block._rebuild([a.reshape((len(block) // b, b) + a.shape[1:]) for a in block._arrays()])


def _stack(block: _Block) -> _Block:
    return block._rebuild([a[None] for a in block._arrays()])


def _graft(tree: Tree, subtrees: list[Tree]) -> Tree:
    it = iter(subtrees)

    def build(t: Tree) -> Tree:
        if t.kind == "leaf":
            return next(it)
        if t.kind == "none":
            return t
        return Tree(t.kind, t.keys, tuple(build(c) for c in t.children))

    return build(tree)
