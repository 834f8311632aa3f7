"""deploy/triton's Python-backend model inside a real tritonserver gives tierserve's answers."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from services.triton import site_packages_parameter

from tierserve.clients.demo_model import train_demo_model, write_repository
from tierserve.server.datasets import wrapped_batches
from tierserve.trainer.graph_json import load_graph_json

pytestmark = pytest.mark.slow

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "triton" / "dlrm"


def test_triton_python_backend_serves_the_demo_model(triton_server_factory, tmp_path):
    import tritonclient.grpc as tg
    import tritonclient.http as th

    demo = train_demo_model(tmp_path / "train", iterations=20, batch_size=256)
    write_repository(demo, tmp_path / "tierserve")
    triton = tmp_path / "triton"
    (triton / "dlrm" / "1").mkdir(parents=True)
    shutil.copy2(DEPLOY / "1" / "model.py", triton / "dlrm" / "1" / "model.py")
    config = (
        (DEPLOY / "config.pbtxt")
        .read_text()
        .replace("/models/dlrm/ps.json", str(tmp_path / "tierserve" / "ps.json"))
    )
    (triton / "dlrm" / "config.pbtxt").write_text(config + site_packages_parameter() + "\n")

    batch = next(iter(wrapped_batches(load_graph_json(demo.graph), demo.data_source, "Norm",
                                      "Sum", None, 16, 1)))  # fmt: skip
    des = batch.dense.astype(np.float32)
    cat = batch.sparse[0].keys.reshape(16, -1).astype(np.int64)
    expected = np.asarray(demo.model.predict_batch(batch))

    server = triton_server_factory(triton)
    try:
        client = th.InferenceServerClient(server.http_url)
        assert client.is_model_ready("dlrm")
        a = th.InferInput("DES", list(des.shape), "FP32")
        a.set_data_from_numpy(des)
        b = th.InferInput("CATCOLUMN", list(cat.shape), "INT64")
        b.set_data_from_numpy(cat)
        np.testing.assert_allclose(client.infer("dlrm", [a, b]).as_numpy("OUTPUT0"), expected,
                                   atol=1e-5)  # fmt: skip
        g = tg.InferenceServerClient(server.grpc_url)
        a = tg.InferInput("DES", [1, 13], "FP32")
        a.set_data_from_numpy(des[:1])
        b = tg.InferInput("CATCOLUMN", [1, cat.shape[1]], "INT64")
        b.set_data_from_numpy(cat[:1])
        np.testing.assert_allclose(g.infer("dlrm", [a, b]).as_numpy("OUTPUT0"), expected[:1],
                                   atol=1e-5)  # fmt: skip
        client.close()
    finally:
        server.stop()
