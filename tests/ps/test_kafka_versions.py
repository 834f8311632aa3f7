"""Online updates and model versions through the real broker (tierserve.ps.update_replay):
a new topic is read within a second, updates wait for a model loaded after them, skip
what a version's files already hold and replay onto a new version, a consumer killed
mid-stream ends as the trainer, and a broker outage is logged once each way."""

from __future__ import annotations

import logging
import time
import uuid

import numpy as np
import pytest
from polling import until
from ps_helpers import expected, write_model

from tierserve.ps import HierarchicalParameterServer
from tierserve.ps.config import parse_ps_config
from tierserve.ps.kafka_apply import UpdateConsumer
from tierserve.ps.kafka_producer import UpdateProducer
from tierserve.ps.kafka_source import KafkaUpdateSourceConfig

pytestmark = pytest.mark.kafka
DIM = 4
TABLE = "sparse_embedding1"


def _name(prefix: str = "m") -> str:
    return f"{prefix}{uuid.uuid4().hex[:10]}"


def _ps(entry: dict, load: bool = True) -> HierarchicalParameterServer:
    return HierarchicalParameterServer(
        parse_ps_config({
            "volatile_db": {"type": "hash_map", "update_filters": [entry["model"]]},
            "persistent_db": {"type": "disabled"},
            "models": [entry],
        }),
        load=load,
    )  # fmt: skip


def _config(kafka_broker) -> KafkaUpdateSourceConfig:
    # metadata_refresh_interval_ms: the default
    return KafkaUpdateSourceConfig(brokers=kafka_broker.bootstrap, poll_timeout_ms=100)


def _publish(kafka_broker, name, keys, vectors, **kwargs) -> None:
    with UpdateProducer(kafka_broker.bootstrap) as producer:
        producer.publish(name, TABLE, keys, vectors, **kwargs)


def test_a_topic_created_after_subscribing_is_read_within_a_second(tmp_path, kafka_broker):
    # Before: librdkafka refreshed the subscription's topics every 30 s (ps.json's default),
    # then every 1 s; each request behind a 100 ms fetch wait; and the replay's seek to the
    # new partition's start, made while librdkafka looked that start up itself, made it
    # look again 500 ms later: 0.7-2.0 s, median 1.2 s.
    assert KafkaUpdateSourceConfig().metadata_refresh_interval_ms == 500
    names = [_name() for _ in range(5)]
    models = [write_model(tmp_path / n, n, [(np.arange(10), DIM)]) for n in names]
    ps = HierarchicalParameterServer(parse_ps_config({
        "volatile_db": {"type": "hash_map", "update_filters": names},
        "persistent_db": {"type": "disabled"}, "models": models,
    }))  # fmt: skip
    rng = np.random.default_rng()
    took = []
    with (
        ps,
        UpdateProducer(kafka_broker.bootstrap) as producer,
        UpdateConsumer(ps, _config(kafka_broker), "volatile", replica=_name("r")) as c,
    ):
        # It joined its group and reads: an update of a table the model lacks, refused.
        producer.publish(names[0], "other_table", [1], np.ones((1, DIM), np.float32))
        assert until(lambda: c.stats.rejected == 1, timeout=10), c.stats
        for i, name in enumerate(names):
            time.sleep(rng.uniform(0.05, 0.5))  # not in step with the metadata refresh
            new = np.full((1, DIM), 4.5 + i, np.float32)
            start = time.monotonic()
            producer.publish(name, TABLE, [3], new)  # its topic appears now
            producer.poll(0)
            assert until(lambda n=i + 1: c.stats.messages == n, timeout=10, interval=0.005), \
                c.stats  # fmt: skip
            took.append(time.monotonic() - start)
            np.testing.assert_array_equal(ps.lookup(name, TABLE, [3]), new)
    # The median of five new topics (a loaded machine may hold up one or two): 0.3-0.8 s here.
    assert sorted(took)[2] < 1.0, f"the first update on a new topic took {took} s"


def test_updates_wait_for_a_model_loaded_after_them(tmp_path, kafka_broker):
    # Before: an update for a model not loaded yet was 'rejected', committed past, and lost.
    name = _name()
    entry = write_model(tmp_path, name, [(np.arange(10), DIM)])  # files first, loaded later
    with (
        _ps(entry, load=False) as ps,
        UpdateConsumer(ps, _config(kafka_broker), "volatile", replica=_name("r")) as c,
    ):
        new = np.full((2, DIM), 6.5, np.float32)
        _publish(kafka_broker, name, [1, 20], new)
        assert until(lambda: c.stats.rejected or c.status().waiting == 1), c.status()
        assert c.stats.rejected == 0 and c.stats.messages == 0
        ps.load_model(name)
        assert until(lambda: c.stats.messages == 1), c.stats
        assert c.status().waiting == 0
        np.testing.assert_array_equal(ps.lookup(name, TABLE, [1, 20]), new)
        np.testing.assert_array_equal(ps.lookup(name, TABLE, [2]), expected([2], DIM))


def test_updates_older_than_the_version_files_are_skipped(tmp_path, kafka_broker):
    name = _name()
    with (
        _ps(write_model(tmp_path, name, [(np.arange(10), DIM)])) as ps,
        UpdateConsumer(ps, _config(kafka_broker), "volatile", replica=_name("r")) as c,
    ):
        old = np.full((1, DIM), 1.25, np.float32)
        new = np.full((1, DIM), 2.25, np.float32)
        # The second was taken a minute before the files were written (the files hold that
        # row, or newer); it comes after a new one, so the consumer reads it whenever it
        # joins (a replay starts at the first update as new as the files).
        _publish(kafka_broker, name, [4], new)
        _publish(kafka_broker, name, [3], old, timestamp_ms=int(time.time() * 1000) - 60_000)
        assert until(lambda: c.stats.messages == 1 and c.stats.stale == 1), c.stats
        np.testing.assert_array_equal(ps.lookup(name, TABLE, [3, 4]),
                                      np.concatenate([expected([3], DIM), new]))  # fmt: skip


def test_a_version_folder_stamp_is_its_creation_time(tmp_path, kafka_broker):
    from pathlib import Path

    from tierserve.ps.update_replay import STAMP

    name = _name()
    entry = write_model(tmp_path, name, [(np.arange(10), DIM)])
    now = int(time.time() * 1000)
    # The trainer's clock said a minute later than the files' modification times.
    (Path(entry["sparse_files"][0]).parent / STAMP).write_text(f"{now + 60_000}\n")
    with (
        _ps(entry) as ps,
        UpdateConsumer(ps, _config(kafka_broker), "volatile", replica=_name("r")) as c,
    ):
        later = np.full((1, DIM), 5.5, np.float32)
        _publish(kafka_broker, name, [5], later, timestamp_ms=now + 120_000)
        _publish(kafka_broker, name, [4], later + 1)  # older than the stamp
        assert until(lambda: c.stats.messages == 1 and c.stats.stale == 1), c.stats
        np.testing.assert_array_equal(ps.lookup(name, TABLE, [4, 5]),
                                      np.concatenate([expected([4], DIM), later]))  # fmt: skip


def test_a_new_version_gets_the_updates_published_since_its_files_were_written(
    tmp_path, kafka_broker
):
    # Before: a version's tables were its files plus only the updates that arrived while it
    # was staged or served; those published between its files and its load were lost.
    name = _name()
    with (
        _ps(write_model(tmp_path / "v1", name, [(np.arange(10), DIM)])) as ps,
        UpdateConsumer(ps, _config(kafka_broker), "volatile", replica=_name("r")) as c,
    ):
        time.sleep(0.01)  # the clock moves between the two versions' files
        v2 = write_model(tmp_path / "v2", name, [(np.arange(10), DIM)], seed=5)
        new = np.full((1, DIM), 9.5, np.float32)
        _publish(kafka_broker, name, [7], new)  # after v2's files, while v1 serves
        assert until(lambda: c.stats.messages == 1), c.stats
        np.testing.assert_array_equal(ps.lookup(name, TABLE, [7]), new)
        ps.load_model(ps.config.model(name).model_copy(update=v2))
        assert until(lambda: c.stats.messages == 2), c.stats  # read again for v2
        np.testing.assert_array_equal(ps.lookup(name, TABLE, [6, 7]),
                                      np.concatenate([expected([6], DIM, seed=5), new]))  # fmt: skip


def _crash(consumer: UpdateConsumer) -> None:
    """Stop ``consumer`` as a killed process would: without committing what it applied since
    its last commit (close() commits)."""
    consumer._stop.set()
    consumer._thread.join(10)
    consumer._consumer.close()


def test_a_consumer_killed_mid_stream_ends_as_the_trainer(tmp_path, kafka_broker):
    from tierserve.clients.demo_model import EMBEDDING_DIM, train_demo_model
    from tierserve.trainer.online import UpdatePublisher

    name = _name()
    demo = train_demo_model(tmp_path, iterations=5, batch_size=256, seed=21, num_samples=8192)
    model = demo.model
    entry = {
        "model": name, "sparse_files": [str(demo.sparse_files[0])], "embedding_table_names": [TABLE],
        "embedding_vecsize_per_table": [EMBEDDING_DIM], "default_value_for_each_table": [0.0],
        "maxnum_catfeature_query_per_table_per_sample": [8],
    }  # fmt: skip
    model.get_incremental_model()  # the files hold everything so far
    config = KafkaUpdateSourceConfig(brokers=kafka_broker.bootstrap, poll_timeout_ms=100,
                                     max_commit_interval=1000)  # fmt: skip
    replica = _name("r")
    publisher = UpdatePublisher(kafka_broker.bootstrap)
    with _ps(entry) as ps:
        first = UpdateConsumer(ps, config, "volatile", replica=replica).start()
        for _ in range(4):
            for _ in range(3):
                model.train()
            model.publish_updates(publisher, model_name=name)
        publisher.flush()
        assert until(lambda: first.stats.messages >= 1), first.stats
        _crash(first)  # mid-stream: some applied, few committed
        for _ in range(4):
            for _ in range(3):
                model.train()
            model.publish_updates(publisher, model_name=name)
        publisher.close()
        with UpdateConsumer(ps, config, "volatile", replica=replica) as second:
            table = model.tables[0].export()

            def equal() -> bool:
                return np.array_equal(ps.lookup(name, TABLE, table.keys), table.embeddings)

            assert until(equal, timeout=30), second.stats


def test_a_broker_down_at_start_is_logged_once_and_caught_up(tmp_path, kafka_broker, caplog, capfd):
    # Before: librdkafka wrote '%3|...|FAIL|...' to stderr several times a second.
    name = _name()
    caplog.set_level(logging.INFO, logger="tierserve.kafka")
    with _ps(write_model(tmp_path, name, [(np.arange(10), DIM)])) as ps:
        kafka_broker.stop()
        try:
            consumer = UpdateConsumer(ps, _config(kafka_broker), "volatile", replica=_name("r"))
            consumer.start()
            assert until(lambda: consumer.status().kafka_down, timeout=10)
            time.sleep(2)  # librdkafka retries many times meanwhile
            assert lookup_ok(ps, name)  # lookups go on
        finally:
            kafka_broker.start()
        try:
            new = np.full((1, DIM), 3.75, np.float32)
            _publish(kafka_broker, name, [5], new)
            assert until(lambda: consumer.stats.messages == 1, timeout=30), consumer.stats
            assert until(lambda: not consumer.status().kafka_down)
            np.testing.assert_array_equal(ps.lookup(name, TABLE, [5]), new)
        finally:
            consumer.close()
    ours = [r.getMessage() for r in caplog.records if r.name == "tierserve.kafka"
            and "volatile, apply" in r.getMessage()]  # fmt: skip
    assert len([m for m in ours if "unreachable" in m]) == 1, "\n".join(ours)
    assert len([m for m in ours if "reachable again" in m]) == 1, ours
    rdkafka = [r for r in caplog.records if r.name == "tierserve.kafka.rdkafka"
               and r.levelno >= logging.WARNING and "volatile, apply" in r.getMessage()]  # fmt: skip
    assert len(rdkafka) <= 3, [r.getMessage() for r in rdkafka]  # one per facility per 30 s
    assert "|FAIL|" not in capfd.readouterr().err


def lookup_ok(ps, name) -> bool:
    return np.array_equal(ps.lookup(name, TABLE, [1]), expected([1], DIM))
