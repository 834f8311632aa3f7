"""Benchmark of the ps tiers, each against its peer in the same run.

    python -m bench.ps.run                       # 2M rows, dim 16 and 128, both distributions
    python -m bench.ps.run --rows 10000000 --dims 16 --tiers hash_map,parallel_hash_map
    python -m bench.ps.run --redis-cluster 127.0.0.1:7000,127.0.0.1:7001,127.0.0.1:7002

Batches are 26 x 1024 keys.  Peers (the ceilings we compare with):

- hash_map / parallel_hash_map lookup: ``np.take`` on a dense float32 array of the same rows,
  indexed by row number (no hashing at all);
- redis_cluster lookup: a hand-written redis-py pipeline of HMGET per node over the same
  layout (same partitions, same chunks), results turned into numpy the same way;
- rocks_db lookup: a raw rocksdict multi-get of the same keys, turned into numpy;
- load into hash_map: ``np.fromfile`` of the same sparse model files;
- hash_map memory: the raw bytes of the keys and vectors (the table's arrays, and the
  process's resident memory gained by the load, RSS: meaningful for tables larger than
  malloc's largest heap reuse, 32 MB; a smaller one may take memory freed before).

Subject and peer run alternately, batch by batch, several rounds; the figure is the median
batch time (wall clock).  For ``hash_map``, which looks up on the calling thread as
``np.take`` does, the ratio of the medians of the thread's CPU time is printed too: on a
shared machine a loaded run's wall time is mostly time other processes held the core.
Without ``--redis-cluster`` a three-node cluster is started on free loopback ports with the
test suite's helpers (``tests/services``), and stopped at the end.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from tierserve.ps.codec import decode_values, key_fields
from tierserve.ps.hash_map import HashMapConfig, ParallelHashMapConfig
from tierserve.ps.partition import group_by_partition
from tierserve.ps.redis_tier import RedisClusterConfig, value_hash
from tierserve.ps.rocksdb_tier import RocksDBConfig
from tierserve.ps.sparse_file import read_sparse_model, write_sparse_model
from tierserve.ps.tier_registry import create_tier

BATCH = 26 * 1024
TAG = "hps_et.bench.table"
ROOT = Path(__file__).resolve().parents[2]


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --- data ------------------------------------------------------------------------------------


def make_table(rows: int, dim: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    # Scattered int64 keys (a random odd multiplier), in random order.
    keys = rng.permutation(rows).astype(np.int64) * np.int64(0x9E3779B1) + np.int64(7)
    emb = np.empty((rows, dim), dtype=np.float32)
    step = 1 << 20
    for s in range(0, rows, step):
        emb[s : s + step] = rng.random((min(step, rows - s), dim), dtype=np.float32)
    return keys, emb


def make_batches(rows: int, dist: str, count: int, seed: int = 1) -> list[np.ndarray]:
    """Row indices of ``count`` batches; power-law ranks map to random rows."""
    rng = np.random.default_rng(seed)
    if dist == "uniform":
        return [rng.integers(0, rows, BATCH) for _ in range(count)]
    perm = rng.permutation(rows)
    out = []
    for _ in range(count):
        ranks = (rng.zipf(1.2, BATCH) - 1) % rows
        out.append(perm[ranks])
    return out


# --- timing ----------------------------------------------------------------------------------


def alternate(subject, peer, batches, rounds: int, cpu: dict | None = None):
    """Median seconds per batch of ``subject(batch)`` and ``peer(batch)``, interleaved batch
    by batch (a batch slowed by other processes taking the core is an outlier of its own,
    and both sides run under the same load).

    With ``cpu`` (a dict) the medians of the calling thread's CPU time go there too, as
    ``subject`` and ``peer``: for work done on the calling thread alone, the time it ran,
    without the time other processes held the core (on a shared machine most of the wall
    time of a loaded run).
    """
    subject(batches[0])
    peer(batches[0])
    s_times, p_times, s_cpu, p_cpu = [], [], [], []
    for _ in range(rounds):
        for b in batches:
            for fn, times, cpus in ((subject, s_times, s_cpu), (peer, p_times, p_cpu)):
                t0, c0 = time.perf_counter(), time.thread_time()
                fn(b)
                times.append(time.perf_counter() - t0)
                cpus.append(time.thread_time() - c0)
    if cpu is not None:
        cpu["subject"], cpu["peer"] = statistics.median(s_cpu), statistics.median(p_cpu)
    return statistics.median(s_times), statistics.median(p_times)


def resident_bytes() -> int | None:
    """This process's resident memory (Linux), or None where /proc is missing."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return None


def rate(seconds_per_batch: float, keys: int = BATCH) -> float:
    return keys / seconds_per_batch


# --- benchmarks ------------------------------------------------------------------------------


def bench_hash_maps(kind, keys, emb, by_dist, rounds, results, label):
    cfg = HashMapConfig() if kind == "hash_map" else ParallelHashMapConfig()
    tier = create_tier(cfg)
    tier.create_table(TAG, emb.shape[1])
    warm = create_tier(cfg)  # the load's kernels compiled (or read from numba's cache) first
    warm.create_table(TAG, emb.shape[1])
    warm.load_table(TAG, keys[: 1 << 20], emb[: 1 << 20])
    warm.close()
    del warm
    gc.collect()
    before = resident_bytes()
    tier.load_table(TAG, keys, emb)
    gc.collect()
    raw = keys.nbytes + emb.nbytes
    memory = tier.nbytes(TAG) / raw
    rss = None if before is None else (resident_bytes() - before) / raw
    for dist, batches in by_dist.items():
        got, found = tier.lookup(TAG, keys[batches[0]])
        assert found.all() and np.array_equal(got, emb[batches[0]])
        pairs = {id(b): keys[b] for b in batches}
        cpu: dict = {}
        sub, peer = alternate(
            lambda b, pairs=pairs: tier.lookup(TAG, pairs[id(b)]),
            lambda b: np.take(emb, b, axis=0),
            batches,
            rounds,
            cpu,
        )
        # Online updates: each batch's keys (unique), rewritten with their own vectors.
        rows_ = [np.unique(b) for b in batches[:3]]
        upd = [keys[r] for r in rows_]
        vec = [emb[r] for r in rows_]
        t0 = time.perf_counter()
        for u, v in zip(upd, vec):
            tier.insert(TAG, u, v)
        ins = sum(u.size for u in upd) / (time.perf_counter() - t0)
        # hash_map looks up on the calling thread, as np.take: its CPU time is comparable
        # (parallel_hash_map's pool threads are not on this clock)
        results.append({
            "tier": kind, **label, "dist": dist, "lookups_per_s": rate(sub), "peer": "np.take",
            "peer_per_s": rate(peer), "ratio": peer / sub, "inserts_per_s": ins,
            "memory_ratio": memory, "rss_ratio": rss,
            "ratio_cpu": cpu["peer"] / cpu["subject"] if kind == "hash_map" else None,
        })
    tier.close()


def bench_load(keys, emb, tmp: Path, results, label, reps=3):
    folder = tmp / "bench0_sparse_0.model"
    write_sparse_model(folder, keys, emb)
    dim = emb.shape[1]

    def fromfile():
        k = np.fromfile(folder / "key", dtype="<i8")
        e = np.fromfile(folder / "emb_vector", dtype="<f4").reshape(-1, dim)
        return k, e

    def load():
        tier = create_tier(HashMapConfig())
        tier.create_table(TAG, dim)
        table = read_sparse_model(folder, dim)
        tier.load_table(TAG, table.keys, table.embeddings)
        return tier

    fromfile()  # into the page cache
    ours, peer = [], []
    for _ in range(reps):
        gc.collect()
        t0 = time.perf_counter()
        kept = fromfile()
        peer.append(time.perf_counter() - t0)
        del kept
        gc.collect()
        t0 = time.perf_counter()
        tier = load()
        ours.append(time.perf_counter() - t0)
        tier.close()
        del tier
    sub, p = min(ours), min(peer)
    results.append({
        "tier": "hash_map load", **label, "rows_per_s": keys.size / sub, "peer": "np.fromfile",
        "peer_rows_per_s": keys.size / p, "ratio": p / sub,
    })
    for f in folder.iterdir():
        f.unlink()
    folder.rmdir()


def bench_redis(addresses, keys, emb, by_dist, rounds, results, label, partitions=8):
    import redis  # noqa: F401 - the extra must be installed
    from redis.cluster import ClusterNode, RedisCluster

    cfg = RedisClusterConfig(address=addresses, num_partitions=partitions, max_batch_size=65536)
    tier = create_tier(cfg)
    tier.drop_table(TAG)
    tier.create_table(TAG, emb.shape[1])
    t0 = time.perf_counter()
    chunk = 1 << 16
    for s in range(0, keys.size, chunk):
        tier.insert(TAG, keys[s : s + chunk], emb[s : s + chunk])
    ins = keys.size / (time.perf_counter() - t0)
    dim = emb.shape[1]

    nodes = [ClusterNode(h, int(p)) for h, p in (a.rsplit(":", 1) for a in addresses.split(","))]
    raw = RedisCluster(startup_nodes=nodes)
    names = [value_hash(TAG, p) for p in range(partitions)]
    conns = {}
    for p, name in enumerate(names):
        node = raw.get_node_from_key(name)
        conns.setdefault(node.name, (raw.get_redis_connection(node), []))[1].append(p)

    def hand_written(b):
        q = keys[b]
        order, bounds = group_by_partition(q, partitions)
        fields = key_fields(q[order])
        values = [None] * q.size
        for conn, parts in conns.values():
            pipe = conn.pipeline(transaction=False)
            spans = []
            for p in parts:
                if bounds[p + 1] > bounds[p]:
                    pipe.execute_command("HMGET", names[p], *fields[bounds[p] : bounds[p + 1]])
                    spans.append((bounds[p], bounds[p + 1]))
            for (c0, c1), res in zip(spans, pipe.execute()):
                values[c0:c1] = res
        ok, found = decode_values(values, dim, "bench")
        out = np.zeros((q.size, dim), np.float32)
        out[order[ok]] = found
        return out

    for dist, batches in by_dist.items():
        got, found = tier.lookup(TAG, keys[batches[0]])
        assert found.all() and np.array_equal(got, emb[batches[0]])
        assert np.array_equal(hand_written(batches[0]), got)
        sub, peer = alternate(lambda b: tier.lookup(TAG, keys[b]), hand_written, batches, rounds)
        results.append({
            "tier": "redis_cluster", **label, "dist": dist, "lookups_per_s": rate(sub),
            "peer": "redis-py HMGET pipeline", "peer_per_s": rate(peer), "ratio": peer / sub,
            "inserts_per_s": ins,
        })
    tier.drop_table(TAG)
    tier.close()
    raw.close()


def bench_rocks(keys, emb, by_dist, rounds, results, label, tmp: Path):
    cfg = RocksDBConfig(path=str(tmp / "rocksdb"), max_batch_size=100000)
    tier = create_tier(cfg)
    tier.create_table(TAG, emb.shape[1])
    t0 = time.perf_counter()
    chunk = 1 << 17
    for s in range(0, keys.size, chunk):
        tier.insert(TAG, keys[s : s + chunk], emb[s : s + chunk])
    ins = keys.size / (time.perf_counter() - t0)
    tier.flush()
    tier._cfs[TAG].compact_range(None, None)  # as load_table leaves a loaded table
    cf = tier._cfs[TAG]  # the raw rocksdict column family, for the peer
    dim = emb.shape[1]

    def raw_multi_get(b):
        values = cf.get(key_fields(keys[b]))
        ok, found = decode_values(values, dim, "bench")
        out = np.zeros((b.size, dim), np.float32)
        out[ok] = found
        return out

    for dist, batches in by_dist.items():
        got, found = tier.lookup(TAG, keys[batches[0]])
        assert found.all() and np.array_equal(got, emb[batches[0]])
        sub, peer = alternate(lambda b: tier.lookup(TAG, keys[b]), raw_multi_get, batches, rounds)
        results.append({
            "tier": "rocks_db", **label, "dist": dist, "lookups_per_s": rate(sub),
            "peer": "rocksdict multi-get", "peer_per_s": rate(peer), "ratio": peer / sub,
            "inserts_per_s": ins,
        })
    tier.close()


# --- main ------------------------------------------------------------------------------------


def start_cluster(tmp: Path):
    sys.path.insert(0, str(ROOT / "tests"))
    from services.redis import RedisCluster, ensure_redis

    ensure_redis()
    cluster = RedisCluster(
        [tmp / f"redis-{i}" for i in range(3)], [tmp / f"redis-{i}.log" for i in range(3)]
    )
    for i in range(3):
        (tmp / f"redis-{i}").mkdir(parents=True, exist_ok=True)
    cluster.start()
    return cluster


def fmt(x: float) -> str:
    return f"{x / 1e6:.2f}M" if x >= 1e6 else f"{x / 1e3:.0f}k"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rows", default="2000000", help="table sizes, comma separated")
    ap.add_argument("--dims", default="16,128")
    ap.add_argument("--dists", default="powerlaw,uniform")
    ap.add_argument("--tiers", default="hash_map,parallel_hash_map,redis_cluster,rocks_db,load")
    ap.add_argument("--network-rows", type=int, default=2_000_000,
                    help="at most this many rows go to Redis and RocksDB (memory, disk, time)")
    ap.add_argument("--batches", type=int, default=10, help="batches per timed round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--redis-cluster", default="", help="host:port,... of a cluster to use")
    ap.add_argument("--json", default="", help="also write the results to this file")
    args = ap.parse_args(argv)
    tiers = set(args.tiers.split(","))

    class Results(list):
        def append(self, item: dict) -> None:  # print and save as we go
            super().append(item)
            log(f"    {json.dumps(item)}")
            if args.json:
                Path(args.json).write_text(json.dumps(self, indent=1))

    results: list[dict] = Results()
    with tempfile.TemporaryDirectory(prefix="bench-ps-") as tmpdir:
        tmp = Path(tmpdir)
        cluster = None
        addresses = args.redis_cluster
        if "redis_cluster" in tiers and not addresses:
            cluster = start_cluster(tmp / "cluster")
            addresses = cluster.addresses
        try:
            for rows in map(int, args.rows.split(",")):
                for dim in map(int, args.dims.split(",")):
                    log(f"table {rows} x {dim}")
                    keys, emb = make_table(rows, dim)
                    label = {"rows": rows, "dim": dim}
                    by_dist = {d: make_batches(rows, d, args.batches) for d in args.dists.split(",")}
                    for kind in ("hash_map", "parallel_hash_map"):
                        if kind in tiers:
                            log(f"  {kind}")
                            bench_hash_maps(kind, keys, emb, by_dist, args.rounds, results, label)
                    n = min(rows, args.network_rows)
                    small = {d: [b % n for b in bs] for d, bs in by_dist.items()}
                    if "redis_cluster" in tiers:
                        log(f"  redis_cluster ({n} rows)")
                        bench_redis(addresses, keys[:n], emb[:n], small, args.rounds, results,
                                    {**label, "rows": n})
                    if "rocks_db" in tiers:
                        log(f"  rocks_db ({n} rows)")
                        bench_rocks(keys[:n], emb[:n], small, args.rounds, results,
                                    {**label, "rows": n}, tmp / f"r{rows}-{dim}")
                    if "load" in tiers:
                        log("  load")
                        bench_load(keys, emb, tmp, results, {"rows": rows, "dim": dim})
                    del keys, emb
                    gc.collect()
        finally:
            if cluster is not None:
                cluster.stop()
    print("| tier | rows | dim | keys | subject | peer | ratio | ratio (CPU time) | inserts/s "
          "| memory | memory (RSS) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        if "lookups_per_s" in r:
            cpu, rss = r.get("ratio_cpu"), r.get("rss_ratio")
            print(f"| {r['tier']} | {r['rows']:,} | {r['dim']} | {r['dist']} | "
                  f"{fmt(r['lookups_per_s'])} lookups/s | {r['peer']} {fmt(r['peer_per_s'])}/s | "
                  f"{r['ratio']:.2f}x | {'-' if cpu is None else f'{cpu:.2f}x'} | "
                  f"{fmt(r['inserts_per_s'])} | {r.get('memory_ratio', float('nan')):.2f}x | "
                  f"{'-' if rss is None else f'{rss:.2f}x'} |")
        else:
            print(f"| {r['tier']} | {r['rows']:,} | {r['dim']} | - | "
                  f"{fmt(r['rows_per_s'])} rows/s | {r['peer']} {fmt(r['peer_rows_per_s'])} rows/s | "
                  f"{r['ratio']:.2f}x | | | | |")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
