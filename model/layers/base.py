"""The interface every dense layer implements, and the registry of layer types.

A layer object holds only its configuration (the graph-JSON dict) and, once built, its
tensor shapes.  Parameters, non-trainable state and everything saved for backward live
outside it, so one object serves training and the inference server alike:

- ``build(input_shapes) -> output_shapes`` (per-sample shapes, batch dimension left out);
- ``param_shapes()`` / ``state_shapes()``: trainable parameters in file order (docs/formats.md,
  Files and messages 2) and non-trainable state (BatchNorm running mean and variance);
- ``init_params(rng)`` / ``init_state()``: HugeCTR's initializers and defaults;
- ``forward(xp, inputs, params, state, training) -> (outputs, ctx)``: pure, never writes
  ``params`` or ``state``;
- ``backward(xp, grad_outputs, ctx, params) -> (grad_inputs, grad_params)``: ``None`` in
  ``grad_inputs`` for an input that takes no gradient (a label);
- ``update_state(xp, ctx, state)``: after a training forward, in place (BatchNorm only).

Layers never write to the arrays they are given (inputs, ``grad_outputs``), so a tensor may
feed several layers.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from tierserve.core.errors import ConfigError, InvalidInputError

from ..graph_json import as_list

Shape = tuple[int, ...]

LAYER_TYPES: dict[str, type[Layer]] = {}


def register(cls: type[Layer]) -> type[Layer]:
    """Class decorator: make ``cls`` the implementation of ``cls.type_name``."""
    for name in (cls.type_name, *cls.aliases):
        LAYER_TYPES[name] = cls
    return cls


def build_layer(config: dict[str, Any]) -> Layer:
    """The layer object for one graph-JSON layer dict."""
    kind = config.get("type")
    cls = LAYER_TYPES.get(kind)
    if cls is None:
        raise ConfigError(
            f"layer {config.get('name')!r}: unsupported layer type {kind!r} "
            f"(supported: {', '.join(sorted(LAYER_TYPES))})"
        )
    return cls(config)


class Layer:
    """Base of all dense layers; see the module docstring for the contract."""

    type_name: ClassVar[str] = ""
    aliases: ClassVar[tuple[str, ...]] = ()
    num_inputs: ClassVar[tuple[int, int | None]] = (1, 1)  # (min, max); max None: any
    num_outputs: ClassVar[tuple[int, int | None]] = (1, 1)
    is_loss: ClassVar[bool] = False
    #: Indices of the parameters this layer computes faster when they are column-major
    #: (Fortran order) numpy arrays; the model stores them (and their optimizer state) so.
    column_major_params: ClassVar[tuple[int, ...]] = ()

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.name: str = config.get("name") or "/".join(as_list(config.get("top")))
        self.bottom: list[str] = as_list(config.get("bottom"))
        self.top: list[str] = as_list(config.get("top"))
        self.input_shapes: list[Shape] = []
        self.output_shapes: list[Shape] = []
        # Set by the model: False for inputs nothing upstream needs a gradient for.
        self.input_grad_mask: list[bool] | None = None
        lo, hi = self.num_inputs
        if len(self.bottom) < lo or (hi is not None and len(self.bottom) > hi):
            want = f"{lo}" if lo == hi else f"{lo} to {hi if hi is not None else 'any'}"
            raise ConfigError(
                f"layer {self.name!r} ({self.type_name}) takes {want} bottom tensors, "
                f"got {len(self.bottom)}: {self.bottom}"
            )
        lo, hi = self.num_outputs
        if len(self.top) < lo or (hi is not None and len(self.top) > hi):
            raise ConfigError(
                f"layer {self.name!r} ({self.type_name}) makes {lo} to {hi} top tensors, "
                f"got {len(self.top)}: {self.top}"
            )

    # -- configuration helpers -------------------------------------------------------------

    def param(self, key: str, default: Any = None, section: str | None = None) -> Any:
        """A setting from the layer dict, or from its ``section`` sub-dict (``fc_param``...)."""
        if section is not None and isinstance(self.config.get(section), dict):
            sub = self.config[section]
            if key in sub:
                return sub[key]
        return self.config.get(key, default)

    def needs_input_grad(self, index: int) -> bool:
        """Whether backward must compute the gradient of input ``index``."""
        return self.input_grad_mask is None or self.input_grad_mask[index]

    def error(self, message: str) -> ConfigError:
        return ConfigError(f"layer {self.name!r} ({self.type_name}): {message}")

    # -- the contract ------------------------------------------------------------------------

    def build(self, input_shapes: list[Shape], input_flat: list[bool] | None = None
              ) -> list[Shape]:
        """Output shapes for these input shapes.  ``input_flat`` marks inputs that HugeCTR
        holds as 2-D [batch * rows, n] tensors while they are per-sample [rows, n] here (see
        :meth:`flat_outputs`)."""
        self.input_shapes = [tuple(int(d) for d in s) for s in input_shapes]
        self.input_flat = list(input_flat or [False] * len(self.input_shapes))
        self.output_shapes = [tuple(int(d) for d in s) for s in self.infer_shapes()]
        return self.output_shapes

    def flat_outputs(self) -> list[bool]:
        """Which outputs are HugeCTR 2-D tensors with several rows per sample (per-sample
        [rows, n] here).  By default a 3-D output is flat when an input is."""
        flat = any(self.input_flat)
        return [flat and len(s) == 2 for s in self.output_shapes]

    def infer_shapes(self) -> list[Shape]:
        """Output shapes from ``self.input_shapes`` (override)."""
        return [self.input_shapes[0]]

    def param_shapes(self) -> list[Shape]:
        return []

    def state_shapes(self) -> list[Shape]:
        return []

    def init_params(self, rng: np.random.Generator) -> list[np.ndarray]:
        return []

    def init_state(self) -> list[np.ndarray]:
        return []

    def forward(
        self, xp, inputs: list, params: list, state: list, training: bool
    ) -> tuple[list, Any]:
        raise NotImplementedError

    def backward(self, xp, grad_outputs: list, ctx: Any, params: list) -> tuple[list, list]:
        raise NotImplementedError

    def update_state(self, xp, ctx: Any, state: list) -> None:
        return None

    def check_rank(self, shape: Shape, ranks: tuple[int, ...], what: str = "input") -> None:
        if len(shape) + 1 not in ranks:
            raise self.error(
                f"{what} has shape [batch, {', '.join(map(str, shape))}]; expected a "
                f"{' or '.join(f'{r}-D' for r in ranks)} tensor"
            )

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, {self.bottom} -> {self.top})"


def product(shape: Shape) -> int:
    return int(np.prod(shape, dtype=np.int64)) if shape else 1


def check_batch(layer: Layer, inputs: list) -> None:
    """All inputs must share the batch dimension."""
    sizes = {int(x.shape[0]) for x in inputs}
    if len(sizes) > 1:
        raise InvalidInputError(
            f"layer {layer.name!r}: inputs have different batch sizes {sorted(sizes)}"
        )
