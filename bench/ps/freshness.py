"""Online update freshness under load, and what publishing costs training.

    python -m bench.ps.freshness                        # 100,000 rows/s for 30 s, dim 16
    python -m bench.ps.freshness --rate 50000 --seconds 10 --rocksdb
    python -m bench.ps.freshness --brokers 127.0.0.1:9092 --skip-training

Freshness: the demo DLRM (dim 16) is served by ``tierserve serve``'s server in this process
(a hash-map tier, ``--rocksdb`` adds the RocksDB tier behind it) with a Kafka update source.
A producer thread publishes ``--rate`` embedding rows per second (messages of 1,000 rows,
paced every 10 ms) to the model's table for ``--seconds``.  Meanwhile a marker thread
publishes, one at a time, a new vector for a *marked* key (a key the bulk rows never touch)
and a client polls the server's predictions (HTTP v2 infer, batch 1) for a sample holding
that key until the answer changes: publish-to-visible is the time from the marker's
``produce`` call to the first prediction that differs.  Reported: p50, p99 and max of those,
and the rows per second the consumer applied.

Training: the demo DLRM's ``fit`` for ``--iterations`` iterations without publishing, and
with ``update_source`` and ``publish_interval=10``, in pairs (A then B, then B then A) for
``--rounds`` rounds, after a warm-up of each (the broker's JIT, the topic's creation); the
slowdown is the median of the pairs' ratios (wall time), beside the process CPU time of
each, the training thread's own share of publishing (taking the changed rows and queueing
them), and the CPU time of the broker when started here (it runs on the same machine, as
does one given with ``--brokers``).  ``--threads`` sets numpy's BLAS threads while training
(OpenBLAS threads busy-wait: a core taken by the broker stalls a two-thread product).

The last line of output is ``RESULT {json}``.

Without ``--brokers`` a Kafka broker is started on a free loopback port with the test suite's
helpers (``tests/services``) and stopped at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from tierserve.clients.demo_model import SLOT_SIZES, train_demo_model, write_repository
from tierserve.ps.kafka_producer import UpdateProducer

ROOT = Path(__file__).resolve().parents[2]
TABLE = "sparse_embedding1"
ROWS_PER_MESSAGE = 1000
TICK_S = 0.01


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def start_broker(tmp: Path):
    sys.path.insert(0, str(ROOT / "tests"))
    from services.kafka import KafkaBroker, ensure_kafka

    (tmp / "kafka").mkdir()
    broker = KafkaBroker(ensure_kafka(), tmp / "kafka", tmp / "kafka.log")
    broker.start()
    return broker


def _bulk(brokers: str, keys: np.ndarray, rate: int, seconds: float, dim: int, stop) -> dict:
    """Publish ``rate`` rows/s of ``keys`` for ``seconds``; returns what was sent."""
    rng = np.random.default_rng(1)
    producer = UpdateProducer(brokers, max_batch_size=ROWS_PER_MESSAGE,
                              **{"linger.ms": 2, "queue.buffering.max.kbytes": 1 << 20})  # fmt: skip
    per_tick = max(1, int(rate * TICK_S))
    vectors = rng.normal(0, 0.01, (per_tick, dim)).astype(np.float32)
    sent, start = 0, time.perf_counter()
    tick = 0
    while not stop.is_set():
        now = time.perf_counter() - start
        if now >= seconds:
            break
        due = int(now / TICK_S) + 1
        while tick < due:
            producer.publish("dlrm", TABLE, rng.choice(keys, per_tick), vectors)
            sent += per_tick
            tick += 1
        producer.poll(0)
        time.sleep(max(0.0, (tick * TICK_S) - (time.perf_counter() - start)))
    producer.flush(60)
    return {"rows": sent, "seconds": time.perf_counter() - start}


def _predict(client, des, cat):
    import tritonclient.http as th

    a = th.InferInput("DES", list(des.shape), "FP32")
    a.set_data_from_numpy(des)
    b = th.InferInput("CATCOLUMN", list(cat.shape), "INT64")
    b.set_data_from_numpy(cat)
    return client.infer("dlrm", [a, b]).as_numpy("OUTPUT0")


def _markers(url: str, brokers: str, marked: np.ndarray, cat: np.ndarray, dim: int,
             stop, out: list) -> None:  # fmt: skip
    """Publish a new vector for a marked key, poll predictions until the answer changes."""
    import tritonclient.http as th

    rng = np.random.default_rng(2)
    client = th.InferenceServerClient(url)
    producer = UpdateProducer(brokers)
    des = np.full((1, 13), 0.5, np.float32)
    i = 0
    while not stop.is_set():
        key = int(marked[i % marked.size])
        row = cat.copy()
        row[0, 0] = key
        before = _predict(client, des, row)
        vector = rng.normal(0, 1.0, (1, dim)).astype(np.float32)
        sent = time.perf_counter()
        producer.publish("dlrm", TABLE, [key], vector)
        producer.poll(0)
        while not stop.is_set():
            if np.abs(_predict(client, des, row) - before).max() > 1e-6:
                out.append(time.perf_counter() - sent)
                break
            if time.perf_counter() - sent > 30:
                out.append(float("inf"))
                break
        i += 1
        time.sleep(rng.uniform(0.02, 0.1))
    producer.flush(30)


def freshness(brokers: str, tmp: Path, rate: int, seconds: float, rocksdb: bool) -> dict:
    from tierserve.server.app import BackgroundServer
    from tierserve.server.runtime.loader import RepositoryLoader
    from tierserve.server.settings import Settings

    demo = train_demo_model(tmp / "train", iterations=20, batch_size=256, seed=3)
    repo = tmp / "repo"
    write_repository(demo, repo)
    config = json.loads((repo / "ps.json").read_text())
    config["update_source"] = {"type": "kafka_message_queue", "brokers": brokers,
                               "poll_timeout_ms": 20}  # fmt: skip
    if rocksdb:
        config["persistent_db"]["path"] = str(tmp / "rocksdb")
    else:
        config["persistent_db"] = {"type": "disabled"}
    (repo / "ps.json").write_text(json.dumps(config))
    dim = config["models"][0]["embedding_vecsize_per_table"][0]
    keys = np.sort(demo.model.tables[0].export().keys)
    slot0 = keys[keys < SLOT_SIZES[0]]  # the marked keys: slot 0's; bulk rows: the others
    marked, bulk = slot0[:50], keys[keys >= SLOT_SIZES[0]]
    bounds = np.concatenate([[0], np.cumsum(SLOT_SIZES)])
    cat = np.array([[keys[(keys >= bounds[s]) & (keys < bounds[s + 1])][0]
                     for s in range(len(SLOT_SIZES))]], np.int64)  # fmt: skip
    loader = RepositoryLoader()
    settings = Settings.build(model_repository=repo, http_port=0, grpc_port=None,
                              poll_interval_s=0)  # fmt: skip
    latencies: list[float] = []
    with BackgroundServer(settings, loader=loader) as server:
        consumer = next(c for c in loader.update_consumers if c.role == "apply")
        # The topic exists and the consumer reads it before the clock starts.
        producer = UpdateProducer(brokers)
        producer.publish("dlrm", TABLE, bulk[:1], np.zeros((1, dim), np.float32))
        producer.flush()
        deadline = time.time() + 30
        while consumer.stats.messages < 1 and time.time() < deadline:
            time.sleep(0.05)
        stop = threading.Event()
        result: dict = {}
        start_rows = consumer.stats.keys
        bulk_thread = threading.Thread(
            target=lambda: result.update(_bulk(brokers, bulk, rate, seconds, dim, stop))
        )
        marker_thread = threading.Thread(
            target=_markers, args=(server.http_url, brokers, marked, cat, dim, stop, latencies)
        )
        started = time.perf_counter()
        bulk_thread.start()
        marker_thread.start()
        bulk_thread.join()
        stop.set()
        marker_thread.join()
        # until the consumer has applied everything published
        wanted = start_rows + result["rows"]
        while consumer.stats.keys < wanted and time.perf_counter() - started < seconds + 120:
            time.sleep(0.05)
        applied_s = time.perf_counter() - started
        applied = consumer.stats.keys - start_rows
        fresh = consumer.status().freshness
    lat = np.array(latencies)
    return {
        "rate_asked": rate,
        "rows_published": result["rows"],
        "publish_rate": result["rows"] / result["seconds"],
        "rows_applied": applied,
        "apply_rate": applied / applied_s,
        "markers": int(lat.size),
        "p50_ms": float(np.percentile(lat, 50) * 1000) if lat.size else None,
        "p99_ms": float(np.percentile(lat, 99) * 1000) if lat.size else None,
        "max_ms": float(lat.max() * 1000) if lat.size else None,
        "consumer_freshness_p99_le_s": _quantile(fresh, 0.99),
    }


def _quantile(h: dict, q: float) -> float:
    rank = q * h["count"]
    for bound, running in h["buckets"]:
        if running >= rank:
            return bound
    return float("inf")


def _cpu_s(pid: int | None) -> float | None:
    """CPU seconds process ``pid`` used so far (user + system), None when unknown."""
    if pid is None:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def training(brokers: str, tmp: Path, iterations: int, rounds: int,
             broker_pid: int | None = None, threads: int | None = None) -> dict:  # fmt: skip
    from tierserve.model.blas_threads import get_blas_threads, set_blas_threads

    os.environ["TIERSERVE_NO_PROGRESS"] = "1"
    if threads:
        set_blas_threads(threads)
    demo = train_demo_model(tmp / "train-speed", iterations=10, batch_size=512, seed=4)
    model = demo.model
    on = {"update_source": brokers, "publish_interval": 10}
    # Warm-up, both ways: the broker's JIT and the topic's creation are paid once, not by
    # the first measured round.
    model.fit(max_iter=iterations // 4, display=10**9, eval_interval=0)
    model.fit(max_iter=iterations, display=10**9, eval_interval=0, **on)
    publisher = model._update_publisher[1]
    times: dict[str, list[float]] = {"off": [], "on": []}
    cpu: dict[str, list[float]] = {"off": [], "on": []}
    broker_cpu: dict[str, list[float]] = {"off": [], "on": []}
    taken = []
    for r in range(rounds):
        # A then B, B then A: drift in the machine's load falls on both alike.
        for mode in ("off", "on") if r % 2 == 0 else ("on", "off"):
            taken_before = publisher.taken_s
            start, start_cpu, start_broker = (time.perf_counter(), time.process_time(),
                                              _cpu_s(broker_pid))  # fmt: skip
            model.fit(max_iter=iterations, display=10**9, eval_interval=0,
                      **(on if mode == "on" else {}))  # fmt: skip
            times[mode].append(time.perf_counter() - start)
            cpu[mode].append(time.process_time() - start_cpu)
            if start_broker is not None:
                broker_cpu[mode].append(_cpu_s(broker_pid) - start_broker)
            if mode == "on":
                taken.append(publisher.taken_s - taken_before)
    ratios = [on / off for on, off in zip(times["on"], times["off"])]
    return {
        "iterations": iterations,
        "batch_size": 512,
        "blas_threads": get_blas_threads(),
        "off_s": statistics.median(times["off"]),
        "on_s": statistics.median(times["on"]),
        "slowdown_median_of_pairs": statistics.median(ratios) - 1,
        "process_cpu_off_s": statistics.median(cpu["off"]),
        "process_cpu_on_s": statistics.median(cpu["on"]),
        # the training thread's own share: taking the changed rows and queueing them
        "training_thread_publish_s": statistics.median(taken),
        "broker_cpu_on_s": statistics.median(broker_cpu["on"]) if broker_cpu["on"] else None,
        "rows_published": publisher.rows,
        "blocked_on_full_queue_s": publisher.waited_s,
        "rounds": times,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rate", type=int, default=100_000, help="rows per second")
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--rocksdb", action="store_true", help="a RocksDB tier behind the hash map")
    ap.add_argument("--iterations", type=int, default=200, help="training iterations per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0,
                    help="numpy BLAS threads while training (default: as numpy starts)")
    ap.add_argument("--skip-training", action="store_true")
    ap.add_argument("--skip-freshness", action="store_true")
    ap.add_argument("--brokers", default="", help="host:port of a running broker")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        broker = None if args.brokers else start_broker(tmp)
        brokers = args.brokers or broker.bootstrap
        try:
            report = {}
            if not args.skip_freshness:
                report["freshness"] = freshness(brokers, tmp, args.rate, args.seconds,
                                                args.rocksdb)  # fmt: skip
                log(json.dumps(report["freshness"], indent=1))
            if not args.skip_training:
                pid = None if broker is None else broker.process.popen.pid
                report["training"] = training(brokers, tmp, args.iterations, args.rounds, pid,
                                              args.threads)  # fmt: skip
                log(json.dumps(report["training"], indent=1))
            print("RESULT " + json.dumps(report))
        finally:
            if broker is not None:
                broker.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
