"""Every layer gives the same forward and backward on cupy as on numpy (skipped without a GPU)."""

from __future__ import annotations

import numpy as np
import pytest

from tierserve.model.layers import build_layer

from .layer_cases import CASES, layer_config, num_tops

cupy = pytest.importorskip("cupy")
try:
    HAS_DEVICE = cupy.cuda.runtime.getDeviceCount() > 0
except Exception:  # noqa: BLE001 - no driver
    HAS_DEVICE = False

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not HAS_DEVICE, reason="no CUDA device visible")]


@pytest.mark.parametrize("case_id,config,shapes", [pytest.param(*c, id=c[0]) for c in CASES])
def test_cupy_matches_numpy(case_id, config, shapes):
    if case_id == "Dropout":
        pytest.skip("the device draws different random masks")
    rng = np.random.default_rng(0)
    layer = build_layer(layer_config(case_id, config, len(shapes), num_tops(config)))
    layer.build(shapes)
    params = layer.init_params(rng)
    state = layer.init_state()
    inputs = [rng.integers(0, 2, (4, *s)).astype(np.float32) if layer.is_loss and i == 1
              else rng.standard_normal((4, *s)).astype(np.float32)
              for i, s in enumerate(shapes)]
    if case_id == "CrossEntropyLoss":
        inputs[1] = rng.integers(0, shapes[0][0], (4, 1)).astype(np.float32)
    outs, ctx = layer.forward(np, inputs, params, state, True)
    grads_out = [np.float32(1.0)] if layer.is_loss else [np.ones_like(o) for o in outs]
    gin, gp = layer.backward(np, grads_out, ctx, params)

    c = cupy.asarray
    d_outs, d_ctx = layer.forward(cupy, [c(x) for x in inputs], [c(p) for p in params],
                                  [c(s) for s in state], True)
    d_grads_out = grads_out if layer.is_loss else [c(g) for g in grads_out]
    d_gin, d_gp = layer.backward(cupy, d_grads_out, d_ctx, [c(p) for p in params])
    for a, b in zip(outs, d_outs):
        np.testing.assert_allclose(cupy.asnumpy(b), a, rtol=1e-4, atol=1e-5)
    for a, b in zip(gin + gp, d_gin + d_gp):
        if a is not None:
            np.testing.assert_allclose(cupy.asnumpy(b), a, rtol=1e-4, atol=1e-5)
