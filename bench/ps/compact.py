"""Compact rows (``storage_dtype``): memory per row in each tier, and lookup speed, float16 and
int8 against float32 in the same run.

    python -m bench.ps.compact memory --rows 10000000 --dims 16 --tiers hash_map,multi_process_hash_map
    python -m bench.ps.compact memory --rows 1000000 --dims 16,128 --tiers rocks_db,redis
    python -m bench.ps.compact speed --rows 2000000 --dims 16,128

``memory`` loads the same table (``bench.ps.run``'s: scattered int64 keys) as float32, float16 and
int8 into each tier and prints the tier's bytes per row and their ratio to float32's
(the target: float16 <= 0.55x, int8 <= 0.35x), and the bytes over the raw float32 vectors
(``rows x dim x 4``).  Bytes are: the hash map's arrays (``nbytes``); the /dev/shm map's
files; RocksDB's SST files after the load's compaction; Redis's ``used_memory`` growth (a
server started for the run).

``speed`` times lookups as the parameter server makes them (``tier.lookup_decoded``: the
kernel decodes each row as it copies it) on the hash map, and hits of the embedding cache
(CPU: queries of the keys it holds, all hits), for each dtype against float32, alternating,
several rounds; it prints the median rate and the ratio to float32 (the target: >= 0.9x).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np

from tierserve.ps.row_codec import RowCodec
from tierserve.ps.sparse_file import encode_rows
from tierserve.ps.tier_registry import create_tier

from .run import BATCH, ROOT, log, make_batches, make_table

TAG = "hps_et.bench.compact"
DTYPES = ("float32", "float16", "int8")


# --- memory ----------------------------------------------------------------------------------


def _folder_bytes(path: Path, pattern: str = "*") -> int:
    return sum(p.stat().st_size for p in path.rglob(pattern) if p.is_file())


def _settled_used_memory(raw) -> int:
    """``used_memory`` once Redis has freed what earlier runs' tables held (a dropped
    table's hashes are freed in the background: UNLINK)."""
    for _ in range(600):
        info = raw.info("memory")
        if int(info.get("lazyfree_pending_objects", 0)) == 0:
            return int(info["used_memory"])
        time.sleep(0.05)
    raise RuntimeError("redis did not finish freeing dropped tables in 30 s")


@contextlib.contextmanager
def _tier(kind: str, tmp: Path, redis_url: str | None):
    from tierserve.ps.hash_map import HashMapConfig
    from tierserve.ps.redis_tier import RedisConfig
    from tierserve.ps.rocksdb_tier import RocksDBConfig
    from tierserve.ps.shm_hash_map import SHM_ROOT, MultiProcessHashMapConfig

    if kind == "hash_map":
        tier = create_tier(HashMapConfig())
        yield tier, lambda: tier.nbytes(TAG)
    elif kind == "multi_process_hash_map":
        name = f"tierserve-bench-{uuid.uuid4().hex[:8]}"
        tier = create_tier(MultiProcessHashMapConfig(shared_memory_name=name,
                                                     shared_memory_size=20 * 2**30))  # fmt: skip
        yield tier, lambda: _folder_bytes(SHM_ROOT / name, "*.p*")
    elif kind == "rocks_db":
        path = tmp / f"rocksdb-{uuid.uuid4().hex[:8]}"
        tier = create_tier(RocksDBConfig(path=str(path), max_batch_size=100000))

        def sst() -> int:
            tier.flush()
            return _folder_bytes(path, "*.sst")

        yield tier, sst
    else:
        tier = create_tier(RedisConfig(address=redis_url, num_partitions=8))
        client = tier  # used_memory is read through a plain client below
        import redis

        raw = redis.Redis.from_url(redis_url)
        base = _settled_used_memory(raw)
        yield client, lambda: int(raw.info("memory")["used_memory"]) - base
        raw.close()
    tier.drop_table(TAG)
    tier.close()


def bench_memory(kinds, rows: int, dims, tmp: Path, redis_url: str | None) -> list[dict]:
    results = []
    for dim in dims:
        keys, emb = make_table(rows, dim)
        raw = rows * dim * 4
        for kind in kinds:
            sizes = {}
            for dtype in DTYPES:
                codec = RowCodec(dtype, dim)
                words = encode_rows(codec, emb, "bench table")
                with _tier(kind, tmp, redis_url) as (tier, measure):
                    t0 = time.perf_counter()
                    tier.create_table(TAG, codec.words)
                    tier.load_table(TAG, keys, words)
                    sizes[dtype] = measure()
                    log(f"  {kind} dim {dim} {dtype}: {sizes[dtype] / rows:.1f} B/row "
                        f"(loaded in {time.perf_counter() - t0:.1f}s)")  # fmt: skip
                del words
            for dtype in DTYPES:
                results.append({
                    "bench": "memory", "tier": kind, "rows": rows, "dim": dim, "dtype": dtype,
                    "bytes_per_row": sizes[dtype] / rows, "over_raw_float32": sizes[dtype] / raw,
                    "ratio_to_float32": sizes[dtype] / sizes["float32"],
                })  # fmt: skip
    return results


# --- speed -----------------------------------------------------------------------------------


def _median_rates(fns: dict, batches, rounds: int) -> dict:
    """Median keys/s of each ``fn(batch)``, run in turn per round (same batches, same run)."""
    for fn in fns.values():
        fn(batches[0])
    times = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            for b in batches:
                fn(b)
            times[name].append((time.perf_counter() - t0) / len(batches))
    return {name: BATCH / statistics.median(t) for name, t in times.items()}


def _hash_map_lookups(keys, emb, dim: int):
    from tierserve.ps.hash_map import HashMapConfig

    fns, tiers = {}, []
    for dtype in DTYPES:
        codec = RowCodec(dtype, dim)
        tier = create_tier(HashMapConfig())
        tier.create_table(TAG, codec.words)
        tier.load_table(TAG, keys, encode_rows(codec, emb, "bench table"))
        tiers.append(tier)

        def lookup(b, tier=tier, codec=codec):  # the server's path: decoded as copied
            return tier.lookup_decoded(TAG, keys[b], codec)[0]

        fns[dtype] = lookup
    return fns, tiers


class _Rows:
    """The parameter server a warmed cache never asks (every query hits)."""

    def __init__(self, keys, emb) -> None:
        order = np.argsort(keys)
        self.keys, self.emb = keys[order], emb[order]

    def lookup(self, model, table, keys):
        return self.emb[np.searchsorted(self.keys, keys)]


def _cache_hits(keys, emb, dim: int, cached: int):
    """Queries of the keys each cache holds after a warm-up with the first ``cached`` keys
    (a set-associative cache of twice that capacity keeps most, not all, of them: the
    others would be misses, fetched and encoded, which is not the lookup measured); returns
    ``(fns, caches, how many keys the batches draw from)``."""
    from tierserve.cache import EmbeddingCache

    ps = _Rows(keys[:cached], emb[:cached])
    fns, caches = {}, []
    for dtype in DTYPES:
        cache = EmbeddingCache(ps, "bench", "t", dim, 2 * cached, storage_dtype=dtype,
                               hit_rate_threshold=1.0, listen=False)  # fmt: skip
        for s in range(0, cached, 1 << 16):
            cache.query(keys[s : min(cached, s + (1 << 16))])
        caches.append(cache)
    # the same sets in every dtype's cache: the same keys stay
    held = keys[:cached][caches[0]._table.probe(keys[:cached])[1]]
    for dtype, cache in zip(DTYPES, caches, strict=True):
        assert cache._table.probe(held)[1].all()
        fns[dtype] = lambda b, cache=cache: cache.query(held[b])
    return fns, caches, held.size


def bench_speed(rows: int, dims, dists, batches_n: int, rounds: int, cache_rows: int) -> list[dict]:
    results = []
    for dim in dims:
        keys, emb = make_table(rows, dim)
        for what in ("hash_map", "cache"):
            cached = min(rows, cache_rows)
            if what == "hash_map":
                fns, owners = _hash_map_lookups(keys, emb, dim)
                n = rows
            else:
                fns, owners, n = _cache_hits(keys, emb, dim, cached)
            for dist in dists:
                batches = make_batches(n, dist, batches_n)
                rates = _median_rates(fns, batches, rounds)
                for dtype in DTYPES:
                    results.append({
                        "bench": "speed", "what": what, "rows": n, "dim": dim, "dist": dist,
                        "dtype": dtype, "lookups_per_s": rates[dtype],
                        "ratio_to_float32": rates[dtype] / rates["float32"],
                    })  # fmt: skip
                    log(f"  {what} dim {dim} {dist} {dtype}: {rates[dtype] / 1e6:.2f}M keys/s "
                        f"({rates[dtype] / rates['float32']:.2f}x float32)")  # fmt: skip
            for o in owners:
                o.close()
    return results


# --- main ------------------------------------------------------------------------------------


def _start_redis(tmp: Path):
    sys.path.insert(0, str(ROOT / "tests"))
    from services.redis import RedisServer, ensure_redis

    ensure_redis()
    server = RedisServer(tmp / "redis", tmp / "redis.log")
    (tmp / "redis").mkdir(parents=True, exist_ok=True)
    server.start()
    return server


def _print(results: list[dict]) -> None:
    for r in results:
        if r["bench"] == "memory":
            print(f"memory {r['tier']:<24} rows {r['rows']:>9,} dim {r['dim']:>3} {r['dtype']:<8}"
                  f" {r['bytes_per_row']:8.1f} B/row  {r['over_raw_float32']:.3f}x raw float32"
                  f"  {r['ratio_to_float32']:.3f}x float32")  # fmt: skip
        else:
            print(f"speed  {r['what']:<9} rows {r['rows']:>9,} dim {r['dim']:>3} {r['dist']:<8}"
                  f" {r['dtype']:<8} {r['lookups_per_s'] / 1e6:6.2f}M keys/s"
                  f"  {r['ratio_to_float32']:.2f}x float32")  # fmt: skip


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("what", choices=["memory", "speed"])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--dims", default="16,128")
    ap.add_argument("--tiers", default="hash_map,multi_process_hash_map,rocks_db,redis")
    ap.add_argument("--redis", default="", help="redis://host:port of a server to use "
                    "(default: one is started); measured by its used_memory")  # fmt: skip
    ap.add_argument("--dists", default="powerlaw,uniform")
    ap.add_argument("--batches", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--cache-rows", type=int, default=1_000_000, help="rows the cache holds")
    ap.add_argument("--json", default="", help="also write the results to this file")
    args = ap.parse_args(argv)
    dims = [int(d) for d in args.dims.split(",")]
    with tempfile.TemporaryDirectory(prefix="tierserve-bench-compact-") as tmp_name:
        tmp = Path(tmp_name)
        if args.what == "memory":
            kinds = args.tiers.split(",")
            server = None
            url = args.redis or None
            if "redis" in kinds and url is None:
                server = _start_redis(tmp)
                url = server.url
            try:
                results = bench_memory(kinds, args.rows, dims, tmp, url)
            finally:
                if server is not None:
                    server.stop()
        else:
            results = bench_speed(args.rows, dims, args.dists.split(","), args.batches,
                                  args.rounds, args.cache_rows)  # fmt: skip
    _print(results)
    if args.json:
        import json

        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
