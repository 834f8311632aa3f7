"""Health answers at once while the tiers hang: Redis frozen (SIGSTOP) under requests.

A lookup that waits on a frozen Redis waits for its socket timeout.  It must wait in a worker
thread: liveness and readiness over HTTP and gRPC answer in < 50 ms meanwhile, and once the
node has failed ``failure_threshold`` times in a row its keys are skipped (the default vector
answers), which /metrics counts.
"""

from __future__ import annotations

import json
import statistics
import threading
import time

import httpx
import numpy as np
import pytest
import tritonclient.grpc as tg
from frozen import frozen
from polling import until

from tierserve.clients.demo_model import DENSE_DIM, SLOT_SIZES, train_demo_model, write_repository
from tierserve.server.app import BackgroundServer
from tierserve.server.settings import Settings

pytestmark = pytest.mark.slow

TIMEOUT_MS = 1500


@pytest.fixture(scope="module")
def redis(redis_server_factory):
    return redis_server_factory()


@pytest.fixture(scope="module")
def server(tmp_path_factory, redis):
    work = tmp_path_factory.mktemp("health")
    model = train_demo_model(work / "train", iterations=5, batch_size=256)
    repo = work / "repo"
    write_repository(model, repo, max_batch_size=64)
    config = json.loads((repo / "ps.json").read_text())
    config["volatile_db"] = {
        "type": "redis", "address": redis.address, "num_partitions": 2,
        "socket_timeout_ms": TIMEOUT_MS, "failure_threshold": 2,
        "failure_backoff_ms": 60000, "max_failure_backoff_ms": 60000,
    }  # fmt: skip
    config["persistent_db"] = {"type": "disabled"}
    (repo / "ps.json").write_text(json.dumps(config))
    settings = Settings.build(model_repository=repo, http_port=0, grpc_port=0, poll_interval_s=0)
    with BackgroundServer(settings) as srv:
        yield srv


def _infer_body(seed: int) -> dict:
    rng = np.random.default_rng(seed)
    cat = [int(rng.integers(0, size)) for size in SLOT_SIZES]
    return {
        "inputs": [
            {"name": "DES", "datatype": "FP32", "shape": [1, DENSE_DIM],
             "data": rng.random(DENSE_DIM).tolist()},
            {"name": "CATCOLUMN", "datatype": "INT64", "shape": [1, len(SLOT_SIZES)],
             "data": cat},
        ]
    }  # fmt: skip


def test_health_answers_while_redis_is_frozen_under_requests(server, redis):
    url = f"http://{server.http_url}"
    grpc = tg.InferenceServerClient(server.grpc_url)
    with httpx.Client(base_url=url, timeout=30) as client:
        assert client.post("/v2/models/dlrm/infer", json=_infer_body(0)).status_code == 200
        statuses: list[int] = []

        def send(seed: int) -> None:
            with httpx.Client(base_url=url, timeout=30) as c:
                statuses.append(c.post("/v2/models/dlrm/infer", json=_infer_body(seed)).status_code)

        probes = {"http live": [], "http ready": [], "grpc live": [], "grpc ready": []}
        checks = {
            "http live": lambda: client.get("/v2/health/live").status_code == 200,
            "http ready": lambda: client.get("/v2/health/ready").status_code == 200,
            "grpc live": grpc.is_server_live,
            "grpc ready": grpc.is_server_ready,
        }
        batcher = server.plane.repository.entries["dlrm"].handle.extras["batcher"]
        timeout_s = TIMEOUT_MS / 1000
        with frozen(redis):
            # Request 1 runs alone and waits for Redis; 2-4 queue behind it and run as the
            # next execution: two timeouts of 1.5 s before the node is skipped.
            first = threading.Thread(target=send, args=(1,))
            first.start()
            assert until(lambda: batcher.running, timeout=30)
            senders = [first] + [threading.Thread(target=send, args=(i,)) for i in range(2, 5)]
            for t in senders[1:]:
                t.start()
            # health is asked throughout
            while batcher.running or any(t.is_alive() for t in senders):
                for what, check in checks.items():
                    started = time.perf_counter()
                    assert check(), what
                    probes[what].append(time.perf_counter() - started)
                time.sleep(0.02)  # the probes' pace
            # Two executions timed out: the node is skipped now, a request answers without
            # waiting for the socket timeout.
            started = time.perf_counter()
            send(5)
            assert time.perf_counter() - started < timeout_s / 2
        assert statuses == [200] * 5  # the frozen tier's keys got the default vector
        for what, took in probes.items():
            # A probe that waited for an execution would take the 1.5 s socket timeout; under
            # 50 ms each on a quiet machine, bounded generously for a shared one.
            assert statistics.median(took) < timeout_s / 10, (what, sorted(took)[-5:])
            assert max(took) < timeout_s / 2, (what, sorted(took)[-5:])
        metrics = client.get("/metrics").text
        skipped = [
            line for line in metrics.splitlines()
            if line.startswith('tierserve_tier_skipped_total{tier="volatile:redis"}')
        ]  # fmt: skip
        assert skipped and float(skipped[0].rsplit(" ", 1)[1]) > 0, skipped
    grpc.close()
