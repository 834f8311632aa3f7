"""The dense network of a graph: layer objects in order, tensor shapes, forward and backward.

Shared by training (:class:`tierserve.trainer.hugectr.model.Model`) and inference
(:mod:`tierserve.model.inference_graph`): the same layer objects, the same forward.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tierserve.core.errors import ConfigError

from .layers import Layer, Shape, build_layer


class DenseNetwork:
    """Builds the layers of ``layer_dicts`` over tensors of known per-sample shapes.

    ``input_shapes`` maps each tensor available before the first dense layer (label, dense
    features, embedding outputs) to its per-sample shape; ``grad_sources`` are the ones whose
    gradients the caller wants back (embedding outputs).  A bottom name that no earlier layer
    or input makes raises :class:`ConfigError` naming the layer.
    """

    def __init__(
        self,
        layer_dicts: list[dict[str, Any]],
        input_shapes: dict[str, Shape],
        grad_sources: set[str] | frozenset[str] = frozenset(),
    ) -> None:
        self.layers: list[Layer] = []
        shapes: dict[str, Shape] = dict(input_shapes)
        needs_grad = {name: name in grad_sources for name in input_shapes}
        flat: dict[str, bool] = {}
        for config in layer_dicts:
            layer = build_layer(config)
            missing = [b for b in layer.bottom if b not in shapes]
            if missing:
                raise ConfigError(
                    f"layer {layer.name!r} ({layer.type_name}): bottom tensor "
                    f"{missing[0]!r} does not exist (known tensors: {', '.join(shapes)})"
                )
            out_shapes = layer.build([shapes[b] for b in layer.bottom],
                                     [flat.get(b, False) for b in layer.bottom])
            for top, is_flat in zip(layer.top, layer.flat_outputs()):
                flat[top] = is_flat
            for top, shape in zip(layer.top, out_shapes):
                if top in shapes:
                    raise ConfigError(
                        f"layer {layer.name!r} ({layer.type_name}): top tensor {top!r} "
                        "already exists"
                    )
                shapes[top] = shape
            layer.input_grad_mask = [needs_grad[b] for b in layer.bottom]
            flows = any(layer.input_grad_mask) or bool(layer.param_shapes())
            for top in layer.top:
                needs_grad[top] = flows and not layer.is_loss
            self.layers.append(layer)
        self.shapes = shapes
        self.loss_layers = [layer for layer in self.layers if layer.is_loss]

    # -- parameters --------------------------------------------------------------------------

    def param_shapes(self) -> list[list[Shape]]:
        return [layer.param_shapes() for layer in self.layers]

    def state_shapes(self) -> list[list[Shape]]:
        return [layer.state_shapes() for layer in self.layers]

    def flat_param_shapes(self) -> list[Shape]:
        """Every trainable parameter's shape in dense-file order."""
        return [s for shapes in self.param_shapes() for s in shapes]

    def flat_state_shapes(self) -> list[Shape]:
        return [s for shapes in self.state_shapes() for s in shapes]

    def init_params(self, rng: np.random.Generator) -> list[list[np.ndarray]]:
        return [layer.init_params(rng) for layer in self.layers]

    def init_state(self) -> list[list[np.ndarray]]:
        return [layer.init_state() for layer in self.layers]

    def unflatten(self, arrays: list, shapes_per_layer: list[list[Shape]]) -> list[list]:
        out, i = [], 0
        for shapes in shapes_per_layer:
            out.append(list(arrays[i : i + len(shapes)]))
            i += len(shapes)
        return out

    # -- running -------------------------------------------------------------------------------

    def forward(
        self,
        xp,
        tensors: dict[str, Any],
        params: list[list],
        states: list[list],
        training: bool,
        with_loss: bool = True,
        loss_dtype: Any = None,
    ) -> list[Any]:
        """Runs every layer (loss layers only when ``with_loss``), adding their outputs to
        ``tensors``; returns each layer's backward context (None for skipped layers).
        ``loss_dtype`` casts the loss layers' inputs (float32 losses under float16 compute)."""
        ctxs: list[Any] = []
        for i, layer in enumerate(self.layers):
            if layer.is_loss and not with_loss:
                ctxs.append(None)
                continue
            inputs = [tensors[b] for b in layer.bottom]
            if layer.is_loss and loss_dtype is not None:
                inputs = [x.astype(loss_dtype, copy=False) for x in inputs]
            outs, ctx = layer.forward(xp, inputs, params[i], states[i], training)
            for top, out in zip(layer.top, outs):
                tensors[top] = out
            if training:
                layer.update_state(xp, ctx, states[i])
            ctxs.append(ctx)
        return ctxs

    def backward(
        self,
        xp,
        ctxs: list[Any],
        params: list[list],
        loss_scales: dict[str, float],
        grad_dtype: Any = None,
    ) -> tuple[list[list], dict[str, Any]]:
        """Gradients of ``sum(loss_scales[loss top] * loss)``.

        Returns the parameter gradients per layer (None where a layer got no gradient) and
        the gradients of the input tensors that are ``grad_sources``.  ``grad_dtype`` casts
        the loss layers' gradients (back to float16 under mixed precision).
        """
        grads: dict[str, Any] = {}
        param_grads: list[list] = [[None] * len(p) for p in params]
        for i in reversed(range(len(self.layers))):
            layer = self.layers[i]
            if layer.is_loss:
                scale = loss_scales.get(layer.top[0])
                if not scale:
                    continue
                grad_outputs = [scale]
            else:
                grad_outputs = [grads.pop(t, None) for t in layer.top]
                if all(g is None for g in grad_outputs):
                    continue
            grad_inputs, grad_params = layer.backward(xp, grad_outputs, ctxs[i], params[i])
            if layer.is_loss and grad_dtype is not None:
                grad_inputs = [None if g is None else g.astype(grad_dtype) for g in grad_inputs]
            param_grads[i] = list(grad_params)
            for name, needed, g in zip(layer.bottom, layer.input_grad_mask, grad_inputs):
                if not needed or g is None:
                    continue
                grads[name] = g if name not in grads else grads[name] + g
        return param_grads, grads

    def prediction_inputs(self) -> list[tuple[Layer, str]]:
        """For each loss layer, the layer and the name of its logits tensor."""
        return [(layer, layer.bottom[0]) for layer in self.loss_layers]
