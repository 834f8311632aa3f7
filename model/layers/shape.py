"""Layers that move values around: Concat, Reshape, Slice, Gather, Scale."""

from __future__ import annotations

from typing import Any

from .base import Layer, Shape, product, register


@register
class Concat(Layer):
    """Concatenates 2-D inputs on the last dimension; 3-D inputs on ``axis`` (1: slots, the
    default, or 2: vectors)."""

    type_name = "Concat"
    num_inputs = (1, None)

    def infer_shapes(self) -> list[Shape]:
        ranks = {len(s) + 1 for s in self.input_shapes}
        if len(ranks) != 1 or not ranks <= {2, 3}:
            raise self.error(f"inputs must all be 2-D or all 3-D, got {self.input_shapes}")
        if ranks == {2} or all(self.input_flat):
            # HugeCTR's 2-D tensors concatenate on their last dimension
            self.axis = 1 if ranks == {2} else 2
        else:
            self.axis = int(self.param("axis", 1))
            if self.axis not in (1, 2):
                raise self.error(f"axis must be 1 or 2 for 3-D inputs, got {self.axis}")
        cat = self.axis - 1
        first = self.input_shapes[0]
        for s in self.input_shapes[1:]:
            if any(s[i] != first[i] for i in range(len(s)) if i != cat):
                raise self.error(f"input shapes {self.input_shapes} do not line up")
        self.sizes = [s[cat] for s in self.input_shapes]
        out = list(first)
        out[cat] = sum(self.sizes)
        return [tuple(out)]

    def flat_outputs(self) -> list[bool]:
        return [len(self.output_shapes[0]) == 2 and all(self.input_flat)]

    def forward(self, xp, inputs, params, state, training):
        return [xp.concatenate(inputs, axis=self.axis)], None

    def backward(self, xp, grad_outputs, ctx, params):
        g = grad_outputs[0]
        out, start = [], 0
        for n in self.sizes:
            out.append(g[:, start : start + n] if self.axis == 1 else g[:, :, start : start + n])
            start += n
        return out, []


@register
class Reshape(Layer):
    """Reshape per sample.

    - ``selected`` (slot list), 3-D input [S, D]: keeps those slots, output [len * D];
    - ``time_step`` > 0: output [time_step, leading_dim];
    - otherwise ``leading_dim`` is the new last dimension: [leading_dim] when it equals the
      values per sample, else [values / leading_dim, leading_dim] (HugeCTR makes that
      [batch * values / leading_dim, leading_dim]: the same values in the same order);
    - ``shape`` (a list, ``tf.reshape``'s per-sample shape) gives the output shape exactly,
      ``[]`` one value per sample.
    """

    type_name = "Reshape"

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        self.leading_dim = int(self.param("leading_dim", 1))
        self.time_step = int(self.param("time_step", 0) or 0)
        selected = self.param("selected", None)
        if isinstance(selected, bool):  # DenseLayer-style flag, slots in selected_slots
            selected = self.param("selected_slots", []) if selected else None
        self.selected = [int(s) for s in selected] if selected else None
        shape = self.param("shape", None)
        self.shape = None if shape is None else tuple(int(d) for d in shape)

    def infer_shapes(self) -> list[Shape]:
        shape = self.input_shapes[0]
        n = product(shape)
        if self.shape is not None:
            if product(self.shape) != n or any(d < 1 for d in self.shape):
                raise self.error(f"[batch, {', '.join(map(str, shape))}] cannot become "
                                 f"[batch, {', '.join(map(str, self.shape))}]")
            return [self.shape]
        if self.selected is not None:
            self.check_rank(shape, (3,))
            bad = [s for s in self.selected if not 0 <= s < shape[0]]
            if bad:
                raise self.error(f"selected slots {bad} are outside [0, {shape[0]})")
            return [(len(self.selected) * shape[1],)]
        if self.time_step > 0:
            if n != self.time_step * self.leading_dim:
                raise self.error(
                    f"{n} values per sample do not make [{self.time_step}, {self.leading_dim}]"
                )
            return [(self.time_step, self.leading_dim)]
        if self.leading_dim < 1 or n % self.leading_dim:
            raise self.error(
                f"leading_dim {self.leading_dim} does not divide the {n} values per sample"
            )
        if n == self.leading_dim:
            return [(n,)]
        return [(n // self.leading_dim, self.leading_dim)]

    def flat_outputs(self) -> list[bool]:
        return [self.selected is None and self.time_step <= 0 and self.shape is None
                and len(self.output_shapes[0]) == 2]

    def forward(self, xp, inputs, params, state, training):
        x = inputs[0]
        if self.selected is not None:
            y = x[:, self.selected, :]
            return [y.reshape(x.shape[0], -1)], x.shape
        return [x.reshape(x.shape[0], *self.output_shapes[0])], x.shape

    def backward(self, xp, grad_outputs, ctx, params):
        g = grad_outputs[0]
        if self.selected is None:
            return [g.reshape(ctx)], []
        dx = xp.zeros(ctx, dtype=g.dtype)
        g3 = g.reshape(g.shape[0], len(self.selected), ctx[2])
        for j, slot in enumerate(self.selected):
            dx[:, slot] += g3[:, j]
        return [dx], []


@register
class Slice(Layer):
    """One output per ``[start, end)`` range of the last dimension; ranges may overlap."""

    type_name = "Slice"
    num_outputs = (1, None)

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        self.ranges = [(int(a), int(b)) for a, b in self.param("ranges", [])]
        if len(self.ranges) != len(self.top):
            raise self.error(f"{len(self.ranges)} ranges for {len(self.top)} top tensors")

    def infer_shapes(self) -> list[Shape]:
        shape = self.input_shapes[0]
        for a, b in self.ranges:
            if not 0 <= a < b <= shape[-1]:
                raise self.error(f"range ({a}, {b}) is not inside [0, {shape[-1]}]")
        return [(*shape[:-1], b - a) for a, b in self.ranges]

    def forward(self, xp, inputs, params, state, training):
        x = inputs[0]
        return [x[..., a:b] for a, b in self.ranges], x.shape

    def backward(self, xp, grad_outputs, ctx, params):
        if len(self.ranges) == 1 and self.ranges[0] == (0, ctx[-1]):
            return [grad_outputs[0]], []
        dx = xp.zeros(ctx, dtype=grad_outputs[0].dtype)
        for (a, b), g in zip(self.ranges, grad_outputs):
            if g is not None:
                dx[..., a:b] += g
        return [dx], []


@register
class Gather(Layer):
    """Picks ``indices`` along the first per-sample dimension: [N, ...] -> [len, ...]."""

    type_name = "Gather"

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        self.indices = [int(i) for i in self.param("indices", [])]
        if not self.indices:
            raise self.error("indices must not be empty")

    def infer_shapes(self) -> list[Shape]:
        shape = self.input_shapes[0]
        bad = [i for i in self.indices if not 0 <= i < shape[0]]
        if bad:
            raise self.error(f"indices {bad} are outside [0, {shape[0]})")
        return [(len(self.indices), *shape[1:])]

    def forward(self, xp, inputs, params, state, training):
        x = inputs[0]
        return [x[:, self.indices]], x.shape

    def backward(self, xp, grad_outputs, ctx, params):
        g = grad_outputs[0]
        dx = xp.zeros(ctx, dtype=g.dtype)
        for j, i in enumerate(self.indices):
            dx[:, i] += g[:, j]
        return [dx], []


@register
class Scale(Layer):
    """Repeats a 2-D input ``factor`` times.  Axis 0 (x direction) repeats each value in place:
    [N] -> [N * factor].  Axis 1 (y direction) repeats the whole row, which HugeCTR makes
    ``factor`` rows of the batch: here per sample [N] -> [factor, N]."""

    type_name = "Scale"

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        self.axis = int(self.param("axis", 0, "scale_param"))
        self.factor = int(self.param("factor", 1, "scale_param"))
        if self.axis not in (0, 1) or self.factor < 1:
            raise self.error(f"needs axis 0 or 1 and factor >= 1, got {self.axis}, {self.factor}")

    def infer_shapes(self) -> list[Shape]:
        self.check_rank(self.input_shapes[0], (2,))
        n = self.input_shapes[0][0]
        return [(n * self.factor,)] if self.axis == 0 else [(self.factor, n)]

    def flat_outputs(self) -> list[bool]:
        return [self.axis == 1]

    def forward(self, xp, inputs, params, state, training):
        x = inputs[0]
        if self.axis == 0:
            return [xp.repeat(x, self.factor, axis=1)], None
        return [xp.broadcast_to(x[:, None, :], (x.shape[0], self.factor, x.shape[1])).copy()], None

    def backward(self, xp, grad_outputs, ctx, params):
        g = grad_outputs[0]
        n = self.input_shapes[0][0]
        if self.axis == 0:
            return [g.reshape(g.shape[0], n, self.factor).sum(axis=2)], []
        return [g.sum(axis=1)], []


@register
class FusedReshapeConcat(Layer):
    """DIN's split of sequence embeddings [S, D_i] (several inputs): concatenated on the
    vector, the first S - 1 slots (the history) [S - 1, sum D_i] and the last slot (the
    item) [sum D_i]."""

    type_name = "FusedReshapeConcat"
    num_inputs = (1, None)
    num_outputs = (2, 2)

    def infer_shapes(self) -> list[Shape]:
        for s in self.input_shapes:
            self.check_rank(s, (3,))
        slots = {s[0] for s in self.input_shapes}
        if len(slots) != 1 or min(slots) < 2:
            raise self.error(f"inputs need one slot count >= 2, got {self.input_shapes}")
        self.sizes = [s[1] for s in self.input_shapes]
        s, d = self.input_shapes[0][0], sum(self.sizes)
        return [(s - 1, d), (d,)]

    def flat_outputs(self) -> list[bool]:
        return [True, False]

    def forward(self, xp, inputs, params, state, training):
        cat = xp.concatenate(inputs, axis=2)
        return [cat[:, :-1], cat[:, -1]], None

    def backward(self, xp, grad_outputs, ctx, params):
        his, item = grad_outputs
        b = (his if his is not None else item).shape[0]
        s, d = self.input_shapes[0][0], sum(self.sizes)
        full = xp.zeros((b, s, d), dtype=(his if his is not None else item).dtype)
        if his is not None:
            full[:, :-1] = his
        if item is not None:
            full[:, -1] = item
        out, start = [], 0
        for n in self.sizes:
            out.append(full[:, :, start : start + n])
            start += n
        return out, []


@register
class FusedReshapeConcatGeneral(Layer):
    """Concatenates sequence embeddings [S, D_i] on the vector: [S, sum D_i] (HugeCTR's
    [batch * S, sum D_i], the same values in the same order)."""

    type_name = "FusedReshapeConcatGeneral"
    num_inputs = (1, None)

    def infer_shapes(self) -> list[Shape]:
        for s in self.input_shapes:
            self.check_rank(s, (3,))
        if len({s[0] for s in self.input_shapes}) != 1:
            raise self.error(f"inputs need one slot count, got {self.input_shapes}")
        self.sizes = [s[1] for s in self.input_shapes]
        return [(self.input_shapes[0][0], sum(self.sizes))]

    def flat_outputs(self) -> list[bool]:
        return [True]

    def forward(self, xp, inputs, params, state, training):
        return [xp.concatenate(inputs, axis=2)], None

    def backward(self, xp, grad_outputs, ctx, params):
        g = grad_outputs[0]
        out, start = [], 0
        for n in self.sizes:
            out.append(g[:, :, start : start + n])
            start += n
        return out, []
