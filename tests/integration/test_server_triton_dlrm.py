"""A DLRM trained as HugeCTR's DLRM sample trains it (13 dense inputs, 26 one-hot slots,
64-bit keys) and exported with ``fit(repository=...)``, served by ``tierserve triton-repo``'s
model in a real tritonserver 2.51 with ``max_batch_size`` 256: binary and JSON requests over
HTTP and gRPC, sent concurrently from the moment the server reports ready, all answer what
``InferenceModel`` answers.

The 2.51 stub is built with pybind11 2.10, which reads numpy's dtype descriptors with numpy 1's
layout.  Its embedded Python finds its prefix through the ``python3`` on PATH: started from a
shell with a virtual environment activated, it imports that environment's numpy 2, and then an
output handed over as ``pb_utils.Tensor(name, array)`` has 0 bytes (binary:
``binary_data_size`` 0, which tritonclient cannot reshape; JSON: 500 "output tensor shape does
not match size of output") and ``as_numpy()`` reads inputs as zeros.  tierserve's model then
refuses to load, naming the environment; ``tierserve triton-install``'s ``bin/tritonserver``
leaves virtual environments off PATH and serves.
"""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path

import numpy as np
import pytest
from services.triton import ensure_tritonserver

from tierserve.clients.triton_repo import generate

pytestmark = pytest.mark.slow

SLOTS, DENSE, DIM, MAX_BATCH = 26, 13, 16, 256


class Dlrm26:
    """The trained model, its repository, and reference answers from InferenceModel."""

    def __init__(self, root: Path) -> None:
        import tierserve.trainer as hugectr

        data = hugectr.DataGenerator(hugectr.DataGeneratorParams(
            format=hugectr.DataReaderType_t.Norm, label_dim=1, dense_dim=DENSE, num_slot=SLOTS,
            i64_input_key=True, source=str(root / "data" / "train" / "_file_list.txt"),
            eval_source=str(root / "data" / "eval" / "_file_list.txt"),
            slot_size_array=[97 + 13 * i for i in range(SLOTS)], nnz_array=[1] * SLOTS,
            check_type=hugectr.Check_t.Sum, num_files=1, eval_num_files=1,
            num_samples_per_file=4096, num_samples=4096, eval_num_samples=1024, seed=11,
        )).generate()  # fmt: skip
        solver = hugectr.CreateSolver(model_name="dlrm", max_eval_batches=1, batchsize_eval=256,
                                      batchsize=256, lr=0.01, vvgpu=[[0]], repeat_dataset=True,
                                      i64_input_key=True)  # fmt: skip
        reader = hugectr.DataReaderParams(data_reader_type=hugectr.DataReaderType_t.Norm,
                                          source=[data.train.source],
                                          eval_source=data.eval.source,
                                          check_type=hugectr.Check_t.Sum)  # fmt: skip
        optimizer = hugectr.CreateOptimizer(optimizer_type=hugectr.Optimizer_t.Adam)
        model = hugectr.Model(solver, reader, optimizer)
        model.add(hugectr.Input(label_dim=1, label_name="label", dense_dim=DENSE,
                                dense_name="dense", data_reader_sparse_param_array=[
                                    hugectr.DataReaderSparseParam("data1", 1, True, SLOTS)]))  # fmt: skip
        model.add(hugectr.SparseEmbedding(
            embedding_type=hugectr.Embedding_t.DistributedSlotSparseEmbeddingHash,
            workspace_size_per_gpu_in_mb=4, embedding_vec_size=DIM, combiner="sum",
            sparse_embedding_name="sparse_embedding1", bottom_name="data1", optimizer=optimizer))  # fmt: skip
        for kind, bottom, top, out in [
            ("InnerProduct", ["dense"], ["fc1"], 64), ("ReLU", ["fc1"], ["relu1"], None),
            ("InnerProduct", ["relu1"], ["fc2"], DIM), ("ReLU", ["fc2"], ["relu2"], None),
            ("Interaction", ["relu2", "sparse_embedding1"], ["interaction1"], None),
            ("InnerProduct", ["interaction1"], ["fc3"], 64), ("ReLU", ["fc3"], ["relu3"], None),
            ("InnerProduct", ["relu3"], ["fc4"], 1),
            ("BinaryCrossEntropyLoss", ["fc4", "label"], ["loss"], None),
        ]:  # fmt: skip
            model.add(hugectr.DenseLayer(layer_type=getattr(hugectr.Layer_t, kind),
                                         bottom_names=bottom, top_names=top,
                                         **({"num_output": out} if out else {})))  # fmt: skip
        model.compile()
        self.repo = root / "repo"
        model.fit(max_iter=12, display=1000, eval_interval=0, repository=str(self.repo),
                  export_interval=12)  # fmt: skip
        ps_json = self.repo / "ps.json"
        config = json.loads(ps_json.read_text())
        config["models"][0]["max_batch_size"] = MAX_BATCH
        ps_json.write_text(json.dumps(config))
        self.requests, self.expected = self._reference(data.eval.source)

    def _reference(self, eval_source: str):
        """Requests of 1, 64 and 256 rows of held-out data and InferenceModel's answers."""
        from tierserve.model.graph_json import load_graph_json
        from tierserve.ps.config import load_ps_config
        from tierserve.server.runtime.loader import RepositoryLoader
        from tierserve.trainer.hugectr.inference_data import epoch_batches

        folder = self.repo / "dlrm" / "1"
        loader = RepositoryLoader()
        try:
            servable = loader("dlrm", "1", folder, load_ps_config(self.repo / "ps.json"))
            servable.commit()
            graph = load_graph_json(folder / "dlrm.json")
            requests, expected = [], []
            for rows in (1, 64, MAX_BATCH):
                batch = next(iter(epoch_batches(graph, eval_source, "Norm", "Sum", None, rows)))
                requests.append({
                    "DES": np.ascontiguousarray(batch.dense, np.float32),
                    "CATCOLUMN": batch.sparse[0].keys.reshape(rows, SLOTS).astype(np.int64)})  # fmt: skip
                expected.append(np.asarray(servable.model.predict_batch(batch), np.float32))
            servable.close()
        finally:
            loader.close()
        return requests, expected


@pytest.fixture(scope="module")
def dlrm26(tmp_path_factory):
    return Dlrm26(tmp_path_factory.mktemp("dlrm26"))


def _infer(kind: str, url: str, request: dict[str, np.ndarray]) -> np.ndarray:
    import tritonclient.grpc as tg
    import tritonclient.http as th

    lib = tg if kind == "grpc" else th
    client = lib.InferenceServerClient(url)
    try:
        inputs = []
        for name, datatype in (("DES", "FP32"), ("CATCOLUMN", "INT64")):
            tensor = lib.InferInput(name, list(request[name].shape), datatype)
            if kind == "grpc":
                tensor.set_data_from_numpy(request[name])
            else:
                tensor.set_data_from_numpy(request[name], binary_data=kind == "binary")
            inputs.append(tensor)
        outputs = None
        if kind != "grpc":
            outputs = [th.InferRequestedOutput("OUTPUT0", binary_data=kind == "binary")]
        return client.infer("dlrm", inputs, outputs=outputs).as_numpy("OUTPUT0")
    finally:
        client.close()


def test_every_answer_from_the_moment_it_is_ready_equals_inference_model(
    dlrm26, triton_server_factory, tmp_path
):
    out = tmp_path / "triton"
    [generated] = generate(dlrm26.repo, out)
    assert generated.signature.max_batch_size == MAX_BATCH
    server = triton_server_factory(out)  # returns as /v2/health/ready says 200
    answers: list = []

    def send(kind: str, url: str, i: int) -> None:
        try:
            answers.append((kind, i, _infer(kind, url, dlrm26.requests[i])))
        except Exception as exc:  # noqa: BLE001 - every failure is reported below
            answers.append((kind, i, exc))

    calls = [(kind, url, i) for kind, url in (("binary", server.http_url),
                                               ("json", server.http_url),
                                               ("grpc", server.grpc_url))
             for i in range(len(dlrm26.requests))] * 3  # fmt: skip
    threads = [threading.Thread(target=send, args=call) for call in calls]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert len(answers) == len(calls)
    for kind, i, got in answers:
        assert not isinstance(got, Exception), (kind, i, repr(got))
        expected = dlrm26.expected[i]
        assert got.shape == expected.shape and got.dtype == np.float32, (kind, i, got.shape)
        np.testing.assert_allclose(got, expected, atol=1e-5, err_msg=f"{kind} request {i}")
    log = server.log_path.read_text()
    assert re.search(r"model dlrm version 1 is serving \(CPU instance; numpy 1\.", log), log[-2000:]


def test_started_from_an_activated_venv_the_model_refuses_naming_it(
    dlrm26, triton_server_factory, tmp_path
):
    """tritonserver started with a virtual environment first on PATH (an activated venv):
    the stub's embedded Python finds its prefix through that python3 and imports the venv's
    numpy 2, which this stub (pybind11 2.10) misreads: outputs of 0 bytes, inputs read as
    zeros.  tierserve's model probes the stub's tensors and refuses to load, naming the venv;
    no request is ever answered with an output of no data."""
    import os
    import sys

    import tritonclient.http as th
    from tritonclient.utils import InferenceServerException

    out = tmp_path / "triton"
    generate(dlrm26.repo, out)
    venv = Path(sys.prefix)
    assert (venv / "pyvenv.cfg").is_file(), "the suite runs in a virtual environment"
    install = ensure_tritonserver()
    env = dict(install.environment(), PATH=f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}")
    server = triton_server_factory(out, model_control_mode="explicit", env=env)
    client = th.InferenceServerClient(server.http_url)
    try:
        with pytest.raises(InferenceServerException) as refused:
            client.load_model("dlrm")
        assert not client.is_model_ready("dlrm")
        with pytest.raises(InferenceServerException):
            _infer("binary", server.http_url, dlrm26.requests[1])
    finally:
        client.close()
    message = str(refused.value)
    assert "misreads the arrays of numpy 2." in message, message
    assert f"runs in the virtual environment {venv}" in message, message


def test_bin_tritonserver_leaves_the_activated_venv_out(dlrm26, tmp_path):
    """The same shell, through ``tierserve triton-install``'s bin/tritonserver: the model
    serves on the backend's numpy 1 and answers as InferenceModel."""
    import os
    import subprocess
    import sys

    from polling import until

    from tierserve.clients.triton_install import wrapper_path, write_wrapper
    from tierserve.server.app import free_port

    out = tmp_path / "triton"
    generate(dlrm26.repo, out)
    install = ensure_tritonserver()
    write_wrapper(install.home)
    http, grpc, metrics = free_port(), free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env["PATH"] = f"{Path(sys.prefix) / 'bin'}{os.pathsep}{env['PATH']}"
    log = tmp_path / "tritonserver.log"
    with log.open("w") as sink:
        proc = subprocess.Popen(
            [str(wrapper_path(install.home)), "--model-repository", str(out),
             "--http-address", "127.0.0.1", "--http-port", str(http), "--grpc-address",
             "127.0.0.1", "--grpc-port", str(grpc), "--metrics-address", "127.0.0.1",
             "--metrics-port", str(metrics), "--exit-timeout-secs", "5"],
            env=env, cwd=tmp_path, stdout=sink, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        import tritonclient.http as th

        client = th.InferenceServerClient(f"127.0.0.1:{http}")

        def ready() -> bool:
            assert proc.poll() is None, log.read_text()[-3000:]
            try:
                return client.is_server_ready()
            except Exception:  # noqa: BLE001 - not listening yet
                return False

        assert until(ready, timeout=300, interval=0.2), log.read_text()[-3000:]
        client.close()
        for kind, url in (("binary", f"127.0.0.1:{http}"), ("json", f"127.0.0.1:{http}"),
                          ("grpc", f"127.0.0.1:{grpc}")):  # fmt: skip
            got = _infer(kind, url, dlrm26.requests[1])
            np.testing.assert_allclose(got, dlrm26.expected[1], atol=1e-5, err_msg=kind)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    assert re.search(r"is serving \(CPU instance; numpy 1\.", log.read_text())
