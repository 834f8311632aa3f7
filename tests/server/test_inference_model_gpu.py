"""InferenceModel with the embedding cache on a GPU: combining and the dense network run on
that GPU too, and the answers are the CPU path's."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from tierserve.cache.device import cupy_or_none
from tierserve.clients.demo_model import train_demo_model
from tierserve.server.inference_model import InferenceModel, InferenceParams
from tierserve.trainer.hugectr.inference_data import wrapped_batches

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def cupy():
    cp = cupy_or_none()
    if cp is None:
        pytest.skip("needs cupy and a CUDA device")
    return cp


@pytest.fixture(scope="module")
def demo(tmp_path_factory, cupy):
    return train_demo_model(tmp_path_factory.mktemp("gpu-im"), iterations=20, batch_size=256)


def _model(demo, cache: bool) -> InferenceModel:
    return InferenceModel(str(demo.graph), InferenceParams(
        model_name="dlrm", max_batchsize=256, hit_rate_threshold=0.9,
        dense_model_file=str(demo.dense_file),
        sparse_model_files=[str(f) for f in demo.sparse_files],
        use_gpu_embedding_cache=cache, cache_size_percentage=0.5, i64_input_key=True,
        volatile_db={"type": "hash_map"},
    ))  # fmt: skip


def test_the_network_follows_the_cache_to_the_gpu_and_answers_as_the_cpu_path(demo, cupy):
    gpu, cpu = _model(demo, True), _model(demo, False)
    try:
        assert gpu.xp is cupy and cpu.xp is np
        assert all(isinstance(w, cupy.ndarray) for layer in gpu.network.params for w in layer)
        assert all(isinstance(w, np.ndarray) for layer in cpu.network.params for w in layer)
        batches = list(wrapped_batches(gpu.graph, demo.eval_source, "Norm", "Sum", None, 256, 4))
        for _ in range(2):  # the second pass reads the rows the first one cached
            for b in batches:
                got = gpu.predict_batch(b)
                assert isinstance(got, np.ndarray) and got.dtype == np.float32
                np.testing.assert_allclose(got, cpu.predict_batch(b), rtol=1e-4, atol=1e-5)
        assert min(gpu.stats()["cache_hit_rate"].values()) > 0.5  # the second pass hits
        # The server predicts on its own threads: the device is made current on each.
        answers: list = []
        thread = threading.Thread(target=lambda: answers.append(gpu.predict_batch(batches[0])))
        thread.start()
        thread.join()
        np.testing.assert_allclose(answers[0], cpu.predict_batch(batches[0]), rtol=1e-4, atol=1e-5)
    finally:
        gpu.close()
        cpu.close()
