"""Which topics an update consumer reads (tierserve.ps.kafka_subscription): the topics of the
models it serves that its level's filters match, never another model's (whose backlog on a
shared broker it would otherwise fetch and skip first), and again when the served models
change."""

from __future__ import annotations

import re
import uuid

import numpy as np
import pytest
from polling import until
from ps_helpers import write_model

from tierserve.ps import HierarchicalParameterServer
from tierserve.ps.config import parse_ps_config
from tierserve.ps.kafka_apply import UpdateConsumer
from tierserve.ps.kafka_groups import subscription
from tierserve.ps.kafka_producer import UpdateProducer
from tierserve.ps.kafka_source import KafkaUpdateSourceConfig

DIM = 4
TABLE = "sparse_embedding1"


def _name(prefix: str = "m") -> str:
    return f"{prefix}{uuid.uuid4().hex[:10]}"


def _config(kafka_broker) -> KafkaUpdateSourceConfig:
    return KafkaUpdateSourceConfig(brokers=kafka_broker.bootstrap, poll_timeout_ms=100,
                                   metadata_refresh_interval_ms=500)  # fmt: skip


def _assigned_topics(consumer) -> set[str]:
    return {topic for topic, _ in set(consumer._assigned)}


def test_the_subscription_names_the_served_models_the_filters_match():
    pattern = subscription(["alpha", "b.*"], ["alpha", "beta", "gamma", "alphas"])
    assert pattern == r"^hps_et\.(alpha|beta)\.[A-Za-z0-9_-]+$"  # sorted, no counted repeats
    regex = re.compile(pattern)
    assert regex.match("hps_et.alpha.t") and regex.match("hps_et.beta.sparse_embedding1")
    assert not regex.match("hps_et.gamma.t") and not regex.match("hps_et.alphas.t")
    assert not regex.match("hps_et.bravo.t")  # matched by a filter, not served here
    assert subscription(["alpha"], ["gamma"]) is None and subscription([".*"], []) is None
    # a name is matched as itself, never as a pattern
    literal = re.compile(subscription([".*"], ["a.b"]))
    assert literal.match("hps_et.a.b.t") and not literal.match("hps_et.aXb.t")


@pytest.mark.kafka
def test_another_models_backlog_is_never_fetched(tmp_path, kafka_broker):
    # Before: the consumer subscribed to every model its filters matched (".*": all) and read
    # other models' topics from their start, skipping each message as unserved: on a broker
    # shared with other deployments a new replica read their whole backlog first.
    name, other = _name(), _name("other")
    entry = write_model(tmp_path / name, name, [(np.arange(10), DIM)])
    ps = HierarchicalParameterServer(parse_ps_config({
        "volatile_db": {"type": "hash_map", "update_filters": [".*"]},
        "persistent_db": {"type": "disabled"}, "models": [entry],
    }))  # fmt: skip
    new = np.full((2, DIM), 2.5, np.float32)
    with UpdateProducer(kafka_broker.bootstrap, max_batch_size=10) as producer:
        producer.publish(other, TABLE, np.arange(2000), np.ones((2000, DIM), np.float32))
        producer.publish(name, TABLE, [1, 2], new)
    with ps, UpdateConsumer(ps, _config(kafka_broker), "volatile", replica=_name("r")) as c:
        assert until(lambda: c.stats.messages == 1, timeout=60), c.stats
        np.testing.assert_array_equal(ps.lookup(name, TABLE, [1, 2]), new)
        assert _assigned_topics(c) == {f"hps_et.{name}.{TABLE}"}
        assert c.stats.rejected == 0, c.stats  # nothing of the other model was fetched


@pytest.mark.kafka
def test_a_model_served_later_is_subscribed_to_and_read_from_its_start(tmp_path, kafka_broker):
    first, later = _name(), _name()
    entries = [write_model(tmp_path / n, n, [(np.arange(10), DIM)]) for n in (first, later)]
    ps = HierarchicalParameterServer(parse_ps_config({
        "volatile_db": {"type": "hash_map", "update_filters": [".*"]},
        "persistent_db": {"type": "disabled"}, "models": entries,
    }), load=False)  # fmt: skip
    ps.load_model(first)
    listed = {"models": frozenset([first])}  # what a repository's ps.json names
    new = np.full((2, DIM), 4.5, np.float32)
    with UpdateProducer(kafka_broker.bootstrap) as producer:  # after the files: not stale
        producer.publish(first, TABLE, [1], new[:1])
        producer.publish(later, TABLE, [3, 4], new)
    with (
        ps,
        UpdateConsumer(ps, _config(kafka_broker), "volatile", replica=_name("r"),
                       expects=lambda: listed["models"]) as c,  # fmt: skip
    ):
        assert until(lambda: c.stats.messages == 1, timeout=60), c.stats
        assert _assigned_topics(c) == {f"hps_et.{first}.{TABLE}"}
        listed["models"] = frozenset([first, later])  # e.g. a ps.json that names one more
        both = {f"hps_et.{n}.{TABLE}" for n in (first, later)}
        assert until(lambda: _assigned_topics(c) == both, timeout=60), c._assigned
        assert until(lambda: c.status().waiting == 1, timeout=60)  # until it is loaded
        ps.load_model(later)
        assert until(lambda: c.stats.messages == 2, timeout=60), c.stats
        np.testing.assert_array_equal(ps.lookup(later, TABLE, [3, 4]), new)
        assert c.stats.rejected == 0 and c.status().alive
        # A model committed in the parameter server is read whatever expects() says; with
        # neither listed nor committed it reads nothing, and keeps running.
        listed["models"] = frozenset()
        ps.unload_model(first)
        assert until(lambda: _assigned_topics(c) == {f"hps_et.{later}.{TABLE}"}, timeout=60)
        ps.unload_model(later)
        assert until(lambda: not c._assigned, timeout=60), c._assigned
        assert c.pattern is None and c.status().alive
