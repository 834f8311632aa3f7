"""fit's online-learning arguments (tierserve.trainer.online) without a broker: settings
checked, versions exported whole into a repository the loader reads, and publishing failures
raised by the next fit rather than lost."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from tierserve.clients.demo_model import train_demo_model
from tierserve.ps.errors import BackendUnavailableError, ConfigError

pytest.importorskip("confluent_kafka")


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    os.environ.setdefault("TIERSERVE_NO_PROGRESS", "1")
    return train_demo_model(tmp_path_factory.mktemp("online"), iterations=2, batch_size=128,
                            seed=9, num_samples=4096)  # fmt: skip


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
    from tierserve.server.loader import version_files

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
