"""Online updates through a real Kafka broker: published updates reach the tiers of every
replica, bad messages are skipped without losing the good ones, filters hold."""

from __future__ import annotations

import uuid

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka_clients import raw_producer
from polling import until
from ps_helpers import expected, write_model

from tierserve.ps import HierarchicalParameterServer
from tierserve.ps.config import parse_ps_config
from tierserve.ps.kafka_apply import UpdateConsumer
from tierserve.ps.kafka_groups import group_id, subscription
from tierserve.ps.kafka_producer import UpdateProducer
from tierserve.ps.kafka_source import KafkaUpdateSourceConfig
from tierserve.ps.retry import ExponentialBackoff
from tierserve.ps.table_tag import table_tag
from tierserve.ps.update_message import encode_update

pytestmark = pytest.mark.kafka
DIM = 4


def _name(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:10]}"


def _server(tmp_path, name, volatile=None, persistent=None):
    # Filters name this test's model only: other tests' topics on the shared broker stay out.
    model = write_model(tmp_path / name, name, [(np.arange(100), DIM)])
    return HierarchicalParameterServer(
        parse_ps_config({
            "volatile_db": volatile or {"type": "hash_map", "update_filters": [name]},
            "persistent_db": persistent or {"type": "disabled"},
            "models": [model],
        })
    )  # fmt: skip


def _config(kafka_broker) -> KafkaUpdateSourceConfig:
    # New topics are found by metadata refreshes: keep them frequent in tests.
    return KafkaUpdateSourceConfig(
        brokers=kafka_broker.bootstrap, poll_timeout_ms=100, metadata_refresh_interval_ms=500,
        max_commit_interval=2,
    )  # fmt: skip


def _handled(consumer: UpdateConsumer) -> int:
    """Messages the consumer is done with: applied, malformed or rejected."""
    s = consumer.stats
    return s.messages + s.malformed + s.rejected


def _create_topic(kafka_broker, topic: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": kafka_broker.bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)])[topic].result(30)


def test_subscription_and_groups():
    import re

    pattern = re.compile(subscription(["alpha", "b.*"]))
    assert pattern.match("hps_et.alpha.sparse_embedding1")
    assert pattern.match("hps_et.beta.t")
    assert not pattern.match("hps_et.alphas.t")  # the filter is a whole model name
    assert not pattern.match("hps_et.gamma.t") and not pattern.match("other.alpha.t")
    assert group_id("volatile", False, "r1") == "hps.volatile.r1"  # every replica reads
    assert group_id("persistent", False, "r1") == "hps.persistent.r1"
    assert group_id("volatile", True, "r1") == "hps.volatile"  # shared: once


def test_updates_reach_every_replica_and_bad_messages_are_skipped(tmp_path, kafka_broker):
    name = _name("m")
    tag = table_tag(name, "sparse_embedding1")
    _create_topic(kafka_broker, tag)
    config = _config(kafka_broker)
    replicas = [_server(tmp_path / f"r{i}", name) for i in range(2)]
    consumers = [
        UpdateConsumer(ps, config, "volatile", replica=_name("replica")).start() for ps in replicas
    ]
    try:
        keys = np.array([1, 50, 99, 1000], np.int64)  # 1000: a key the model did not have
        new = np.arange(keys.size * DIM, dtype=np.float32).reshape(-1, DIM) + 0.25
        raw = raw_producer(kafka_broker.bootstrap)
        raw.produce(tag, value=b"HCTR\x10\x00\x00\x00" + b"\x01" * 7)  # truncated record
        raw.produce(tag, value=b"not an update")
        raw.produce(table_tag(name, "no_such_table"), value=b"HCTR\x10\x00\x00\x00")
        assert raw.flush(30) == 0
        with UpdateProducer(kafka_broker.bootstrap, max_batch_size=3) as producer:
            assert producer.publish(name, "sparse_embedding1", keys, new) == 2  # 3 + 1 records
        for consumer in consumers:
            s = consumer.stats  # 2 malformed and 2 good messages; 1 for a table not served
            assert until(lambda s=s: s.messages == 2 and s.malformed == 2 and s.rejected == 1), s
            assert s.keys == keys.size and s.errors == 0
        for ps in replicas:
            np.testing.assert_array_equal(ps.lookup(name, "sparse_embedding1", keys), new)
            # untouched keys keep their loaded vectors
            np.testing.assert_array_equal(
                ps.lookup(name, "sparse_embedding1", [2, 3]), expected([2, 3], DIM)
            )
    finally:
        for consumer in consumers:
            consumer.close()
        for ps in replicas:
            ps.close()


def test_a_restarted_consumer_resumes_after_its_committed_offset(tmp_path, kafka_broker):
    name = _name("m")
    _create_topic(kafka_broker, table_tag(name, "sparse_embedding1"))
    config = _config(kafka_broker)
    replica = _name("replica")
    first = np.full((1, DIM), 7.0, np.float32)
    second = np.full((1, DIM), 8.0, np.float32)
    with _server(tmp_path / "a", name) as ps:
        with UpdateProducer(kafka_broker.bootstrap) as producer:
            producer.publish(name, "sparse_embedding1", [5], first)
        with UpdateConsumer(ps, config, "volatile", replica=replica) as consumer:
            assert until(lambda: _handled(consumer) >= 1)
        with UpdateProducer(kafka_broker.bootstrap) as producer:
            producer.publish(name, "sparse_embedding1", [6], second)
        # The same group again (the same replica): only the message it has not seen.
        with UpdateConsumer(ps, config, "volatile", replica=replica) as consumer:
            assert until(lambda: _handled(consumer) >= 1)
            assert consumer.stats.messages == 1 and consumer.stats.keys == 1
        np.testing.assert_array_equal(ps.lookup(name, "sparse_embedding1", [5, 6]),
                                      np.concatenate([first, second]))  # fmt: skip


def test_filters_keep_other_models_out_and_persistent_updates_land(tmp_path, kafka_broker):
    name = _name("m")
    tag = table_tag(name, "sparse_embedding1")
    _create_topic(kafka_broker, tag)
    config = _config(kafka_broker)
    rdb = {"type": "rocks_db", "path": str(tmp_path / "rdb"), "update_filters": [name]}
    vol = {"type": "hash_map", "update_filters": ["nothing-matches"]}
    with _server(tmp_path, name, volatile=vol, persistent=rdb) as ps:
        persistent = UpdateConsumer(ps, config, "persistent", replica=_name("r")).start()
        volatile = UpdateConsumer(ps, config, "volatile", replica=_name("r")).start()
        try:
            new = np.full((2, DIM), 3.5, np.float32)
            with UpdateProducer(kafka_broker.bootstrap) as producer:
                producer.publish(name, "sparse_embedding1", [10, 11], new)
            assert until(lambda: _handled(persistent) >= 1)
            assert not until(lambda: _handled(volatile) >= 1, timeout=2)  # not subscribed
            storage = tag  # the first version of a model is stored under its tag
            got, found = ps.tiers["persistent"].lookup(storage, np.array([10, 11]))
            assert found.all()
            np.testing.assert_array_equal(got, new)
            # the volatile tier kept the loaded vectors
            got, found = ps.tiers["volatile"].lookup(storage, np.array([10, 11]))
            np.testing.assert_array_equal(got, expected([10, 11], DIM))
        finally:
            persistent.close()
            volatile.close()


def test_the_producer_checks_its_input():
    pytest.importorskip("confluent_kafka")
    from tierserve.core.errors import InvalidInputError

    with pytest.raises(InvalidInputError, match="max_batch_size"):
        UpdateProducer("127.0.0.1:1", max_batch_size=0)
    producer = UpdateProducer("127.0.0.1:1")
    with pytest.raises(InvalidInputError, match="model name"):
        producer.publish("bad name", "t", [1], np.zeros((1, 2), np.float32))


def test_a_refused_message_among_good_ones_is_skipped_alone(tmp_path, kafka_broker):
    # Published before the consumer starts, the three messages arrive in one batch, which is
    # applied with one insert; the tier refuses the reserved key of the middle one, so the
    # batch is applied message by message and only that one is skipped.
    from tierserve.ps.update_message import encode_update

    name = _name("m")
    tag = table_tag(name, "sparse_embedding1")
    _create_topic(kafka_broker, tag)
    values = [np.full((1, DIM), v, np.float32) for v in (1.5, 2.5, 3.5)]
    keys = [np.array([k], np.int64) for k in (7, -(2**63), 8)]
    with _server(tmp_path, name) as ps:  # the model's files first: older updates are stale
        raw = raw_producer(kafka_broker.bootstrap)
        for k, v in zip(keys, values):
            raw.produce(tag, value=encode_update(k, v), partition=0)
        assert raw.flush(30) == 0
        with UpdateConsumer(ps, _config(kafka_broker), "volatile", replica=_name("r")) as c:
            assert until(lambda: c.stats.messages + c.stats.rejected == 3), c.stats
            assert c.stats.messages == 2 and c.stats.rejected == 1 and c.stats.keys == 2
        np.testing.assert_array_equal(ps.lookup(name, "sparse_embedding1", [7, 8]),
                                      np.concatenate([values[0], values[2]]))  # fmt: skip


def _headed(value_size: int, body: bytes) -> bytes:
    return b"HCTR" + value_size.to_bytes(4, "little") + body


# Any bytes, and bytes behind a real header with any value_size (2**32 - 4 killed both
# consumer threads once), and whole updates of random dims and keys.
_values = st.one_of(
    st.binary(max_size=100),
    st.builds(
        _headed,
        st.one_of(st.integers(0, 2**32 - 1), st.sampled_from([2**32 - 4, 2**31, 4 * DIM])),
        st.binary(max_size=100),
    ),
    st.builds(
        lambda n, dim, seed: encode_update(
            np.random.default_rng(seed).integers(-(2**63), 2**63 - 1, n, dtype=np.int64),
            np.random.default_rng(seed).normal(size=(n, dim)).astype(np.float32),
        ),
        st.integers(0, 5),
        st.sampled_from([1, DIM, 9]),
        st.integers(0, 2**32),
    ),
)


def test_no_message_stops_the_updates_behind_it(tmp_path, kafka_broker):
    # Fuzz of the consumer loop through the real broker: each example publishes random
    # values and then one good update (all on one partition, so in this order); the good
    # update must apply, every random message must be counted, and the loop never fails.
    name = _name("m")
    tag = table_tag(name, "sparse_embedding1")
    _create_topic(kafka_broker, tag)
    raw = raw_producer(kafka_broker.bootstrap)
    sent = 0
    replica = _name("r")
    with _server(tmp_path, name) as ps, UpdateConsumer(ps, _config(kafka_broker), "volatile",
                                                       replica=replica) as c:  # fmt: skip

        @settings(max_examples=12, deadline=None, database=None)
        @given(st.lists(_values, min_size=1, max_size=4), st.integers(0, 99))
        def check(values, key):
            nonlocal sent
            for value in values:
                raw.produce(tag, value=value, partition=0)
            new = np.full((1, DIM), key + 0.5, np.float32)
            raw.produce(tag, value=encode_update(np.array([key]), new), partition=0)
            assert raw.flush(30) == 0
            sent += len(values) + 1
            assert until(lambda: _handled(c) + c.stats.errors >= sent, timeout=20), c.stats
            np.testing.assert_array_equal(ps.lookup(name, "sparse_embedding1", [key]), new)
            status = c.status()
            assert status.alive and status.restarts == 0 and c.stats.errors == 0, status

        check()
        assert c.stats.malformed >= 1  # the fuzz did reach the decoder's refusals


class _InjectedFault(Exception):
    """A failure of the consumer loop itself, which no message or service can cause for real
    once the decoder and the tiers report their errors; tests inject it to see the loop
    restart."""


class _FaultyConsumer(UpdateConsumer):
    """A consumer whose loop fails (a fake fault, see _InjectedFault) while decoding the
    messages ``fails(value)`` picks, ``times`` times in all (or every time: None)."""

    def __init__(self, *args, fails, times=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.fails, self.times = fails, times

    def _decode(self, message):
        if self.fails(message.value()) and (self.times is None or self.times > 0):
            if self.times is not None:
                self.times -= 1
            raise _InjectedFault(f"injected fault at offset {message.offset()}")
        return super()._decode(message)


def test_a_failed_loop_restarts_and_rereads_what_it_had_not_done(tmp_path, kafka_broker):
    name = _name("m")
    tag = table_tag(name, "sparse_embedding1")
    _create_topic(kafka_broker, tag)
    new = np.full((2, DIM), 4.5, np.float32)
    with _server(tmp_path, name) as ps:
        consumer = _FaultyConsumer(
            ps, _config(kafka_broker), "volatile", replica=_name("r"),
            fails=lambda value: True, times=1, backoff=ExponentialBackoff(cap=0.2, base=0.05),
        )  # fmt: skip
        with consumer:
            with UpdateProducer(kafka_broker.bootstrap) as producer:
                producer.publish(name, "sparse_embedding1", [3, 4], new)
            # The failure dropped the message from this client; the restarted one (a new
            # client, from the committed offset) reads it again and applies it.
            assert until(lambda: consumer.stats.messages == 1), consumer.stats
            status = consumer.status()
            assert status.alive and status.restarts == 1, status
            assert "_InjectedFault: injected fault at offset" in status.last_error
            np.testing.assert_array_equal(ps.lookup(name, "sparse_embedding1", [3, 4]), new)
        assert not consumer.status().alive  # closed


def test_a_message_the_loop_keeps_failing_on_is_skipped(tmp_path, kafka_broker):
    from tierserve.ps.kafka_consumer import MAX_FAILURES_PER_MESSAGE
    from tierserve.ps.update_message import encode_update

    name = _name("m")
    tag = table_tag(name, "sparse_embedding1")
    _create_topic(kafka_broker, tag)
    poison = encode_update(np.array([1]), np.full((1, DIM), 9.0, np.float32))
    good = np.full((1, DIM), 2.5, np.float32)
    with _server(tmp_path, name) as ps:  # the model's files first: older updates are stale
        raw = raw_producer(kafka_broker.bootstrap)
        raw.produce(tag, value=poison, partition=0)
        raw.produce(tag, value=encode_update(np.array([2]), good), partition=0)
        assert raw.flush(30) == 0
        consumer = _FaultyConsumer(
            ps, _config(kafka_broker), "volatile", replica=_name("r"),
            fails=lambda value: value == poison, backoff=ExponentialBackoff(cap=0.2, base=0.05),
        )  # fmt: skip
        with consumer:
            assert until(lambda: consumer.stats.messages == 1), consumer.status()
            assert consumer.stats.errors == 1  # the skipped message
            assert consumer.status().restarts == MAX_FAILURES_PER_MESSAGE
            assert consumer.status().alive
        got = ps.lookup(name, "sparse_embedding1", [1, 2])
        np.testing.assert_array_equal(got, np.concatenate([expected([1], DIM), good]))


class _Recorded(ExponentialBackoff):
    """The consumer's backoff, recording which failure in a row each wait was for."""

    def __init__(self):
        super().__init__(cap=0.02, base=0.01)
        self.asked: list[int] = []

    def compute(self, failures: int) -> float:
        self.asked.append(failures)
        return super().compute(failures)


class _UnreachableConsumer(UpdateConsumer):
    """A consumer whose tier is unreachable for its first ``times`` writes (a fake fault:
    the real one, a frozen Redis, is tests/ps/test_redis_failures.py's; here only the
    waits between the tries are observed)."""

    def __init__(self, *args, times, **kwargs):
        super().__init__(*args, **kwargs)
        self.times = times

    def _apply(self, run):
        apply_update = self.ps.apply_update

        def unreachable(*args, **kwargs):
            if self.times > 0:
                self.times -= 1
                from tierserve.core.errors import BackendUnavailableError

                raise BackendUnavailableError("injected: the tier is unreachable")
            return apply_update(*args, **kwargs)

        self.ps = _Proxy(self.ps, apply_update=unreachable)
        try:
            super()._apply(run)
        finally:
            self.ps = self.ps.target


class _Proxy:
    def __init__(self, target, **overrides):
        self.target, self._overrides = target, overrides

    def __getattr__(self, name):
        return self._overrides.get(name) or getattr(self.target, name)


def test_an_unreachable_tier_is_retried_after_the_growing_backoff(tmp_path, kafka_broker):
    """The tries of a write the tier could not take wait as the loop's backoff says, for
    the 1st, 2nd, 3rd failure in a row (not one fixed wait), and the update lands."""
    name = _name("m")
    tag = table_tag(name, "sparse_embedding1")
    _create_topic(kafka_broker, tag)
    new = np.full((2, DIM), 1.5, np.float32)
    backoff = _Recorded()
    with _server(tmp_path, name) as ps:
        consumer = _UnreachableConsumer(ps, _config(kafka_broker), "volatile",
                                        replica=_name("r"), times=3, backoff=backoff)  # fmt: skip
        with consumer:
            with UpdateProducer(kafka_broker.bootstrap) as producer:
                producer.publish(name, "sparse_embedding1", [5, 6], new)
            assert until(lambda: consumer.stats.messages == 1), consumer.stats
            assert consumer.stats.retries == 3
            assert backoff.asked == [1, 2, 3]
            np.testing.assert_array_equal(ps.lookup(name, "sparse_embedding1", [5, 6]), new)


@pytest.mark.parametrize("dtype", ["float16", "int8"])
def test_updates_to_a_compact_table_are_quantized_on_apply(tmp_path, kafka_broker, dtype):
    """float32 on the wire, stored as the table's storage_dtype; a message the layout cannot
    hold (beyond float16's range; a row wider than float32's range for int8) is rejected
    alone and changes nothing (NaN does not pass the wire format: malformed)."""
    from tierserve.ps.row_codec import RowCodec

    name = _name("m")
    tag = table_tag(name, "sparse_embedding1")
    _create_topic(kafka_broker, tag)
    model = write_model(tmp_path / name, name, [(np.arange(100), DIM)])
    model["storage_dtype"] = dtype
    ps = HierarchicalParameterServer(parse_ps_config({
        "volatile_db": {"type": "hash_map", "update_filters": [name]}, "models": [model],
    }))  # fmt: skip
    consumer = UpdateConsumer(ps, _config(kafka_broker), "volatile", replica=_name("r")).start()
    try:
        before = ps.lookup(name, "sparse_embedding1", [7])
        good = np.random.default_rng(1).standard_normal((3, DIM)).astype(np.float32)
        bad = np.full((1, DIM), 1e6, np.float32)
        if dtype == "int8":
            bad[0, :2] = [-3.4e38, 3.4e38]
        with UpdateProducer(kafka_broker.bootstrap) as producer:
            producer.publish(name, "sparse_embedding1", [1, 50, 1000], good)
            producer.publish(name, "sparse_embedding1", [7], bad)
        s = consumer.stats
        assert until(lambda: s.messages == 1 and s.rejected == 1), s
        codec = RowCodec(dtype, DIM)
        np.testing.assert_array_equal(ps.lookup(name, "sparse_embedding1", [1, 50, 1000]),
                                      codec.decode(codec.encode(good)))  # fmt: skip
        np.testing.assert_array_equal(ps.lookup(name, "sparse_embedding1", [7]), before)
        storage = ps.model(name).table("sparse_embedding1").storage
        assert ps.volatile.dim(storage) == codec.words  # stored compact
    finally:
        consumer.close()
        ps.close()


def test_a_new_id_appears_only_after_min_update_count_updates(tmp_path, kafka_broker):
    name = _name("m")
    tag = table_tag(name, "sparse_embedding1")
    _create_topic(kafka_broker, tag)
    model = write_model(tmp_path / name, name, [(np.arange(100), DIM)])
    model["min_update_count"] = 3
    ps = HierarchicalParameterServer(parse_ps_config({
        "volatile_db": {"type": "hash_map", "update_filters": [name]}, "models": [model],
    }))  # fmt: skip
    consumer = UpdateConsumer(ps, _config(kafka_broker), "volatile", replica=_name("r")).start()
    try:
        with UpdateProducer(kafka_broker.bootstrap) as producer:
            for i in range(3):  # one message each: the third update of 5000 admits it
                producer.publish(name, "sparse_embedding1", [5000, 7],
                                 np.full((2, DIM), i + 0.5, np.float32))  # fmt: skip
                producer.flush()
                assert until(lambda i=i: consumer.stats.messages == i + 1), consumer.stats
                got = ps.lookup(name, "sparse_embedding1", [5000, 7])
                np.testing.assert_array_equal(got[1], i + 0.5)  # stored id: at once
                np.testing.assert_array_equal(got[0], i + 0.5 if i == 2 else -1.0)
        st = ps.tiers["volatile"].stats
        assert (st.admitted, st.held_back) == (1, 2)
    finally:
        consumer.close()
        ps.close()
