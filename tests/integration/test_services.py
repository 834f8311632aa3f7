"""Smoke tests of the services that tests/conftest.py starts: each one really works."""

from __future__ import annotations

import uuid
from pathlib import Path

import numpy as np
import pytest
from kafka_clients import raw_producer
from services.triton import site_packages_parameter


def _unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


# --- Redis ---------------------------------------------------------------------------------


def test_redis_server_set_get(redis_server):
    assert redis_server.url == f"redis://127.0.0.1:{redis_server.port}/0"
    key = _unique("smoke")
    with redis_server.client() as client:
        client.set(key, b"\x00\x01value")
        assert client.get(key) == b"\x00\x01value"
        client.delete(key)


def test_redis_appendonly_survives_restart(redis_server_factory):
    server = redis_server_factory(appendonly=True)
    with server.client() as client:
        client.hset("hps_et{t/p0}v", b"k" * 8, b"v" * 16)
    server.stop()
    server.start()
    with server.client() as client:
        assert client.hget("hps_et{t/p0}v", b"k" * 8) == b"v" * 16
    server.stop()


def _key_on_node(cluster, index: int) -> str:
    for number in range(10_000):
        key = f"smoke-{number}"
        if cluster.node_index_for_key(key) == index:
            return key
    raise AssertionError(f"no key found on node {index}")


def test_redis_cluster_survives_a_node_restart(redis_cluster):
    assert redis_cluster.addresses == ",".join(redis_cluster.nodes)
    assert len(redis_cluster.nodes) == 3
    key_on_0 = _key_on_node(redis_cluster, 0)
    key_on_1 = _key_on_node(redis_cluster, 1)
    client = redis_cluster.client()
    try:
        client.set(key_on_0, b"zero")
        client.set(key_on_1, b"one")

        redis_cluster.kill_node(1)
        assert client.get(key_on_0) == b"zero"  # the surviving nodes keep serving their slots

        redis_cluster.restart_node(1)
        client.set(key_on_1, b"one again")  # no persistence: node 1 came back empty
        assert client.get(key_on_1) == b"one again"
        assert redis_cluster.node_index_for_key(key_on_1) == 1
    finally:
        client.close()
        redis_cluster.heal()


# --- Kafka ---------------------------------------------------------------------------------


def test_kafka_produce_consume(kafka_broker):
    from confluent_kafka import Consumer
    from confluent_kafka.admin import AdminClient, NewTopic

    topic = _unique("hps_et.smoke.table")
    admin = AdminClient({"bootstrap.servers": kafka_broker.bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])[topic].result(30)

    payload = b"HCTR" + bytes(range(256))
    producer = raw_producer(kafka_broker.bootstrap)
    producer.produce(topic, value=payload)
    assert producer.flush(30) == 0

    consumer = Consumer(
        {
            "bootstrap.servers": kafka_broker.bootstrap,
            "group.id": _unique("smoke-group"),
            "auto.offset.reset": "earliest",
        }
    )
    try:
        consumer.subscribe([topic])
        message = None
        for _ in range(60):
            message = consumer.poll(0.5)
            if message is not None:
                break
        assert message is not None, "no message within 30 s"
        assert message.error() is None, message.error()
        assert message.value() == payload
    finally:
        consumer.close()


# --- Triton --------------------------------------------------------------------------------

DOUBLE_CONFIG = """\
name: "double"
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""

DOUBLE_MODEL = '''\
import json
import site

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        site.addsitedir(config["parameters"]["site_packages"]["string_value"])

    def execute(self, requests):
        responses = []
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            doubled = pb_utils.Tensor("OUTPUT0", (values * 2).astype(np.float32))
            responses.append(pb_utils.InferenceResponse(output_tensors=[doubled]))
        return responses
'''


def _write_double_model(repository: Path) -> None:
    model = repository / "double"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text(DOUBLE_CONFIG + site_packages_parameter() + "\n")
    (model / "1" / "model.py").write_text(DOUBLE_MODEL)


@pytest.mark.parametrize("model_control_mode", ["none", "explicit"])
def test_triton_python_model_doubles(triton_server_factory, tmp_path, model_control_mode):
    import tritonclient.http as httpclient

    _write_double_model(tmp_path)
    load = ["double"] if model_control_mode == "explicit" else []
    server = triton_server_factory(
        tmp_path, model_control_mode=model_control_mode, load_models=load
    )
    try:
        client = httpclient.InferenceServerClient(server.http_url)
        assert client.is_model_ready("double")
        values = np.array([0.0, 1.5, -2.25, 1e6, 3.0], dtype=np.float32)
        infer_input = httpclient.InferInput("INPUT0", list(values.shape), "FP32")
        infer_input.set_data_from_numpy(values, binary_data=True)
        result = client.infer("double", [infer_input])
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), values * 2)
        client.close()
    finally:
        server.stop()
