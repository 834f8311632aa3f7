"""Online updates from every rank: ``Model.fit(update_source=..., publish_interval=N,
repository=..., export_interval=M)`` under ``mpiexec -n 2`` with a DistributedSlot table
(publish_script.py), against the real broker.  Each rank publishes the rows it owns: the
rows both ranks sent are, round by round, the rows one process sends (no duplicate, nothing
missing), and applied in order to a hash map they give the saved table row for row; rank 0
alone exports each version, whole, which the loader reads."""

from __future__ import annotations

import os
import uuid

import numpy as np
import pytest

import tierserve.trainer as hugectr
from tierserve.ps.update_message import decode_update

from .mpi_run import HERE, mpiexec, run

pytest.importorskip("confluent_kafka")
SCRIPT = HERE / "publish_script.py"
TABLE = "sparse_embedding1"
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("publish_data")
    hugectr.tools.DataGenerator(hugectr.tools.DataGeneratorParams(
        format=hugectr.DataReaderType_t.Norm, label_dim=1, dense_dim=13, num_slot=8,
        i64_input_key=True, source=os.path.join(out, "file_list.txt"),
        eval_source=os.path.join(out, "file_list_test.txt"), slot_size_array=[2000] * 8,
        nnz_array=[1] * 8, check_type=hugectr.Check_t.Sum, num_files=1, eval_num_files=1,
        num_samples_per_file=8192)).generate()
    return out


def _published(bootstrap: str, topic: str) -> list[tuple[np.ndarray, np.ndarray]]:
    """Every update message of ``topic`` (one partition), in order."""
    from confluent_kafka import Consumer, KafkaError

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"test-{uuid.uuid4()}",
                         "auto.offset.reset": "earliest", "enable.partition.eof": True,
                         "enable.auto.commit": False})
    out = []
    try:
        consumer.subscribe([topic])
        for _ in range(120):
            message = consumer.poll(0.5)
            if message is None:
                continue
            if message.error() is not None:
                if message.error().code() == KafkaError._PARTITION_EOF:
                    return out
                raise AssertionError(message.error())
            out.append(decode_update(message.value()))
        raise AssertionError(f"{topic}: no end of partition within 60 s")
    finally:
        consumer.close()


def _fit(ranks, tmp_path, data_dir, kafka_broker, name):
    from confluent_kafka.admin import AdminClient, NewTopic

    topic = f"hps_et.{name}.{TABLE}"
    admin = AdminClient({"bootstrap.servers": kafka_broker.bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])[
        topic].result(30)
    out = tmp_path / name
    out.mkdir()
    done = run(ranks, SCRIPT, timeout=120, DATA_DIR=data_dir, BROKERS=kafka_broker.bootstrap,
               MODEL=name, ITERS=10, PUBLISH_INTERVAL=3, REPO=out / "repo",
               EXPORT_INTERVAL=5, OUT=out / "r.npz")
    assert done.returncode == 0, done.stderr[-3000:]
    return np.load(out / "r.npz"), _published(kafka_broker.bootstrap, topic), out / "repo"


def test_every_rank_publishes_its_own_rows(tmp_path, data_dir, kafka_broker):
    mpiexec()
    tag = uuid.uuid4().hex[:8]
    one, one_msgs, _ = _fit(0, tmp_path, data_dir, kafka_broker, f"pub1_{tag}")
    two, two_msgs, repo = _fit(2, tmp_path, data_dir, kafka_broker, f"pub2_{tag}")

    sent = two["sent"]
    assert len(sent) == 2 and all(n > 0 for n in sent)  # both ranks published
    one_keys = np.sort(np.concatenate([k for k, _ in one_msgs]))
    two_keys = np.sort(np.concatenate([k for k, _ in two_msgs]))
    # publishes at 3, 6, 9 and the end: per round the changed rows, from both ranks together
    # exactly the one process's (a key twice in a round, or a round's key lost, differs)
    np.testing.assert_array_equal(two_keys, one_keys)
    assert int(sent.sum()) == len(two_keys)

    applied: dict[int, np.ndarray] = {}
    for keys, vectors in two_msgs:
        applied.update(zip(keys.tolist(), vectors))
    keys = np.asarray(sorted(applied), dtype=np.int64)
    np.testing.assert_array_equal(keys, two["keys"])  # every row trained, none more
    np.testing.assert_array_equal(np.stack([applied[k] for k in keys.tolist()]),
                                  two["vectors"])
    np.testing.assert_array_equal(two["keys"], one["keys"])
    np.testing.assert_allclose(two["vectors"], one["vectors"], rtol=1e-4, atol=1e-6)

    # versions at 5 and 10, from rank 0 only: one folder each, whole
    home = repo / f"pub2_{tag}"
    assert sorted(p.name for p in home.iterdir()) == ["1", "2"]
    last = home / "2"
    table = last / f"pub2_{tag}0_sparse_10.model"
    assert (last / f"pub2_{tag}_dense_10.model").is_file()
    stored = np.fromfile(table / "key", "<i8")
    np.testing.assert_array_equal(np.sort(stored), two["keys"])
    assert (last / "tierserve.created").is_file() and (last / f"pub2_{tag}.json").is_file()
