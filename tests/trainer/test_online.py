"""fit's online-learning arguments (tierserve.trainer.online) without a broker: settings
checked, versions exported whole into a repository the loader reads, and publishing failures
raised by the next fit rather than lost."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tierserve.clients.demo_model import train_demo_model
from tierserve.core.errors import BackendUnavailableError, ConfigError

pytest.importorskip("confluent_kafka")


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    with pytest.MonkeyPatch.context() as patch:  # quiet here, not for the tests after these
        patch.setenv("TIERSERVE_NO_PROGRESS", "1")
        return train_demo_model(tmp_path_factory.mktemp("online"), iterations=2,
                                batch_size=128, seed=9, num_samples=4096)  # fmt: skip


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"update_source": "127.0.0.1:1"}, "publish_interval >= 1"),
        ({"publish_interval": 10}, "needs an update_source"),
        ({"repository": "x"}, "export_interval >= 1"),
        ({"export_interval": 5}, "needs a repository"),
        ({"update_source": 42, "publish_interval": 1}, "update_source must name Kafka brokers"),
    ],
)
def test_fit_refuses_half_given_online_settings(demo, kwargs, message):
    with pytest.raises(ConfigError, match=message):
        demo.model.fit(max_iter=1, **kwargs)


def test_update_source_takes_hugectrs_params_and_refuses_the_null_one():
    from tierserve.ps.config_base import UpdateSourceType_t
    from tierserve.ps.params import UpdateSourceParams  # hugectr.inference.UpdateSourceParams
    from tierserve.trainer.online import UpdatePublisher

    params = UpdateSourceParams(type=UpdateSourceType_t.kafka_message_queue,
                                brokers="127.0.0.1:1;127.0.0.1:2", max_batch_size=7)  # fmt: skip
    publisher = UpdatePublisher(params)
    try:
        assert publisher.producer.max_batch_size == 7
    finally:
        publisher.close(timeout=1)
    with pytest.raises(ConfigError, match="update_source must name Kafka brokers"):
        UpdatePublisher(UpdateSourceParams())  # type null: no source


def test_fit_exports_whole_versions_the_loader_reads(demo, tmp_path):
    from tierserve.ps.config import ModelConfig
    from tierserve.server.runtime.loader import version_files

    repo = tmp_path / "repo"
    demo.model.fit(max_iter=5, display=100, eval_interval=0, repository=str(repo),
                   export_interval=2)  # fmt: skip
    home = repo / "dlrm"
    # at 2 and 4, and at the end (5); nothing half-written is left
    assert sorted(p.name for p in home.iterdir()) == ["1", "2", "3"]
    last = home / "3"
    assert [p.name for p in last.glob("*.json")] == ["dlrm.json"]
    entry = ModelConfig(model="dlrm", sparse_files=["dlrm0_sparse_0.model"],
                        embedding_vecsize_per_table=[16],
                        maxnum_catfeature_query_per_table_per_sample=[8])  # fmt: skip
    config = version_files(entry, last)  # checks the manifest too
    assert config.dense_file.endswith("dlrm_dense_5.model")
    dense = np.fromfile(config.dense_file, "<f4")
    np.testing.assert_array_equal(dense, np.concatenate([p.ravel() for p in
                                                         demo.model.dense_parameters()]))  # fmt: skip
    assert json.loads((last / "dlrm.json").read_text())["layers"]
    # taken before the rows were written, by the clock that stamps the update messages
    stamp = int((last / "tierserve.created").read_text())
    assert stamp <= (last / "dlrm0_sparse_5.model" / "emb_vector").stat().st_mtime_ns // 10**6


def test_publishing_failures_are_raised_by_the_next_fit(demo, capsys):
    from tierserve.ps.kafka_producer import UpdateProducer

    # No broker listens on port 1: each message fails after message.timeout.ms.
    producer = UpdateProducer("127.0.0.1:1", **{"message.timeout.ms": 300})
    demo.model.fit(max_iter=2, display=100, eval_interval=0, update_source=producer,
                   publish_interval=1)  # fmt: skip
    assert "online update publishing failed" in capsys.readouterr().out
    with pytest.raises(BackendUnavailableError, match="online update publishes failed"):
        demo.model.fit(max_iter=1, update_source=producer, publish_interval=1)
    demo.model._update_publisher[1].close(timeout=1)  # noqa: SLF001 - end the thread


def test_fit_writes_the_ps_json_that_serves_the_repository(demo, tmp_path):
    """A repository fit writes is served as it is: ps.json has the model's entry (created
    with an in-process hash map), the server's startup check takes it, and the served answers
    are the trainer's; a later export keeps the user's tuning of the entry."""
    from tierserve.model.graph_json import load_graph_json
    from tierserve.server.app import BackgroundServer
    from tierserve.server.settings import Settings
    from tierserve.server.workers import check_config
    from tierserve.trainer.hugectr.inference_data import epoch_batches

    repo = tmp_path / "repo"
    demo.model.fit(max_iter=2, display=100, eval_interval=0, repository=str(repo),
                   export_interval=2)  # fmt: skip
    data = json.loads((repo / "ps.json").read_text())
    [entry] = data["models"]
    assert data["supportlonglong"] is True and data["volatile_db"]["type"] == "hash_map"
    assert entry["model"] == "dlrm" and entry["embedding_table_names"] == ["sparse_embedding1"]
    assert entry["maxnum_des_feature_per_sample"] == 13 and entry["slot_num"] == 8
    settings = Settings.build(model_repository=repo, http_port=0, grpc_port=None)
    assert check_config(settings) is not None
    batch = next(iter(epoch_batches(load_graph_json(demo.graph), demo.eval_source, "Norm",
                                    "Sum", None, 16)))  # fmt: skip
    import httpx

    with BackgroundServer(settings) as server:
        body = {"inputs": [
            {"name": "DES", "datatype": "FP32", "shape": [16, 13],
             "data": batch.dense.ravel().tolist()},
            {"name": "CATCOLUMN", "datatype": "INT64", "shape": [16, 8],
             "data": batch.sparse[0].keys.ravel().tolist()}]}  # fmt: skip
        reply = httpx.post(f"http://{server.http_url}/v2/models/dlrm/infer", json=body)
    assert reply.status_code == 200, reply.text
    served = np.asarray(reply.json()["outputs"][0]["data"], np.float32)
    np.testing.assert_allclose(served, demo.model.predict_batch(batch).ravel(), atol=1e-5)
    # The user tunes the entry; the next export keeps it and points at its own version.
    entry["max_batch_size"] = 64
    (repo / "ps.json").write_text(json.dumps(data))
    demo.model.fit(max_iter=2, display=100, eval_interval=0, repository=str(repo),
                   export_interval=2)  # fmt: skip
    [entry] = json.loads((repo / "ps.json").read_text())["models"]
    assert entry["max_batch_size"] == 64 and entry["dense_file"].startswith("dlrm/2/")


def test_fit_refuses_a_repository_for_a_model_without_embeddings(tmp_path):
    """tierserve serves models with at least one embedding table: a dense-only model is
    refused when fit starts, not after training at its first export."""
    import tierserve.trainer as hugectr

    solver = hugectr.CreateSolver(model_name="dense", batchsize=64, batchsize_eval=64,
                                  vvgpu=[[0]], repeat_dataset=True, i64_input_key=True)  # fmt: skip
    from tierserve.clients.demo_model import generate_data

    data = generate_data(tmp_path, num_samples=256)
    reader = hugectr.DataReaderParams(data_reader_type=hugectr.DataReaderType_t.Norm,
                                      source=[data.train.source], eval_source=data.eval.source,
                                      check_type=hugectr.Check_t.Sum)  # fmt: skip
    optimizer = hugectr.CreateOptimizer(optimizer_type=hugectr.Optimizer_t.Adam)
    model = hugectr.Model(solver, reader, optimizer)
    model.add(hugectr.Input(label_dim=1, label_name="label", dense_dim=13, dense_name="dense",
                            data_reader_sparse_param_array=[
                                hugectr.DataReaderSparseParam("data1", 1, True, 8)]))  # fmt: skip
    model.add(hugectr.DenseLayer(layer_type=hugectr.Layer_t.InnerProduct, bottom_names=["dense"],
                                 top_names=["fc1"], num_output=1))  # fmt: skip
    model.add(hugectr.DenseLayer(layer_type=hugectr.Layer_t.BinaryCrossEntropyLoss,
                                 bottom_names=["fc1", "label"], top_names=["loss"]))  # fmt: skip
    model.compile()
    with pytest.raises(ConfigError, match="no embedding table"):
        model.fit(max_iter=1000, repository=str(tmp_path / "repo"), export_interval=10)
    assert not (tmp_path / "repo").exists()
