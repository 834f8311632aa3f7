"""GPU cache stage: hit lookups against ``cupy.take``, a power-law stream in front of the hash
map, and insert / update rates.

- ``hits`` (dim 16 and 128): ``EmbeddingCache.query`` of keys that are all cached, with the
  CUDA kernel and with the cupy array passes, against ``cupy.take`` on a dense device array
  of the same rows (the ceiling: no hashing, no probing).  Goal: >= 0.5x ``cupy.take``.
- ``powerlaw``: Zipf(1.2) keys over the ranks of a 10M-row table (ranks mapped to random
  rows), a cache of 20% of the rows on the device in front of the real
  ``HierarchicalParameterServer`` (hash_map tier): steady-state hit rate, and keys/s of
  cache + hash map against the hash map alone.
- ``writes``: keys/s of inserting new keys into a full table (every insert evicts; on a GPU
  with the CUDA insert kernel and with the cupy array passes, in the same run) and of
  overwriting cached rows (``EmbeddingCache.on_update``, the cache side of an online update).

With ``--cpu-dry-run`` the same code runs on numpy with small tables.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np

from bench.cache.run import BATCH, MODEL, TABLE, DenseParameterServer, _zipf_batches, alternate
from tierserve.cache import EmbeddingCache, SetAssociativeTable

from .backend import Backend, log


def _fill(cache: EmbeddingCache, rows: int) -> None:
    for start in range(0, rows, 1 << 20):
        cache.query(np.arange(start, min(rows, start + (1 << 20)), dtype=np.int64))


def hits(be: Backend, rows: int, dims: list[int], rounds: int) -> list[dict]:
    xp = be.xp
    out = []
    rng = np.random.default_rng(2)
    for dim in dims:
        t0 = time.perf_counter()
        dense = xp.random.random((rows, dim), dtype=np.float32) if be.gpu else \
            rng.random((rows, dim), dtype=np.float32)
        host = be.to_host(dense)
        ps = DenseParameterServer(host)
        idx = [be.to_device(rng.integers(0, rows, BATCH)) for _ in range(8)]
        for use_kernel in ((True, False) if be.gpu else (None,)):
            with EmbeddingCache(ps, MODEL, TABLE, dim, rows, use_gpu=be.gpu,
                                use_kernel=use_kernel, hit_rate_threshold=1.0) as cache:
                _fill(cache, rows)
                held = cache._table.cached_keys()
                picks = [rng.integers(0, int(held.size), BATCH) for _ in range(8)]
                batches = [held[be.to_device(p)] for p in picks]
                before = cache.metrics()
                sub, peer = alternate(
                    lambda i, c=cache, b=batches: c.query(b[i]),
                    lambda i, d=dense, x=idx: xp.take(d, x[i], axis=0),
                    8, rounds, sync=be.sync,
                )
                assert cache.metrics().misses == before.misses, "the all-hits benchmark missed"
                what = ("kernel" if cache._kernel else "cupy") if be.gpu else "numpy (numba)"
                out.append({
                    "what": what, "rows": rows, "dim": dim, "cached": int(held.size),
                    "keys_per_s": BATCH / sub, "peer": f"{xp.__name__}.take",
                    "peer_keys_per_s": BATCH / peer, "ratio": peer / sub,
                    "ratio_best": alternate.best,
                })
                log(f"hits dim {dim} {what}: {BATCH / sub / 1e6:.1f}M keys/s, "
                    f"{out[-1]['ratio']:.2f}x {xp.__name__}.take ({time.perf_counter() - t0:.0f}s)")
        del dense, host, ps
    return out


def powerlaw(be: Backend, rows: int, dim: int, fraction: float, alpha: float, warm: int,
             measure: int, rounds: int) -> dict:
    from tierserve.ps.config import ModelConfig, PSConfig
    from tierserve.ps.hash_map import HashMapConfig
    from tierserve.ps.hierarchy import HierarchicalParameterServer
    from tierserve.ps.sparse_file import write_sparse_model

    rng = np.random.default_rng(1)
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        folder = Path(tmp) / "bench0_sparse_0.model"
        t0 = time.perf_counter()
        emb = np.empty((rows, dim), dtype=np.float32)
        for s in range(0, rows, 1 << 20):
            emb[s : s + (1 << 20)] = rng.random((min(1 << 20, rows - s), dim), dtype=np.float32)
        write_sparse_model(folder, np.arange(rows, dtype=np.int64), emb)
        del emb
        config = PSConfig(volatile_db=HashMapConfig(), models=[ModelConfig(
            model=MODEL, sparse_files=[str(folder)], embedding_vecsize_per_table=[dim],
            maxnum_catfeature_query_per_table_per_sample=[26], embedding_table_names=[TABLE],
        )])
        hps = HierarchicalParameterServer(config)
        log(f"powerlaw: {rows} rows written and loaded in {time.perf_counter() - t0:.1f}s")
        batches = _zipf_batches(rows, alpha, warm + measure, rng)
        with hps, EmbeddingCache(hps, MODEL, TABLE, dim, int(fraction * rows), use_gpu=be.gpu,
                                 hit_rate_threshold=0.9) as cache:
            for b in batches[:warm]:
                cache.query(b)
            cache.flush()
            before = cache.metrics()
            for b in batches[warm:]:
                cache.query(b)
            cache.flush()
            after = cache.metrics()
            hits_ = after.hits - before.hits
            hit_rate = hits_ / max(1, hits_ + after.misses - before.misses)
            timed = batches[warm:]
            sub, peer = alternate(lambda i: cache.query(timed[i]),
                                  lambda i: hps.lookup(MODEL, TABLE, timed[i]),
                                  len(timed), rounds, sync=be.sync)
            return {
                "rows": rows, "dim": dim, "alpha": alpha, "cache_fraction": fraction,
                "capacity": cache.capacity, "hit_rate": hit_rate, "keys_per_s": BATCH / sub,
                "peer": "hash_map lookup", "peer_keys_per_s": BATCH / peer, "ratio": peer / sub,
            }


def writes(be: Backend, capacity: int, dim: int, batches: int) -> list[dict]:
    """Insert rate into a full table and overwrite rate of cached rows (keys/s, median)."""
    xp = be.xp
    rng = np.random.default_rng(3)
    vectors = be.to_device(rng.random((BATCH, dim), dtype=np.float32))
    fill = np.arange(capacity, dtype=np.int64)
    out = []
    if be.gpu:
        from tierserve.cache.kernels import load_kernels

        variants = [("kernel", load_kernels()), ("cupy passes", None)]
    else:
        variants = [("numpy (numba)", None)]
    for label, kernels in variants:
        table = SetAssociativeTable(capacity, dim, 2, xp)
        table.kernels = kernels
        for s in range(0, capacity, 1 << 20):
            k = be.to_device(fill[s : s + (1 << 20)])
            table.insert(k, xp.zeros((k.size, dim), np.float32), 1)
        times = []
        for i in range(batches):
            keys = be.to_device(capacity + i * BATCH + np.arange(BATCH, dtype=np.int64))
            be.sync()
            t = time.perf_counter()
            table.insert(keys, vectors, 2 + i)
            be.sync()
            times.append(time.perf_counter() - t)
        out.append({"what": f"insert new keys (table full: each evicts), {label}", "dim": dim,
                    "capacity": table.capacity, "keys_per_s": BATCH / float(np.median(times))})
        del table
    ps = DenseParameterServer(rng.random((capacity, dim), dtype=np.float32))
    with EmbeddingCache(ps, MODEL, TABLE, dim, capacity, use_gpu=be.gpu,
                        hit_rate_threshold=1.0, listen=False) as cache:
        _fill(cache, capacity)
        held = be.to_host(cache._table.cached_keys())
        host_vectors = be.to_host(vectors)
        times = []
        for _ in range(batches):
            keys = held[rng.integers(0, held.size, BATCH)]
            keys = np.unique(keys)
            be.sync()
            t = time.perf_counter()
            cache.on_update(MODEL, TABLE, keys, host_vectors[: keys.size])
            be.sync()
            times.append((time.perf_counter() - t) / keys.size)
        out.append({"what": "update cached rows (EmbeddingCache.on_update, host vectors)",
                    "dim": dim, "capacity": cache.capacity,
                    "keys_per_s": 1.0 / float(np.median(times))})
    for r in out:
        log(f"writes dim {dim}: {r['what']}: {r['keys_per_s'] / 1e6:.2f}M keys/s")
    return out


def run(be: Backend, dry_run: bool) -> dict:
    """Every part of the stage; a part that raises is recorded and the others still run."""
    rows = 50_000 if dry_run else 10_000_000
    parts = {
        "hits": lambda: hits(be, rows, [16, 128], rounds=2 if dry_run else 5),
        "powerlaw": lambda: powerlaw(be, rows, 16, 0.2, 1.2, warm=4 if dry_run else 40,
                                     measure=4 if dry_run else 16, rounds=1 if dry_run else 2),
        "writes": lambda: writes(be, rows // 5, 16, batches=4 if dry_run else 20)
        + writes(be, rows // 5, 128, batches=4 if dry_run else 20),
    }
    out: dict = {}
    for name, fn in parts.items():
        t0 = time.perf_counter()
        try:
            out[name] = fn()
        except Exception as exc:  # reported in the summary; the other parts still run
            import traceback

            traceback.print_exc()
            out[name] = {"error": f"{type(exc).__name__}: {exc}"}
        log(f"cache/{name}: {time.perf_counter() - t0:.1f}s")
    return out
