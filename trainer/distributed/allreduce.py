"""Data-parallel dense gradients: one fused allreduce per step instead of one per tensor.

Each rank's gradients are of its own mean loss over its ``n`` samples.  The global batch's
gradient is ``sum_r n_r * g_r / sum_r n_r``, so every rank sends ``n_r * g_r`` (all tensors
packed into buffers of at most :data:`FUSED_BUFFER_BYTES`), its ``n_r * loss_r`` and ``n_r``
in the same buffer, and divides by the summed ``n``.  That is exact for unequal shares too
(the last batch of an epoch), and gives the global batch's loss for free.
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: The largest buffer one allreduce carries (DLRM-sized models need one).
FUSED_BUFFER_BYTES = 64 << 20


def allreduce_gradients(comm: Any, param_grads: list[list[Any]], loss: float,
                        n_local: int) -> tuple[float, int]:
    """Replace every gradient in ``param_grads`` (lists per layer, ``None`` entries kept) by
    the global batch's, in place; returns the global batch's loss and sample count."""
    slots = [(i, j) for i, gs in enumerate(param_grads) for j, g in enumerate(gs)
             if g is not None]
    sizes = [int(np.prod(param_grads[i][j].shape)) for i, j in slots]
    per_buffer = FUSED_BUFFER_BYTES // 4
    groups: list[list[int]] = [[]]
    filled = 0
    for k, size in enumerate(sizes):
        if groups[-1] and filled + size > per_buffer:
            groups.append([])
            filled = 0
        groups[-1].append(k)
        filled += size
    weight = np.float32(n_local)
    total = loss_sum = None
    for g, group in enumerate(groups):
        last = g == len(groups) - 1
        n = sum(sizes[k] for k in group) + (2 if last else 0)
        buf = np.empty(n, dtype=np.float32)
        at = 0
        for k in group:
            i, j = slots[k]
            np.multiply(np.asarray(param_grads[i][j], dtype=np.float32).reshape(-1), weight,
                        out=buf[at : at + sizes[k]])
            at += sizes[k]
        if last:
            buf[at] = np.float32(loss * n_local if n_local else 0.0)
            buf[at + 1] = np.float32(n_local)
        comm.allreduce_sum(buf, "dense gradient allreduce")
        if last:
            loss_sum, total = float(buf[at]), int(round(float(buf[at + 1])))
        groups[g] = (group, buf)
    scale = np.float32(1.0 / max(total, 1))
    for group, buf in groups:
        at = 0
        for k in group:
            i, j = slots[k]
            shape = param_grads[i][j].shape
            view = buf[at : at + sizes[k]]
            view *= scale
            param_grads[i][j] = view.reshape(shape)
            at += sizes[k]
    return loss_sum / max(total, 1), total
