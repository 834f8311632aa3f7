"""The network a ``model_fn`` builds: symbolic tensors over the trainer's graph-JSON layers.

A ``model_fn`` body calls the functional API (:mod:`.layers`, :mod:`.losses`,
:mod:`tierserve.trainer.feature_column`); each call appends graph-JSON layer dicts
(``InnerProduct``, ``ReLU``, ``Concat``, ...) to the current :class:`Graph` and returns a
:class:`Tensor` naming the layer's output.  The graph is then run by the trainer's own
:class:`~tierserve.model.network.DenseNetwork` (forward and backward of each layer: that is
the automatic differentiation), and the same layer dicts are what an export writes, so the
server runs exactly the network that was trained.
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tierserve.core.errors import ConfigError

_local = threading.local()

#: Graph tensors every program has: the label and the dense features (DES at serving time).
LABEL = "input:label"
DENSE = "input:dense"


class Tensor:
    """A tensor of the graph being built: its name, per-sample shape (batch left out) and
    dtype name (values are computed in float32; ``"int64"`` marks class ids such as
    ``argmax``'s, which metrics compare exactly)."""

    def __init__(self, graph: Graph, name: str, shape: tuple[int, ...],
                 dtype: str = "float32") -> None:
        self.graph = graph
        self.name = name
        self.shape = tuple(int(d) for d in shape)
        self.dtype = dtype

    @property
    def width(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    def __repr__(self) -> str:
        return f"Tensor({self.name!r}, shape=(None, {', '.join(map(str, self.shape))}))"

    # arithmetic and indexing (t + 1, t[:, 0], ...) are installed by :mod:`.ops`, as
    # TensorFlow's math_ops installs Tensor's operators


class FeatureTensor:
    """A raw feature handed to ``model_fn`` (``features['x']``): it has no graph tensor until
    a feature column reads it.  Passing it to a layer reads it as ``numeric_column(key)``."""

    def __init__(self, key: str, sample: Any = None) -> None:
        self.key = key
        self.sample = sample  # the first batch's array (shape, dtype)

    def __repr__(self) -> str:
        return f"FeatureTensor({self.key!r})"

    # arithmetic and indexing read the feature as its numeric column first
    def _t(self) -> Tensor:
        return as_tensor(self, f"feature {self.key!r}")

    def __add__(self, other: Any) -> Tensor:
        return self._t() + other

    def __radd__(self, other: Any) -> Tensor:
        return other + self._t()

    def __sub__(self, other: Any) -> Tensor:
        return self._t() - other

    def __rsub__(self, other: Any) -> Tensor:
        return other - self._t()

    def __mul__(self, other: Any) -> Tensor:
        return self._t() * other

    def __rmul__(self, other: Any) -> Tensor:
        return other * self._t()

    def __truediv__(self, other: Any) -> Tensor:
        return self._t() / other

    def __neg__(self) -> Tensor:
        return -self._t()

    def __getitem__(self, index: Any) -> Tensor:
        return self._t()[index]


class LabelTensor(Tensor):
    """The labels handed to ``model_fn``: ``shape`` is ``(values per example,)`` as the loss
    layers read them; ``tf_shape`` the per-example shape the input gave (``()`` for a
    ``[batch]`` array), which ``one_hot`` and ``reshape`` follow as TensorFlow does."""

    def __init__(self, graph: Graph, name: str, shape: tuple[int, ...],
                 tf_shape: tuple[int, ...] | None = None) -> None:
        super().__init__(graph, name, shape)
        self.tf_shape = self.shape if tf_shape is None else tuple(tf_shape)


@dataclass
class SparseGroup:
    """One embedding table fed by one or more categorical columns (one slot each)."""

    table: str  # the table's (and graph layer's) name
    columns: list  # CategoricalColumn per slot
    offsets: list[int]  # key offset per slot
    dim: int
    combiner: str
    optimizer_scope: str  # which train op updates it (variable-name prefix)
    init: Any = None  # None: the trainer's key-hash init; a callable: rows pre-initialised
    init_scale: float | None = None
    max_norm: float | None = None
    trainable: bool = True
    device: str = ""
    display_names: list[str] = field(default_factory=list)  # per-column variable names

    @property
    def slot_num(self) -> int:
        return len(self.columns)

    @property
    def rows(self) -> int:
        """Keys the table can hold: ids of every slot after its offset."""
        return max(o + c.num_buckets for o, c in zip(self.offsets, self.columns))


@dataclass
class DensePiece:
    """A feature column's values in the dense input (DES): ``[offset, offset + width)``."""

    column: Any
    offset: int
    width: int


@dataclass
class WeightedInput:
    """A weighted categorical column looked up outside the table's pooling (not exportable)."""

    name: str  # graph input tensor name, [B, dim]
    table: str
    column: Any  # WeightedCategoricalColumn
    dim: int
    combiner: str


class Graph:
    """The layers and inputs one ``model_fn`` call built (see the module docstring)."""

    def __init__(self, mode: str, emb_options: dict | None = None) -> None:
        self.mode = mode
        self.layers: list[dict[str, Any]] = []
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.dense_pieces: list[DensePiece] = []
        self.dense_width = 0
        self.groups: list[SparseGroup] = []
        self.weighted: list[WeightedInput] = []
        self.label: LabelTensor | None = None
        self.losses: list[Tensor] = []
        self.summaries: dict[str, Any] = {}  # tf.summary.scalar: name -> tensor or metric
        self.variables: dict[str, Any] = {}  # tf.get_variable: name -> its tensor
        self.frozen: dict[str, Any] = {}  # variable name -> fixed value (None: initial)
        self.initial: dict[str, Any] = {}  # variable name -> callable(shape) initializer
        self.state_names: dict[str, list[str]] = {}  # layer name -> non-trainable state names
        self.param_names: dict[str, list[str]] = {}  # layer name -> its variables' names
        self.used_features: set[str] = set()
        self.features: dict[str, Any] = {}
        self.emb_options = dict(emb_options or {})
        self._names: dict[str, int] = {}
        self._scopes: list[str] = []
        self._piece_by_column: dict[int, DensePiece] = {}
        self._group_by_key: dict[Any, SparseGroup] = {}
        self.seed = 0

    # -- names -----------------------------------------------------------------------------

    def scoped(self, name: str) -> str:
        return "/".join([*self._scopes, name]) if self._scopes else name

    def unique(self, base: str) -> str:
        """``base``, ``base_1``, ... within the current scope (TensorFlow's layer naming)."""
        base = self.scoped(re.sub(r"[^A-Za-z0-9_./-]", "_", base))
        n = self._names.get(base, 0)
        self._names[base] = n + 1
        return base if n == 0 else f"{base}_{n}"

    @contextlib.contextmanager
    def scope(self, name: str):
        self._scopes.append(name)
        try:
            yield
        finally:
            self._scopes.pop()

    @property
    def current_scope(self) -> str:
        return "/".join(self._scopes)

    # -- building --------------------------------------------------------------------------

    def tensor(self, name: str) -> Tensor:
        return Tensor(self, name, self.shapes[name])

    def add_layer(self, layer: dict[str, Any], tops: list[str], shapes: list[tuple],
                  params: list[str] | None = None) -> list[Tensor]:
        """Append one layer dict; ``shapes`` are its outputs' per-sample shapes and
        ``params`` the names of its variables (in the layer's parameter order)."""
        for top, shape in zip(tops, shapes):
            self.shapes[top] = tuple(shape)
        self.layers.append(layer)
        if params:
            self.param_names[layer["name"]] = params
        return [Tensor(self, top, shape) for top, shape in zip(tops, shapes)]

    def dense_piece(self, column: Any) -> DensePiece:
        """The dense-input range of ``column`` (added on first use)."""
        piece = self._piece_by_column.get(id(column))
        if piece is None:
            piece = DensePiece(column, self.dense_width, column.dense_width)
            self.dense_width += piece.width
            self.dense_pieces.append(piece)
            self._piece_by_column[id(column)] = piece
            self.used_features.update(column.input_keys)
        return piece

    def sparse_group(self, key: Any, make) -> SparseGroup:
        group = self._group_by_key.get(key)
        if group is None:
            group = make()
            self.groups.append(group)
            self._group_by_key[key] = group
            for c in group.columns:
                self.used_features.update(c.input_keys)
        return group


def current_graph(what: str = "this function") -> Graph:
    """The graph ``model_fn`` is building; an error outside one."""
    graph = getattr(_local, "graph", None)
    if graph is None:
        raise ConfigError(f"{what} builds a network and must be called inside a model_fn "
                          "(while an Estimator builds its graph)")
    return graph


@contextlib.contextmanager
def building(graph: Graph):
    """Make ``graph`` the current graph for the duration of a ``model_fn`` call."""
    previous = getattr(_local, "graph", None)
    _local.graph = graph
    try:
        yield graph
    finally:
        _local.graph = previous


#: How a raw feature becomes a graph tensor: :mod:`tierserve.trainer.feature_column` registers
#: a numeric column's input layer (the part TensorFlow's tensor conversion registry plays).
_feature_conversion: Callable[[FeatureTensor], Tensor] | None = None


def register_feature_conversion(convert: Callable[[FeatureTensor], Tensor]) -> None:
    """Make ``convert`` the way :func:`as_tensor` turns a raw feature into a tensor."""
    global _feature_conversion
    _feature_conversion = convert


def as_tensor(value: Any, what: str) -> Tensor:
    """A graph tensor for ``value``: a Tensor, or a raw feature read as a numeric column."""
    if isinstance(value, Tensor):
        return value
    if isinstance(value, FeatureTensor):
        cached = getattr(value, "_tensor", None)  # one dense input per feature and graph
        if cached is not None and cached.graph is current_graph(what):
            return cached
        if _feature_conversion is None:
            raise ConfigError(f"{what}: a raw feature ({value.key!r}) becomes a tensor through "
                              "tierserve.trainer.feature_column; import it first")
        value._tensor = _feature_conversion(value)
        return value._tensor
    raise ConfigError(f"{what}: expected a tensor of the model_fn's graph, got "
                      f"{type(value).__name__}")
