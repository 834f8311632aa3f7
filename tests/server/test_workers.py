"""``tierserve serve --workers N``: worker processes on shared ports (server/workers.py).

Real processes throughout: the CLI starts the pool, requests go over real sockets, workers are
killed with real signals.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import warnings
from pathlib import Path

import httpx
import numpy as np
import pytest
from polling import until
from tcp_state import listening, unread_by_server

from tierserve.core.errors import ConfigError
from tierserve.server.app import free_port
from tierserve.server.settings import Settings
from tierserve.server.workers import core_shares, worker_count

REQUEST = {
    "inputs": [
        {"name": "DES", "datatype": "FP32", "shape": [4, 13],
         "data": np.linspace(0, 1, 52).round(3).tolist()},
        {"name": "CATCOLUMN", "datatype": "INT64", "shape": [4, 8], "data": list(range(1, 33))},
    ]
}  # fmt: skip


def _hash_map_only(repo: Path) -> Path:
    """The repository with its tables in a hash map alone (no RocksDB: shareable by workers)."""
    config = json.loads((repo / "ps.json").read_text())
    config.pop("persistent_db", None)
    config["volatile_db"] = {"type": "hash_map"}
    (repo / "ps.json").write_text(json.dumps(config))
    return repo


class Pool:
    """``tierserve serve --workers N`` in a subprocess, with its log."""

    def __init__(self, repo: Path, workers: int, *extra: str) -> None:
        self.http, self.grpc = free_port(), free_port()
        self.log = repo.parent / f"pool-{self.http}.log"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tierserve.clients.cli", "serve", "--model-repository",
             str(repo), "--workers", str(workers), "--http-port", str(self.http),
             "--grpc-port", str(self.grpc), "--threads", "1",
             *(extra if "--poll-interval" in extra else ("--poll-interval", "0", *extra))],
            stdout=self.log.open("w"), stderr=subprocess.STDOUT,
        )  # fmt: skip
        self.url = f"http://127.0.0.1:{self.http}"

    def ready(self) -> bool:
        try:
            return httpx.get(f"{self.url}/v2/health/ready", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def workers(self) -> list[int]:
        children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text()
        pids = []
        for pid in map(int, children.split()):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except (FileNotFoundError, ProcessLookupError):  # exited since the listing
                continue
            if b"spawn_main" in cmdline:
                pids.append(pid)
        return pids

    def infer(self) -> np.ndarray:
        # a new connection each time, so the kernel spreads them over the workers
        with httpx.Client(timeout=10) as client:
            r = client.post(f"{self.url}/v2/models/dlrm/infer", json=REQUEST)
        assert r.status_code == 200, r.text
        return np.asarray(r.json()["outputs"][0]["data"])

    def text(self) -> str:
        return self.log.read_text()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def pool_repo(tiny_repository):
    return _hash_map_only(tiny_repository())


def _reference(repo: Path) -> np.ndarray:
    from tierserve.server.app import BackgroundServer

    settings = Settings.build(model_repository=repo, http_port=0, grpc_port=None,
                              poll_interval_s=0)  # fmt: skip
    with BackgroundServer(settings) as server:
        r = httpx.post(f"http://{server.http_url}/v2/models/dlrm/infer", json=REQUEST, timeout=10)
    return np.asarray(r.json()["outputs"][0]["data"])


def test_two_workers_answer_alike_a_killed_one_is_replaced_and_sigterm_drains(pool_repo):
    expected = _reference(pool_repo)
    pool = Pool(pool_repo, 2, "--shutdown-grace", "10")
    try:
        assert until(pool.ready, timeout=90), pool.text()
        first = pool.workers()
        assert len(first) == 2
        # both workers answer (connections spread over them), and alike
        cpu_before = {pid: _cpu(pid) for pid in first}
        for _ in range(40):
            np.testing.assert_allclose(pool.infer(), expected, rtol=1e-6)
        assert all(_cpu(pid) > cpu_before[pid] for pid in first)
        # /metrics sums the workers' counters
        assert _requests_total(pool.url) == 40
        # a killed worker: the other keeps answering, the parent starts another and says so
        victim, survivor = first
        os.kill(victim, signal.SIGKILL)
        assert until(lambda: "exited with code -9; starting another" in pool.text(), timeout=10)
        answered = 0
        while victim in pool.workers() or len(pool.workers()) < 2 or not pool.ready():
            np.testing.assert_allclose(pool.infer(), expected, rtol=1e-6)
            answered += 1
            assert answered < 2000, pool.text()
        assert survivor in pool.workers() and victim not in pool.workers()
        np.testing.assert_allclose(pool.infer(), expected, rtol=1e-6)
        # load and unload would reach one worker: refused, naming why
        r = httpx.post(f"{pool.url}/v2/repository/models/dlrm/unload", timeout=10)
        assert r.status_code == 400 and "--workers 2" in r.json()["error"], r.text
        np.testing.assert_allclose(pool.infer(), expected, rtol=1e-6)
        # SIGTERM drains: a request whose body is still coming in finishes, then all exit
        body = json.dumps(REQUEST).encode()
        with socket.create_connection(("127.0.0.1", pool.http), timeout=10) as s:
            s.sendall(b"POST /v2/models/dlrm/infer HTTP/1.1\r\nHost: x\r\nContent-Type: "
                      b"application/json\r\nContent-Length: " + str(len(body)).encode()
                      + b"\r\n\r\n" + body[:10])  # fmt: skip
            client = s.getsockname()[1]
            assert until(lambda: unread_by_server(pool.http, client) == 0, timeout=30)  # a
            # worker has read the head: the request is under way
            pool.proc.send_signal(signal.SIGTERM)
            assert until(lambda: not listening(pool.http), timeout=30)  # the pool is draining
            s.sendall(body[10:])
            reply = s.recv(65536)
            assert reply.startswith(b"HTTP/1.1 200"), reply[:200]
        assert pool.proc.wait(timeout=30) == 0
        assert not [pid for pid in first if Path(f"/proc/{pid}").exists()]
    finally:
        pool.stop()


@pytest.mark.parametrize(
    ("broken", "words"),
    [
        ('{"models": [', ["is not valid JSON", "line 1 column 13"]),
        ({"volatile_db": {"type": "hashmap"}},
         ["volatile_db.type: 'hashmap' is not one of: disabled, hash_map, parallel_hash_map"]),
    ],
)  # fmt: skip
def test_a_broken_ps_json_is_refused_in_one_line_before_any_worker_starts(
    pool_repo, broken, words
):
    """Read once, in the parent: one line naming the file and what is wrong (the allowed
    values, not enum reprs), exit 2, and no worker started, let alone restarted."""
    path = pool_repo / "ps.json"
    if isinstance(broken, dict):
        config = json.loads(path.read_text())
        config.update(broken)
        path.write_text(json.dumps(config))
    else:
        path.write_text(broken)
    pool = Pool(pool_repo, 2)
    try:
        assert pool.proc.wait(timeout=120) == 2, pool.text()
    finally:
        pool.stop()
    lines = pool.text().strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("tierserve serve: error: ") and str(path) in lines[0]
    for word in words:
        assert word in lines[0]
    assert "DatabaseType_t" not in lines[0]


def test_a_worker_that_keeps_dying_is_restarted_with_backoff_then_the_pool_gives_up(pool_repo):
    """Each worker that dies within QUICK_EXIT_S of starting waits longer to be started
    again (1, 2, 4, 8 s, each less up to half: jittered); after RESTART_LIMIT such exits in a
    row the pool stops and exits 1, saying so."""
    from tierserve.server.workers import RESTART_LIMIT

    pool = Pool(pool_repo, 2)
    try:
        assert until(pool.ready, timeout=120), pool.text()
        survivor, victim = pool.workers()
        killed = 0
        deadline = time.monotonic() + 180
        while pool.proc.poll() is None:
            assert time.monotonic() < deadline, pool.text()
            for pid in pool.workers():
                if pid != survivor:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                        killed += 1
            time.sleep(0.05)  # the pace of the kills; the loop ends when the pool gives up
        assert pool.proc.returncode == 1, pool.text()
    finally:
        pool.stop()
    text = pool.text()
    assert f"exited {RESTART_LIMIT} times in a row" in text, text
    delays = [float(d) for d in re.findall(r"starting another in ([0-9.]+) s", text)]
    # the first kill may find a worker that ran longer than QUICK_EXIT_S: started at once
    assert len(delays) == RESTART_LIMIT - 1, text
    for n, delay in enumerate(delays, start=1):
        full = min(30.0, 2.0 ** (n - 1))
        assert full * 0.5 - 0.05 <= delay <= full + 0.05, (n, delays)
    assert killed >= RESTART_LIMIT
    assert not Path(f"/proc/{survivor}").exists()  # the pool stopped every worker


def _cpu(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def _requests_total(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("tierserve_requests_total{") and 'protocol="http"' in line
    )


def test_workers_that_cannot_share_the_tiers_are_refused_naming_them(tiny_repository):
    repo = tiny_repository()  # a hash map in front of a writable RocksDB
    with pytest.raises(ConfigError, match="--workers 2: persistent_db rocks_db .*read_only"):
        worker_count(Settings.build(model_repository=repo, workers=2))
    assert worker_count(Settings.build(model_repository=repo)) == 1  # the default falls back
    assert worker_count(Settings.build(model_repository=repo, workers=1)) == 1
    config = json.loads((repo / "ps.json").read_text())
    config["persistent_db"]["read_only"] = True
    config["volatile_db"] = {"type": "redis_cluster", "address": "127.0.0.1:1"}
    (repo / "ps.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="volatile_db redis_cluster"):
        worker_count(Settings.build(model_repository=repo, workers=3))
    shareable = _hash_map_only(repo)
    cores = len(os.sched_getaffinity(0))
    assert worker_count(Settings.build(model_repository=shareable)) == min(cores, 8)
    assert worker_count(Settings.build(model_repository=shareable, max_workers=1)) == 1
    assert worker_count(Settings.build(model_repository=shareable, workers=3)) == 3


def test_the_cli_spells_workers_and_threads_and_the_old_setting_warns():
    from tierserve.clients.cli import build_parser
    from tierserve.clients.serve import settings_from_args

    args = build_parser().parse_args(
        ["serve", "--model-repository", "r", "--workers", "3", "--threads", "2",
         "--shutdown-grace", "7", "--max-workers", "5"]
    )  # fmt: skip
    settings = settings_from_args(args)
    assert (settings.workers, settings.threads, settings.max_workers) == (3, 2, 5)
    assert settings.shutdown_grace_s == 7.0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert Settings.build(config="ps.json", worker_threads=6).threads == 6
    assert any("worker_threads is now threads" in str(w.message) for w in caught)


def _second_version(repo: Path) -> Path:
    """Version 2 of the model: version 1 with every embedding doubled (written aside, then
    renamed into place so it appears whole)."""
    import shutil

    from tierserve.model.manifest import MANIFEST
    from tierserve.ps.sparse_file import read_sparse_model, write_sparse_model

    staging = repo / "dlrm" / ".2.tmp"
    shutil.copytree(repo / "dlrm" / "1", staging)
    (staging / MANIFEST).unlink(missing_ok=True)
    for folder in staging.glob("*_sparse_*.model"):
        table = read_sparse_model(folder)
        keys, vectors = np.asarray(table.keys).copy(), np.asarray(table.embeddings) * 2
        shutil.rmtree(folder)
        write_sparse_model(folder, keys, vectors)
    return staging


def test_hot_reload_under_load_with_two_workers_answers_each_version_whole(pool_repo, tmp_path):
    import shutil
    import threading

    staging = _second_version(pool_repo)
    alone = tmp_path / "v2"
    shutil.copytree(pool_repo, alone)
    shutil.rmtree(alone / "dlrm" / "1")
    shutil.rmtree(alone / "dlrm" / ".2.tmp")
    shutil.copytree(staging, alone / "dlrm" / "2")
    expected = {"1": _reference(pool_repo), "2": _reference(alone)}
    assert not np.allclose(expected["1"], expected["2"])
    pool = Pool(pool_repo, 2, "--poll-interval", "0.2")
    answers: list[tuple[str, np.ndarray]] = []
    stop = threading.Event()

    def load() -> None:
        while not stop.is_set():
            with httpx.Client(timeout=10) as client:
                r = client.post(f"{pool.url}/v2/models/dlrm/infer", json=REQUEST)
            assert r.status_code == 200, r.text
            out = r.json()
            answers.append((out["model_version"], np.asarray(out["outputs"][0]["data"])))

    try:
        assert until(pool.ready, timeout=90), pool.text()
        client = threading.Thread(target=load)
        client.start()
        assert until(lambda: len(answers) > 20, timeout=30)
        staging.rename(pool_repo / "dlrm" / "2")
        # every worker moves to version 2: a long run of answers from it
        assert until(
            lambda: len(answers) > 40 and all(v == "2" for v, _ in answers[-40:]), timeout=60
        ), pool.text()
        stop.set()
        client.join(timeout=30)
        assert {v for v, _ in answers} == {"1", "2"}
        for version, output in answers:  # each answer wholly the version it names
            np.testing.assert_allclose(output, expected[version], rtol=1e-5)
        assert pool.text().count("model dlrm version 2 is serving") == 2
    finally:
        stop.set()
        pool.stop()


@pytest.mark.kafka
def test_an_update_reaches_both_workers_over_one_shared_memory_table(
    tiny_dlrm, tmp_path, kafka_broker
):
    """--workers 2 over a multi_process_hash_map: one copy of the table, one worker applies
    each Kafka update to it, and every worker's answers (their caches included) change."""
    import shutil
    import uuid

    from confluent_kafka.admin import AdminClient, NewTopic

    from tierserve.clients.demo_model import write_repository
    from tierserve.ps.kafka_producer import UpdateProducer
    from tierserve.ps.shm_hash_map import SHM_ROOT

    name = f"dlrm{uuid.uuid4().hex[:8]}"
    shm = f"tierserve-test-{name}"
    repo = tmp_path / "repo"
    write_repository(tiny_dlrm, repo)
    shutil.move(repo / "dlrm", repo / name)
    config = json.loads((repo / "ps.json").read_text())
    entry = config["models"][0]
    entry["model"] = name
    for field in ("dense_file", "network_file"):
        entry[field] = entry[field].replace("dlrm/", f"{name}/", 1)
    entry["sparse_files"] = [f.replace("dlrm/", f"{name}/", 1) for f in entry["sparse_files"]]
    entry.update(gpucache=True, gpucacheper=1.0)  # a cache per worker, in host memory
    config["volatile_db"] = {"type": "multi_process_hash_map", "shared_memory_name": shm,
                             "update_filters": [name]}  # fmt: skip
    config["persistent_db"] = {"type": "disabled"}
    config["update_source"] = {
        "type": "kafka_message_queue", "brokers": kafka_broker.bootstrap,
        "poll_timeout_ms": 100, "metadata_refresh_interval_ms": 500, "max_commit_interval": 1,
    }  # fmt: skip
    (repo / "ps.json").write_text(json.dumps(config))
    table, dim = entry["embedding_table_names"][0], entry["embedding_vecsize_per_table"][0]
    topic = f"hps_et.{name}.{table}"
    admin = AdminClient({"bootstrap.servers": kafka_broker.bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])[topic].result(30)
    body = {"inputs": [
        {"name": "DES", "datatype": "FP32", "shape": [4, 13], "data": [0.5] * 52},
        {"name": "CATCOLUMN", "datatype": "INT64", "shape": [4, 8], "data": list(range(3, 35))},
    ]}  # fmt: skip
    pool = Pool(repo, 2)
    url = f"{pool.url}/v2/models/{name}/infer"

    def answer() -> np.ndarray:
        with httpx.Client(timeout=10) as client:  # a new connection: either worker
            r = client.post(url, json=body)
        assert r.status_code == 200, r.text
        return np.asarray(r.json()["outputs"][0]["data"])

    try:
        assert until(pool.ready, timeout=90), pool.text()
        data = [p for p in (SHM_ROOT / shm).iterdir() if p.name.split(".")[-1].isdigit()]
        assert len(data) == 1, data  # both workers read one copy
        before = answer()
        for _ in range(20):  # both workers' caches hold these rows
            np.testing.assert_allclose(answer(), before, rtol=1e-6)
        keys = np.arange(3, 35, dtype=np.int64)
        with UpdateProducer(kafka_broker.bootstrap) as producer:
            producer.publish(name, table, keys, np.full((keys.size, dim), 0.25, np.float32))
        # Every key gets the same vector and every row the same dense features: once the
        # whole update is in, the four rows answer alike.  Each worker's cache hears of the
        # update on its own, so for a moment one worker may answer with it and the other
        # with some keys still old: wait until 16 answers in a row (new connections, spread
        # over both workers) have all of it.
        def updated() -> bool:
            got = answer()
            return not np.allclose(got, before, rtol=1e-4) and np.allclose(got, got[0], rtol=1e-6)

        assert until(lambda: all(updated() for _ in range(16)), timeout=20), pool.text()
        after = answer()
        for _ in range(30):  # every worker answers with the update (connections spread)
            np.testing.assert_allclose(answer(), after, rtol=1e-5)
        # one applier per host (its group names the host), an invalidation group per worker
        import re
        import socket

        host = re.sub(r"[^A-Za-z0-9._-]", "_", socket.gethostname())
        groups = {g.group_id for g in admin.list_consumer_groups().result(30).valid}
        assert f"hps.volatile.{host}" in groups, sorted(groups)
    finally:
        pool.stop()
    assert not (SHM_ROOT / shm).exists()  # the last worker out removed the table


def test_a_staged_version_commits_when_every_running_worker_has_staged_it():
    import multiprocessing
    import threading

    from tierserve.server.runtime.pool_state import STAGED_RING, PoolState

    ctx = multiprocessing.get_context("spawn")
    ready, alive = ctx.RawArray("b", 3), ctx.RawArray("b", 3)
    staged = ctx.RawArray("q", 3 * STAGED_RING)
    alive[0] = alive[1] = 1  # worker 2 is not running: nobody waits for it
    first, second = PoolState(0, ready, alive, staged), PoolState(1, ready, alive, staged)
    done = []
    waiter = threading.Thread(target=lambda: done.append(first.wait_for_peers("m", "2", 10)))
    waiter.start()
    time.sleep(0.3)  # a while in which it must not return (it returns at once when wrong)
    assert not done  # worker 1 has not staged version 2
    assert second.wait_for_peers("m", "2", 10) is True  # worker 0 had: no wait
    waiter.join(timeout=5)
    assert done == [True]
    # a worker that starts later finds the version staged by the others: no wait
    alive[2] = 1
    late = PoolState(2, ready, alive, staged)
    started = time.monotonic()
    # without waiting out its 10 s timeout
    assert late.wait_for_peers("m", "2", 10) is True and time.monotonic() - started < 5
    # a version no other worker stages commits after the timeout, saying so
    assert first.wait_for_peers("m", "3", timeout=0.2) is False


def _mapped_file(array) -> str | None:
    """The file whose mapping ``array`` views (a numpy memmap), ``"mmap"`` for a view of a
    Python mmap (anonymous, or a /dev/shm file), None for plain memory."""
    import mmap

    while isinstance(array, np.ndarray):
        if isinstance(array, np.memmap):
            return str(array.filename)
        base = array.base
        if isinstance(base, memoryview):
            base = base.obj
        if isinstance(base, mmap.mmap):
            return "mmap"
        array = base
    return None


def test_served_dense_weights_never_map_the_model_file(tiny_dlrm, tmp_path, monkeypatch):
    """Served weights are read into memory of their own (no operation on the dense file can
    reach them: a truncated mapped file is a SIGBUS), read-only, and equal to the file; in a
    worker pool they map one /dev/shm copy per version that every worker shares, removed
    when the version is released.  The trainer's reader still gives writable copies."""
    from tierserve.model import served_weights
    from tierserve.model.dense_file import read_dense_file
    from tierserve.model.inference_graph import InferenceGraph

    shapes = InferenceGraph(tiny_dlrm.graph, tiny_dlrm.dense_file).network.flat_param_shapes()
    copies = read_dense_file(tiny_dlrm.dense_file, shapes)
    assert all(c.flags.writeable and _mapped_file(c) != str(tiny_dlrm.dense_file)
               for c in copies)  # fmt: skip

    def weights(graph):
        return [w for layer in graph.params for w in (layer or [])]

    alone = InferenceGraph(tiny_dlrm.graph, tiny_dlrm.dense_file)
    assert alone.served.shared is None
    for w, c in zip(weights(alone), copies):
        assert not w.flags.writeable and _mapped_file(w) != str(tiny_dlrm.dense_file)
        np.testing.assert_array_equal(w, c)

    monkeypatch.setattr(served_weights, "SHM_DIR", tmp_path)  # /dev/shm's stand-in folder
    monkeypatch.setenv(served_weights.SHARED_ENV, "tierserve-dense-test")
    first = InferenceGraph(tiny_dlrm.graph, tiny_dlrm.dense_file)
    second = InferenceGraph(tiny_dlrm.graph, tiny_dlrm.dense_file)
    [shared] = tmp_path.glob("tierserve-dense-test-*")
    assert first.served.shared == second.served.shared == shared
    for a, b, c in zip(weights(first), weights(second), copies):
        assert _mapped_file(a) == _mapped_file(b) == "mmap" and not a.flags.writeable
        np.testing.assert_array_equal(a, c)
        np.testing.assert_array_equal(b, c)
    other = tmp_path / "other"  # other bytes under the name (a new file: the maps keep theirs)
    other.write_bytes(shared.read_bytes()[:-4] + b"\0\0\0\0")
    other.replace(shared)
    third = InferenceGraph(tiny_dlrm.graph, tiny_dlrm.dense_file)
    assert third.served.shared is None  # kept in its own memory instead
    first.release()
    second.release()
    assert not shared.exists()
    for w, c in zip(weights(second), copies):
        np.testing.assert_array_equal(w, c)  # the mapping outlives the file's name


def test_the_cores_split_into_disjoint_shares_that_cover_them_all():
    assert core_shares(2, [0, 1]) == [{0}, {1}]
    assert core_shares(1, [0, 1, 2]) == [{0, 1, 2}]
    assert core_shares(2, [0, 1, 2, 3, 4]) == [{0, 1, 2}, {3, 4}]
    assert core_shares(3, [4, 6, 9]) == [{4}, {6}, {9}]
    # more workers than cores: one core each, in turn
    assert core_shares(5, [2, 3]) == [{2}, {3}, {2}, {3}, {2}]
    for count in range(1, 9):
        shares = core_shares(count, list(range(6)))
        assert len(shares) == count
        assert set().union(*shares) == set(range(6))
        if count <= 6:
            assert sum(len(s) for s in shares) == 6  # disjoint
            assert max(map(len, shares)) - min(map(len, shares)) <= 1


def _thread_affinities(pid: int) -> set[frozenset[int]]:
    """The CPU affinities of every thread of process ``pid``."""
    return {frozenset(os.sched_getaffinity(int(t))) for t in os.listdir(f"/proc/{pid}/task")}


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
@pytest.mark.parametrize("pinned", [True, False])
def test_each_worker_and_its_threads_run_on_their_own_cores(pool_repo, pinned):
    allowed = frozenset(os.sched_getaffinity(0))
    pool = Pool(pool_repo, 2, *(() if pinned else ("--no-pin-workers",)))
    try:
        assert until(pool.ready, timeout=90), pool.text()
        pool.infer()  # the inference and gRPC threads run by now
        found = [_thread_affinities(pid) for pid in pool.workers()]
        if not pinned:
            assert found == [{allowed}, {allowed}]
            return
        shares = {frozenset(s) for s in core_shares(2, sorted(allowed))}
        assert all(len(f) == 1 for f in found), found  # every thread of a worker alike
        assert {next(iter(f)) for f in found} == shares, (found, shares)
        assert ", cores " in pool.text()  # the parent logs each worker's share
    finally:
        pool.stop()


def test_the_cli_turns_pinning_off():
    from tierserve.clients.cli import build_parser
    from tierserve.clients.serve import settings_from_args

    on = settings_from_args(build_parser().parse_args(["serve", "--model-repository", "r"]))
    off = settings_from_args(
        build_parser().parse_args(["serve", "--model-repository", "r", "--no-pin-workers"])
    )
    assert (on.pin_workers, off.pin_workers) == (True, False)
