"""A repository made by ``tierserve triton-repo`` inside a real tritonserver gives tierserve's
answers: a one-hot DLRM with 64-bit keys, a multi-hot model with 32-bit keys and an embedding
store, over HTTP (JSON and binary tensors) and gRPC; explicit model control; a broken version;
Kafka updates; poll mode picking up a new version.

One tritonserver (explicit model control) serves the module; the poll test starts its own.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from polling import until
from triton_models import (
    MH_DIM,
    MH_NNZ,
    MH_SLOTS,
    copy_version,
    from_demo,
    model_entry,
    store_lookup,
    train_multi_hot32,
    write_ps_json,
)

from tierserve.clients.demo_model import EMBEDDING_DIM, SLOT_SIZES, train_demo_model
from tierserve.clients.triton_repo import generate
from tierserve.model.graph_json import load_graph_json
from tierserve.trainer.hugectr.inference_data import wrapped_batches

pytestmark = pytest.mark.slow

SLOTS = len(SLOT_SIZES)


def _batch(trained, rows: int):
    graph = load_graph_json(trained.graph)
    return next(iter(wrapped_batches(graph, trained.data_source, "Norm", "Sum", None, rows, 1,
                                     i64_input_key=trained.i64_keys)))  # fmt: skip


class Fixture:
    """What the module's tests share: the models, the repositories and the server."""

    def __init__(self, root: Path, server_factory) -> None:
        self.root = root
        self.dlrm = from_demo(train_demo_model(root / "train", iterations=20, batch_size=256,
                                               num_samples=8192))  # fmt: skip
        self.mh32 = train_multi_hot32(root / "mh32")
        # Repository A, 64-bit keys: the DLRM and an embedding store over its table.
        self.repo64 = root / "repo64"
        copy_version(self.dlrm, self.repo64 / "dlrm" / "1")
        copy_version(self.dlrm, self.repo64 / "store" / "1", graph=False)
        store = model_entry("store", self.dlrm, SLOTS, EMBEDDING_DIM, SLOTS)
        store.update(dense_file="", network_file="")
        write_ps_json(self.repo64, [model_entry("dlrm", self.dlrm, SLOTS, EMBEDDING_DIM, SLOTS),
                                    store], supportlonglong=True)  # fmt: skip
        # Repository B, 32-bit keys: the multi-hot model.
        self.repo32 = root / "repo32"
        copy_version(self.mh32, self.repo32 / "mh32" / "1")
        write_ps_json(self.repo32, [model_entry("mh32", self.mh32, MH_SLOTS, MH_DIM,
                                                MH_SLOTS * MH_NNZ)],
                      supportlonglong=False)  # fmt: skip
        self.triton = root / "triton"
        self.clients: list = []
        generate(self.repo64, self.triton)
        generate(self.repo32, self.triton)
        self.server = server_factory(self.triton, model_control_mode="explicit",
                                     load_models=["dlrm", "store", "mh32"])  # fmt: skip

    def http(self):
        import tritonclient.http as th

        self.clients.append(th.InferenceServerClient(self.server.http_url))
        return self.clients[-1]

    def grpc(self):
        import tritonclient.grpc as tg

        self.clients.append(tg.InferenceServerClient(self.server.grpc_url))
        return self.clients[-1]

    def stop(self) -> None:
        for client in self.clients:  # open connections would hold tritonserver's exit 5 s
            client.close()
        self.server.stop()


@pytest.fixture(scope="module")
def triton(tmp_path_factory, triton_server_factory):
    fixture = Fixture(tmp_path_factory.mktemp("triton"), triton_server_factory)
    yield fixture
    fixture.stop()


def infer(client, model: str, arrays: dict[str, np.ndarray], binary: bool = True) -> np.ndarray:
    """OUTPUT0 of one request through a tritonclient HTTP or gRPC client."""
    import tritonclient.grpc as tg
    import tritonclient.http as th

    datatypes = {np.dtype(np.float32): "FP32", np.dtype(np.int64): "INT64",
                 np.dtype(np.int32): "INT32"}  # fmt: skip
    http = isinstance(client, th.InferenceServerClient)
    lib = th if http else tg
    inputs = []
    for name, array in arrays.items():
        tensor = lib.InferInput(name, list(array.shape), datatypes[array.dtype])
        if http:
            tensor.set_data_from_numpy(array, binary_data=binary)
        else:
            tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    outputs = [th.InferRequestedOutput("OUTPUT0", binary_data=binary)] if http else None
    return client.infer(model, inputs, outputs=outputs).as_numpy("OUTPUT0")


def dlrm_request(batch, rows: int) -> dict[str, np.ndarray]:
    return {"DES": batch.dense[:rows].astype(np.float32),
            "CATCOLUMN": batch.sparse[0].keys.reshape(-1, SLOTS)[:rows].astype(np.int64)}  # fmt: skip


def mh32_request(batch) -> dict[str, np.ndarray]:
    sparse = batch.sparse[0]
    return {"DES": batch.dense.astype(np.float32), "CATCOLUMN": sparse.keys.astype(np.int32),
            "ROWINDEX": sparse.row_offsets.astype(np.int32)}  # fmt: skip


@pytest.mark.parametrize("rows", [1, 64])
def test_answers_equal_tierserve_over_http_and_grpc(triton, rows):
    dlrm_batch = _batch(triton.dlrm, rows)
    dlrm_expected = np.asarray(triton.dlrm.model.predict_batch(dlrm_batch))
    mh_batch = _batch(triton.mh32, rows)
    mh_expected = np.asarray(triton.mh32.model.predict_batch(mh_batch))
    assert mh_batch.sparse[0].keys.size > rows * MH_SLOTS  # some rows have several keys a slot
    keys = np.concatenate([dlrm_batch.sparse[0].keys.astype(np.int64), [2**40, -5]])
    store_expected = store_lookup(triton.dlrm.sparse[0], EMBEDDING_DIM, keys).reshape(-1)
    store_request = {"KEYS": keys, "NUMKEYS": np.array([keys.size], np.int32)}
    http, grpc = triton.http(), triton.grpc()
    for client, binary in ((http, True), (http, False), (grpc, True)):
        got = infer(client, "dlrm", dlrm_request(dlrm_batch, rows), binary)
        np.testing.assert_allclose(got, dlrm_expected, atol=1e-5)
        got = infer(client, "mh32", mh32_request(mh_batch), binary)
        assert got.shape == (rows, 1)
        np.testing.assert_allclose(got, mh_expected, atol=1e-5)
        got = infer(client, "store", store_request, binary)
        np.testing.assert_allclose(got, store_expected, atol=1e-6)


def _presented(client, model: str) -> dict:
    """What perf_analyzer reads of ``model``: the metadata's tensors and the config's batch
    size, tensors (dims, optional) and whether it batches dynamically."""
    meta, config = client.get_model_metadata(model), client.get_model_config(model)
    return {
        "metadata": [(key, t["name"], t["datatype"], t["shape"])
                     for key in ("inputs", "outputs") for t in meta[key]],
        "max_batch_size": config.get("max_batch_size", 0),
        "config": [(key, t["name"], t["data_type"], t.get("dims", []), t.get("optional", False))
                   for key in ("input", "output") for t in config[key]],
        "dynamic_batching": "dynamic_batching" in config,
    }  # fmt: skip


def test_tierserve_serve_presents_each_model_as_tritonserver_does(triton):
    """The same repositories under tierserve serve: metadata and config equal tritonserver's
    for the one-hot, the embedding-store and the multi-hot model."""
    from tierserve.server.app import BackgroundServer
    from tierserve.server.settings import Settings

    for repo, models in ((triton.repo64, ["dlrm", "store"]), (triton.repo32, ["mh32"])):
        settings = Settings.build(model_repository=repo, http_port=0, grpc_port=None,
                                  poll_interval_s=0)  # fmt: skip
        with BackgroundServer(settings) as ours:
            import tritonclient.http as th

            client = th.InferenceServerClient(ours.http_url)
            try:
                for model in models:
                    assert _presented(client, model) == _presented(triton.http(), model), model
            finally:
                client.close()


def test_a_bad_request_fails_alone_with_tierserve_message(triton):
    from concurrent.futures import ThreadPoolExecutor

    from tritonclient.utils import InferenceServerException

    batch = _batch(triton.dlrm, 4)
    good = dlrm_request(batch, 4)
    bad = dict(good, DES=np.where(np.arange(13) == 2, np.nan, good["DES"]).astype(np.float32))
    expected = np.asarray(triton.dlrm.model.predict_batch(batch))

    def call(request):
        try:
            return infer(triton.http(), "dlrm", request)
        except InferenceServerException as exc:
            return exc

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(call, [good, bad] * 8))
    for result in results[0::2]:
        np.testing.assert_allclose(result, expected, atol=1e-5)
    for result in results[1::2]:
        assert isinstance(result, InferenceServerException)
        assert "DES" in str(result) and "finite" in str(result).lower(), str(result)
    # 32-bit keys: a key that does not fit is refused naming it.
    mh = mh32_request(_batch(triton.mh32, 2))
    mh["CATCOLUMN"] = mh["CATCOLUMN"].astype(np.int32)
    bad_rowindex = dict(mh, ROWINDEX=mh["ROWINDEX"][:-1])
    with pytest.raises(InferenceServerException, match="ROWINDEX"):
        infer(triton.http(), "mh32", bad_rowindex)
    with pytest.raises(InferenceServerException, match="NUMKEYS"):
        infer(triton.http(), "store", {"KEYS": np.arange(3, dtype=np.int64),
                                       "NUMKEYS": np.array([2], np.int32)})  # fmt: skip


def test_explicit_unload_load_and_a_broken_version(triton):
    from tritonclient.utils import InferenceServerException

    client = triton.http()
    batch = _batch(triton.dlrm, 2)
    expected = np.asarray(triton.dlrm.model.predict_batch(batch))
    client.unload_model("dlrm")
    assert until(lambda: not client.is_model_ready("dlrm"), timeout=30)
    with pytest.raises(InferenceServerException):
        infer(client, "dlrm", dlrm_request(batch, 2))
    client.load_model("dlrm")
    assert client.is_model_ready("dlrm")
    np.testing.assert_allclose(infer(client, "dlrm", dlrm_request(batch, 2)), expected, atol=1e-5)

    # Version 2 with a dense file of the wrong size: Triton reports it not ready with
    # tierserve's reason, and the other models keep serving.
    # (broken after generating: the generator itself refuses a version it cannot read)
    broken = copy_version(triton.dlrm, triton.repo64 / "dlrm" / "2")
    generate(triton.repo64, triton.triton, models=["dlrm"])
    dense = broken / triton.dlrm.dense.name
    dense.write_bytes(dense.read_bytes()[:-8])
    with pytest.raises(InferenceServerException) as failure:
        client.load_model("dlrm")
    assert not client.is_model_ready("dlrm", "2")
    # Triton keeps the version that served before the failed reload.
    assert client.is_model_ready("dlrm", "1")
    np.testing.assert_allclose(infer(client, "dlrm", dlrm_request(batch, 2)), expected, atol=1e-5)
    log = triton.server.log_path.read_text()
    assert "tierserve: model 'dlrm' version 2 failed to load" in log
    assert triton.dlrm.dense.name in str(failure.value) or "dense" in str(failure.value)
    keys = np.arange(4, dtype=np.int64)
    assert infer(client, "store", {"KEYS": keys, "NUMKEYS": np.array([4], np.int32)}).shape == (
        4 * EMBEDDING_DIM,
    )
    assert infer(client, "mh32", mh32_request(_batch(triton.mh32, 1))).shape == (1, 1)
    # Remove it again: version 1 loads and serves.
    shutil.rmtree(broken)
    [generated] = generate(triton.repo64, triton.triton, models=["dlrm"])
    assert generated.removed_versions == ["2"]
    client.load_model("dlrm")
    np.testing.assert_allclose(infer(client, "dlrm", dlrm_request(batch, 2)), expected, atol=1e-5)


@pytest.mark.kafka
def test_kafka_update_changes_triton_answers(triton, kafka_broker):
    from tierserve.ps.kafka_producer import UpdateProducer

    repo = triton.root / "repo-kafka"
    copy_version(triton.dlrm, repo / "kdlrm" / "1")
    copy_version(triton.dlrm, repo / "kstore" / "1", graph=False)
    store = model_entry("kstore", triton.dlrm, SLOTS, EMBEDDING_DIM, SLOTS)
    store.update(dense_file="", network_file="")
    source = {"type": "kafka_message_queue", "brokers": kafka_broker.bootstrap,
              "poll_timeout_ms": 100, "metadata_refresh_interval_ms": 500}  # fmt: skip
    write_ps_json(repo, [model_entry("kdlrm", triton.dlrm, SLOTS, EMBEDDING_DIM, SLOTS), store],
                  supportlonglong=True, update_source=source)  # fmt: skip
    generate(repo, triton.triton)
    client = triton.http()
    client.load_model("kdlrm")
    client.load_model("kstore")
    batch = _batch(triton.dlrm, 1)
    request = dlrm_request(batch, 1)
    before = infer(client, "kdlrm", request)
    np.testing.assert_allclose(before, triton.dlrm.model.predict_batch(batch), atol=1e-5)
    keys = request["CATCOLUMN"].reshape(-1)
    vectors = np.full((keys.size, EMBEDDING_DIM), 0.5, np.float32)
    with UpdateProducer(kafka_broker.bootstrap) as producer:
        producer.publish("kdlrm", "sparse_embedding1", keys, vectors)
        producer.publish("kstore", "sparse_embedding1", keys, vectors)
    store_request = {"KEYS": keys, "NUMKEYS": np.array([keys.size], np.int32)}
    assert until(lambda: np.allclose(infer(client, "kstore", store_request), 0.5), timeout=30)
    assert until(lambda: not np.allclose(infer(client, "kdlrm", request), before), timeout=30)
    client.unload_model("kdlrm")
    client.unload_model("kstore")


def test_poll_mode_picks_up_a_new_version(tmp_path, triton, triton_server_factory):
    repo = tmp_path / "repo"
    copy_version(triton.dlrm, repo / "emb" / "1", graph=False)
    entry = model_entry("emb", triton.dlrm, SLOTS, EMBEDDING_DIM, SLOTS)
    entry.update(dense_file="", network_file="")
    write_ps_json(repo, [entry], supportlonglong=True)
    out = tmp_path / "triton"
    generate(repo, out)
    import tritonclient.http as th

    server = triton_server_factory(out, model_control_mode="poll",
                                   extra_args=["--repository-poll-secs", "1"])  # fmt: skip
    client = th.InferenceServerClient(server.http_url)
    try:
        keys = np.arange(1, 9, dtype=np.int64)
        request = {"KEYS": keys, "NUMKEYS": np.array([8], np.int32)}
        first = infer(client, "emb", request)
        # Version 2: every vector doubled.
        v2 = copy_version(triton.dlrm, repo / "emb" / "2", graph=False)
        from tierserve.ps.sparse_file import read_sparse_model, write_sparse_model

        folder = v2 / triton.dlrm.sparse[0].name
        table = read_sparse_model(folder, EMBEDDING_DIM)
        keys_all, emb = np.array(table.keys), np.array(table.embeddings) * 2
        del table
        shutil.rmtree(folder)
        write_sparse_model(folder, keys_all, emb)
        generate(repo, out)
        assert until(lambda: client.is_model_ready("emb", "2"), timeout=60)
        assert until(lambda: np.allclose(infer(client, "emb", request), 2 * first), timeout=30)
    finally:
        client.close()
        server.stop()
