"""Benchmark of the embedding cache, each figure against its peer in the same run.

    python -m bench.cache.run                        # CPU: all-hits and power-law, defaults
    python -m bench.cache.run --only hits --hit-rows 2000000
    python -m bench.cache.run --only powerlaw --rows 10000000 --cache-fraction 0.2
    python -m bench.cache.run --only gpu             # needs cupy and a CUDA device

Batches are 26 x 1024 keys.  Figures and their peers:

- ``hits`` (CPU, dim 16): ``EmbeddingCache.query`` on keys that are all cached, and the
  table lookup alone, against ``np.take`` on a dense float32 array of the same rows indexed by
  row number (the hash map benchmark's peer).  Target: >= 0.5x the peer.
- ``powerlaw``: keys drawn from a Zipf(alpha) over the ranks of a ``--rows`` table (ranks
  mapped to random rows), a cache of ``--cache-fraction`` of the rows in front of the real
  ``HierarchicalParameterServer`` with a hash_map volatile tier.  Reports the steady-state
  hit rate (target >= 0.8) and cache + hash map against the hash map alone (target >= 1.5x).
  With ``--tier redis_cluster`` (a three-node cluster started on loopback with the test
  suite's helpers) or ``--tier rocks_db`` (in a temporary folder) the table lives in that tier
  alone, and the peer is the parameter server's lookup on it: the cache in front of a remote
  tier (target >= 5x at a hit rate >= 0.85).
- ``gpu`` (dim 16 and 128): hit lookups per second of the cupy cache, with and without the
  CUDA kernel, against ``cupy.take`` on a dense device array (the ceiling).

Subject and peer run alternately, several rounds; each figure is the median batch time, and
"ratio (best)" compares the fastest batch of each (steadier on a shared machine).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from tierserve.cache import EmbeddingCache
from tierserve.cache.device import cupy_or_none

BATCH = 26 * 1024
MODEL = "bench"
TABLE = "table"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


class DenseParameterServer:
    """Keys are row numbers of a dense array: the cheapest possible parameter server."""

    def __init__(self, embeddings: np.ndarray) -> None:
        self.embeddings = embeddings

    def lookup(self, model, table, keys):
        return np.take(self.embeddings, keys, axis=0, mode="clip")

    def insert(self, model, table, keys, embeddings):
        self.embeddings[keys] = embeddings


def alternate(subject, peer, batches, rounds: int, sync=lambda: None) -> tuple[float, float]:
    """Median seconds per batch of ``subject(i)`` and ``peer(i)``, interleaved.

    The best (minimum) ratio of the two is kept in ``alternate.best`` (peer min / subject
    min): on a shared machine it is the steadier figure of what the code itself costs.
    """
    subject(0)
    peer(0)
    sync()
    s_times, p_times = [], []
    for _ in range(rounds):
        for i in range(batches):
            for fn, times in ((subject, s_times), (peer, p_times)):
                t0 = time.perf_counter()
                fn(i)
                sync()
                times.append(time.perf_counter() - t0)
    alternate.best = min(p_times) / min(s_times)
    return statistics.median(s_times), statistics.median(p_times)


def bench_hits(rows: int, dim: int, ways: int, rounds: int) -> list[dict]:
    rng = np.random.default_rng(0)
    emb = rng.random((rows, dim), dtype=np.float32)
    ps = DenseParameterServer(emb)
    out = []
    with EmbeddingCache(ps, MODEL, TABLE, dim, rows, ways=ways, hit_rate_threshold=1.0) as cache:
        for start in range(0, rows, 1 << 20):  # warm: every row through the miss path
            cache.query(np.arange(start, min(rows, start + (1 << 20)), dtype=np.int64))
        held = cache._table.cached_keys()
        batches = [held[rng.integers(0, held.size, BATCH)] for _ in range(8)]
        rows_idx = [rng.integers(0, rows, BATCH) for _ in range(8)]
        before = cache.metrics()
        table = cache._table
        tick = iter(range(10**9, 2 * 10**9))
        for what, fn in (
            ("EmbeddingCache.query", lambda i: cache.query(batches[i])),
            ("table lookup", lambda i: table.lookup(batches[i], next(tick))),
        ):
            sub, peer = alternate(fn, lambda i: np.take(emb, rows_idx[i], axis=0), 8, rounds)
            out.append({
                "bench": "hits", "what": what, "rows": rows, "dim": dim, "ways": ways,
                "cached": int(held.size), "keys_per_s": BATCH / sub, "peer": "np.take",
                "peer_keys_per_s": BATCH / peer, "ratio": peer / sub,
                "ratio_best": alternate.best,
            })
        after = cache.metrics()
        assert after.misses == before.misses, "the all-hits benchmark missed"
    return out


def _zipf_batches(rows: int, alpha: float, count: int, rng) -> list[np.ndarray]:
    perm = rng.permutation(rows)
    return [perm[(rng.zipf(alpha, BATCH) - 1) % rows].astype(np.int64) for _ in range(count)]


def _tier_configs(tier: str, tmp: Path, stack: contextlib.ExitStack) -> dict:
    """PSConfig's tier fields for the table to live in ``tier`` alone."""
    from tierserve.ps.config_base import DisabledConfig
    from tierserve.ps.hash_map import HashMapConfig
    from tierserve.ps.redis_tier import RedisClusterConfig
    from tierserve.ps.rocksdb_tier import RocksDBConfig

    if tier == "hash_map":
        return {"volatile_db": HashMapConfig()}
    if tier == "rocks_db":
        return {"volatile_db": DisabledConfig(),
                "persistent_db": RocksDBConfig(path=str(tmp / "rocksdb"))}  # fmt: skip
    from bench.redis_cluster import start_redis_cluster

    cluster = start_redis_cluster(tmp)
    stack.callback(cluster.stop)
    return {"volatile_db": RedisClusterConfig(address=cluster.addresses)}


def bench_powerlaw(rows: int, dim: int, fraction: float, alpha: float, ways: int,
                   warm: int, measure: int, rounds: int, threshold: float,
                   tier: str = "hash_map") -> dict:
    from tierserve.ps.config import ModelConfig, PSConfig
    from tierserve.ps.hierarchy import HierarchicalParameterServer
    from tierserve.ps.sparse_file import write_sparse_model

    rng = np.random.default_rng(1)
    with tempfile.TemporaryDirectory(prefix="bench-cache-") as tmp, \
            contextlib.ExitStack() as stack:  # fmt: skip
        folder = Path(tmp) / "bench0_sparse_0.model"
        t0 = time.perf_counter()
        keys = np.arange(rows, dtype=np.int64)
        emb = np.empty((rows, dim), dtype=np.float32)
        for s in range(0, rows, 1 << 20):
            emb[s : s + (1 << 20)] = rng.random((min(1 << 20, rows - s), dim), dtype=np.float32)
        write_sparse_model(folder, keys, emb)
        del emb
        config = PSConfig(
            **_tier_configs(tier, Path(tmp), stack),
            models=[ModelConfig(
                model=MODEL, sparse_files=[str(folder)], embedding_vecsize_per_table=[dim],
                maxnum_catfeature_query_per_table_per_sample=[26], embedding_table_names=[TABLE],
            )],
        )
        hps = HierarchicalParameterServer(config)
        log(f"powerlaw: table of {rows} rows written and loaded into {tier} in "
            f"{time.perf_counter() - t0:.1f}s")
        capacity = int(fraction * rows)
        batches = _zipf_batches(rows, alpha, warm + measure, rng)
        with hps, EmbeddingCache(hps, MODEL, TABLE, dim, capacity, ways=ways,
                                 hit_rate_threshold=threshold) as cache:
            t0 = time.perf_counter()
            for b in batches[:warm]:
                cache.query(b)
            cache.flush()
            log(f"powerlaw: {warm} warm-up batches in {time.perf_counter() - t0:.1f}s")
            before = cache.metrics()
            for b in batches[warm:]:
                cache.query(b)
            cache.flush()
            after = cache.metrics()
            hits = after.hits - before.hits
            hit_rate = hits / (hits + after.misses - before.misses)
            timed = batches[warm:]
            sub, peer = alternate(
                lambda i: cache.query(timed[i]),
                lambda i: hps.lookup(MODEL, TABLE, timed[i]),
                len(timed), rounds,
            )
            m = cache.metrics()
            return {
                "bench": "powerlaw", "rows": rows, "dim": dim, "alpha": alpha, "ways": ways,
                "cache_fraction": fraction, "capacity": cache.capacity, "hit_rate": hit_rate,
                "hit_rate_threshold": threshold,
                "keys_per_s": BATCH / sub, "peer": f"{tier} lookup (HierarchicalParameterServer)",
                "peer_keys_per_s": BATCH / peer, "ratio": peer / sub,
                "ratio_best": alternate.best, "inserted": m.inserted, "evicted": m.evicted, "dropped_inserts": m.dropped_inserts,
            }


def bench_gpu(rows: int, dims: list[int], rounds: int) -> list[dict]:
    cp = cupy_or_none()
    if cp is None:
        log("gpu: skipped, cupy does not see a CUDA device")
        return []
    out = []
    rng = np.random.default_rng(2)
    for dim in dims:
        emb = rng.random((rows, dim), dtype=np.float32)
        dense = cp.asarray(emb)
        ps = DenseParameterServer(emb)
        idx = [cp.asarray(rng.integers(0, rows, BATCH)) for _ in range(8)]
        for use_kernel in (True, False):
            with EmbeddingCache(ps, MODEL, TABLE, dim, rows, use_gpu=True, use_kernel=use_kernel,
                                hit_rate_threshold=1.0) as cache:
                for start in range(0, rows, 1 << 20):
                    cache.query(np.arange(start, min(rows, start + (1 << 20)), dtype=np.int64))
                held = cache._table.cached_keys()
                batches = [held[cp.asarray(rng.integers(0, int(held.size), BATCH))] for _ in range(8)]
                sub, peer = alternate(
                    lambda i, c=cache, b=batches: c.query(b[i]),
                    lambda i, d=dense, x=idx: cp.take(d, x[i], axis=0),
                    8, rounds, sync=cp.cuda.Device().synchronize,
                )
                out.append({
                    "bench": "gpu", "what": "kernel" if cache._kernel else "cupy", "rows": rows,
                    "dim": dim, "keys_per_s": BATCH / sub, "peer": "cupy.take",
                    "peer_keys_per_s": BATCH / peer, "ratio": peer / sub,
                    "ratio_best": alternate.best, "device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
                })
    return out


def fmt(x: float) -> str:
    return f"{x / 1e6:.2f}M" if x >= 1e6 else f"{x / 1e3:.0f}k"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", choices=["hits", "powerlaw", "gpu"], action="append")
    ap.add_argument("--hit-rows", type=int, default=2_000_000)
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--cache-fraction", type=float, default=0.2)
    ap.add_argument("--alpha", type=float, default=1.2)
    ap.add_argument("--ways", type=int, default=2)
    ap.add_argument("--hit-rate-threshold", type=float, default=0.9,
                    help="below it misses are inserted synchronously (HPS default 0.9)")
    ap.add_argument("--warm", type=int, default=40)
    ap.add_argument("--measure", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tier", choices=["hash_map", "redis_cluster", "rocks_db"],
                    action="append", help="powerlaw: the tier the table lives in (repeatable; "
                    "default hash_map)")
    ap.add_argument("--gpu-rows", type=int, default=10_000_000)
    ap.add_argument("--json", action="store_true", help="print results as JSON lines")
    args = ap.parse_args(argv)
    which = args.only or ["hits", "powerlaw", "gpu"]
    results: list[dict] = []
    if "hits" in which:
        results += bench_hits(args.hit_rows, 16, args.ways, args.rounds)
    if "powerlaw" in which:
        for tier in args.tier or ["hash_map"]:
            results.append(bench_powerlaw(args.rows, 16, args.cache_fraction, args.alpha,
                                          args.ways, args.warm, args.measure,
                                          max(1, args.rounds // 2), args.hit_rate_threshold,
                                          tier))
    if "gpu" in which:
        results += bench_gpu(args.gpu_rows, [16, 128], args.rounds)
    if args.json:
        for r in results:
            print(json.dumps(r))
        return 0
    print("| bench | what | rows | dim | ours keys/s | peer | peer keys/s | ratio (median) "
          "| ratio (best) | hit rate |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        what = r.get("what") or (
            f"cache {r['cache_fraction']:.0%} in front of {r['peer'].split()[0]}, "
            f"alpha {r['alpha']}, "
            f"threshold {r['hit_rate_threshold']}"
        )
        hit = f"{r['hit_rate']:.3f}" if "hit_rate" in r else ""
        print(f"| {r['bench']} | {what} | {r['rows']} | {r['dim']} | {fmt(r['keys_per_s'])} | "
              f"{r['peer']} | {fmt(r['peer_keys_per_s'])} | {r['ratio']:.2f} | "
              f"{r['ratio_best']:.2f} | {hit} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
