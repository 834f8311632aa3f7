"""Hot reload under load: a new version is picked up by polling and swapped in while clients
keep sending requests; none fails, and every answer is wholly the version it names (that
version's InferenceModel.predict on the same rows).  A broken version is refused and the old
one serves on."""

from __future__ import annotations

import logging
import shutil
import threading

import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.http as th
from polling import until

from tierserve.clients.demo_model import train_demo_model, write_repository
from tierserve.model.batch import Batch, SparseInput
from tierserve.server.app import BackgroundServer
from tierserve.server.inference_model import InferenceModel, InferenceParams
from tierserve.server.settings import Settings


def _inputs(des, cat):
    a = th.InferInput("DES", list(des.shape), "FP32")
    a.set_data_from_numpy(des)
    b = th.InferInput("CATCOLUMN", list(cat.shape), "INT64")
    b.set_data_from_numpy(cat)
    return [a, b]


def _reference(demo, des, cat) -> np.ndarray:
    """The version's own answer: InferenceModel over its files with a private hash map."""
    params = InferenceParams(
        model_name="dlrm", max_batchsize=64, hit_rate_threshold=0.9,
        dense_model_file=str(demo.dense_file), sparse_model_files=[str(p) for p in demo.sparse_files],
        use_gpu_embedding_cache=False, cache_size_percentage=0.5, i64_input_key=True,
        volatile_db={"type": "hash_map"},
    )  # fmt: skip
    model = InferenceModel(str(demo.graph), params)
    try:
        rows = des.shape[0]
        sparse = SparseInput(cat.reshape(-1), np.arange(cat.size + 1, dtype=np.int64), cat.shape[1])
        batch = Batch(np.zeros((rows, 1), np.float32), des, (sparse,))
        return model.predict_batch(batch)
    finally:
        model.close()


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    work = tmp_path_factory.mktemp("reload")
    first = train_demo_model(work / "a", iterations=20, batch_size=256, seed=1)
    second = train_demo_model(work / "b", iterations=60, batch_size=256, seed=1)
    return work, first, second


def test_new_version_swaps_in_under_load_and_broken_one_is_refused(models, caplog):
    work, first, second = models
    repo = work / "repo"
    write_repository(first, repo)
    settings = Settings.build(model_repository=repo, http_port=0, grpc_port=0,
                              poll_interval_s=0.1)  # fmt: skip
    rng = np.random.default_rng(0)
    des = rng.random((8, 13), dtype=np.float32)
    cat = rng.integers(0, 300, (8, 8)).astype(np.int64)
    failures: list[BaseException] = []
    versions: set[str] = set()
    answers: list[tuple[str, np.ndarray]] = []
    stop = threading.Event()

    with BackgroundServer(settings) as server:

        def load(i: int) -> None:
            client = th.InferenceServerClient(server.http_url)
            g = tg.InferenceServerClient(server.grpc_url)
            while not stop.is_set():
                try:
                    r = client.infer("dlrm", _inputs(des, cat))
                    versions.add(r.get_response()["model_version"])
                    answers.append((r.get_response()["model_version"], r.as_numpy("OUTPUT0")))
                    a = tg.InferInput("DES", list(des.shape), "FP32")
                    a.set_data_from_numpy(des)
                    b = tg.InferInput("CATCOLUMN", list(cat.shape), "INT64")
                    b.set_data_from_numpy(cat)
                    g.infer("dlrm", [a, b])
                except BaseException as exc:
                    failures.append(exc)

        clients = [threading.Thread(target=load, args=(i,)) for i in range(4)]
        for t in clients:
            t.start()
        try:
            h = th.InferenceServerClient(server.http_url)
            v1 = h.infer("dlrm", _inputs(des, cat)).as_numpy("OUTPUT0")
            write_repository(second, repo, version=2)
            assert until(lambda: h.get_model_metadata("dlrm")["versions"] == ["2"])
            v2 = h.infer("dlrm", _inputs(des, cat)).as_numpy("OUTPUT0")
            assert not np.allclose(v1, v2)  # the new weights serve

            # version 3 is broken: its dense file is truncated
            with caplog.at_level(logging.ERROR, logger="tierserve.server.runtime.repository"):
                broken = repo / "dlrm" / ".3"
                shutil.copytree(repo / "dlrm" / "2", broken)
                dense = next(broken.glob("*_dense_*.model"))
                dense.write_bytes(dense.read_bytes()[:100])
                broken.rename(repo / "dlrm" / "3")
                assert until(lambda: "version 3 failed to load" in caplog.text)
            assert "keeps serving" in caplog.text
            assert h.get_model_metadata("dlrm")["versions"] == ["2"]
            np.testing.assert_allclose(
                h.infer("dlrm", _inputs(des, cat)).as_numpy("OUTPUT0"), v2, atol=1e-6
            )
            index = h.get_model_repository_index()
            assert index[0]["state"] == "READY" and index[0]["version"] == "2"
        finally:
            stop.set()
            for t in clients:
                t.join()
    assert not failures, failures[0]
    assert {"1", "2"} <= versions
    expected = {"1": _reference(first, des, cat), "2": _reference(second, des, cat)}
    assert not np.allclose(expected["1"], expected["2"], atol=1e-4)
    for version, answer in answers:
        np.testing.assert_allclose(answer, expected[version], atol=1e-5, err_msg=version)
