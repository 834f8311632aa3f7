"""Benchmark of online updates over Kafka, against a raw confluent-kafka consumer.

    python -m bench.ps.kafka                          # 400 messages x 1000 keys, dim 16
    python -m bench.ps.kafka --messages 200 --dim 128
    python -m bench.ps.kafka --brokers 127.0.0.1:9092 # a running broker

One topic of ``--messages`` update messages (``--keys`` records each) is published with
:class:`~tierserve.ps.kafka_producer.UpdateProducer` (its rate is reported), then read in
alternating turns, each by a fresh consumer group from the first offset:

- peer: a hand-written confluent-kafka loop (``consume`` in batches, ``decode_update`` each
  value), which applies nothing;
- subject: :class:`~tierserve.ps.kafka_apply.UpdateConsumer` applying every message to the
  ``hash_map`` tier of a :class:`~tierserve.ps.hierarchy.HierarchicalParameterServer`.

The figure is updated keys per second from subscribing to the last message handled (group
join included, as a replica that starts sees it), the median of ``--rounds`` turns.  Without
``--brokers`` a Kafka broker is started on a free loopback port with the test suite's helpers
(``tests/services``) and stopped at the end.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np

from tierserve.ps.config import parse_ps_config
from tierserve.ps.hierarchy import HierarchicalParameterServer
from tierserve.ps.kafka_apply import UpdateConsumer
from tierserve.ps.kafka_producer import UpdateProducer
from tierserve.ps.kafka_source import KafkaUpdateSourceConfig
from tierserve.ps.sparse_file import write_sparse_model
from tierserve.ps.table_tag import table_tag
from tierserve.ps.update_message import decode_update

ROOT = Path(__file__).resolve().parents[2]
MODEL, TABLE = "kbench", "sparse_embedding1"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def start_broker(tmp: Path):
    sys.path.insert(0, str(ROOT / "tests"))
    from services.kafka import KafkaBroker, ensure_kafka

    broker = KafkaBroker(ensure_kafka(), tmp / "kafka", tmp / "kafka.log")
    (tmp / "kafka").mkdir()
    broker.start()
    return broker


def raw_turn(brokers: str, topic: str, messages: int) -> float:
    """Seconds for a plain consumer to read and decode every message of ``topic``."""
    from confluent_kafka import Consumer

    consumer = Consumer({
        "bootstrap.servers": brokers, "group.id": f"raw-{uuid.uuid4().hex}",
        "auto.offset.reset": "earliest", "enable.auto.commit": False,
    })  # fmt: skip
    started = time.perf_counter()
    consumer.subscribe([topic])
    seen = 0
    try:
        while seen < messages:
            for message in consumer.consume(1000, 0.1):
                if message.error() is None:
                    decode_update(message.value())
                    seen += 1
        return time.perf_counter() - started
    finally:
        consumer.close()


def our_turn(ps, config: KafkaUpdateSourceConfig, messages: int) -> float:
    """Seconds for an UpdateConsumer (a fresh replica) to apply every message."""
    started = time.perf_counter()
    consumer = UpdateConsumer(ps, config, "volatile", replica=uuid.uuid4().hex).start()
    try:
        while consumer.stats.messages + consumer.stats.malformed < messages:
            time.sleep(0.001)
        if consumer.stats.malformed:
            raise RuntimeError(f"{consumer.stats.malformed} messages were malformed")
        return time.perf_counter() - started
    finally:
        consumer.close()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--messages", type=int, default=400)
    ap.add_argument("--keys", type=int, default=1000, help="records per message")
    ap.add_argument("--dim", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--brokers", default="", help="host:port of a running broker")
    args = ap.parse_args(argv)
    rows = args.messages * args.keys
    with tempfile.TemporaryDirectory(prefix="bench-kafka-") as tmp:
        tmp = Path(tmp)
        broker = None
        brokers = args.brokers
        if not brokers:
            broker = start_broker(tmp)
            brokers = broker.bootstrap
        try:
            rng = np.random.default_rng(0)
            keys = rng.permutation(rows).astype(np.int64)
            vectors = rng.random((rows, args.dim), dtype=np.float32)
            folder = tmp / f"{MODEL}0_sparse_0.model"
            write_sparse_model(folder, keys, vectors)
            ps = HierarchicalParameterServer(parse_ps_config({
                "volatile_db": {"type": "hash_map"},
                "models": [{"model": MODEL, "sparse_files": [str(folder)],
                            "embedding_vecsize_per_table": [args.dim],
                            "maxnum_catfeature_query_per_table_per_sample": [1],
                            "embedding_table_names": [TABLE]}],
            }))  # fmt: skip
            topic = table_tag(MODEL, TABLE)
            new = vectors + 1.0
            t0 = time.perf_counter()
            with UpdateProducer(brokers, max_batch_size=args.keys) as producer:
                producer.publish(MODEL, TABLE, keys, new)
            produced = rows / (time.perf_counter() - t0)
            log(f"published {args.messages} messages of {args.keys} keys, dim {args.dim}")
            config = KafkaUpdateSourceConfig(
                brokers=brokers, poll_timeout_ms=100, metadata_refresh_interval_ms=1000
            )
            ours, raw = [], []
            for _ in range(args.rounds):
                raw.append(raw_turn(brokers, topic, args.messages))
                ours.append(our_turn(ps, config, args.messages))
            got = ps.lookup(MODEL, TABLE, keys[:1000])
            assert np.array_equal(got, new[:1000]), "the updates did not land"
            ps.close()
        finally:
            if broker is not None:
                broker.stop()
    sub, peer = statistics.median(ours), statistics.median(raw)
    print("| what | keys/s | peer | peer keys/s | ratio |")
    print("|---|---|---|---|---|")
    print(f"| UpdateProducer.publish, dim {args.dim} | {produced:,.0f} | | | |")
    print(f"| UpdateConsumer -> hash_map, dim {args.dim} | {rows / sub:,.0f} | raw consume + "
          f"decode | {rows / peer:,.0f} | {peer / sub:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
