"""A stream of new ids against a table with a TTL: its size stays bounded, and the embedding
cache in front of it hits as often as without expiry.

    python -m bench.ps.ttl_stream                       # 1,800 s (the full run), TTL 60 s
    python -m bench.ps.ttl_stream --seconds 120 --ttl 15 --rate 2000

Each run serves one table (dim 16, ``hash_map`` tier, 10,000 ids loaded) through an
:class:`~tierserve.cache.embedding_cache.EmbeddingCache` of ``--cache`` rows.  Every 10 ms,
``--rate / 100`` new ids get a vector by an online update (``apply_update``, the path Kafka
updates take, without the broker) and a batch of ``--batch`` lookups is drawn Zipf
(``--zipf``) over the ids by recency: rank r is the r-th newest id, so new ids are popular
and old ones fade, as in a feed of new items.  The same seeded stream runs twice, with
``ttl_seconds: --ttl`` and with no expiry, the cache the same size in both.  Reported per
run: the table's rows at the end and at most (sampled every second), the cache hit rate,
the rows expired, and the drop of the hit rate.  Every second the TTL run's table is checked
against the ids written or looked up within the last TTL plus one sweep interval (a row
used earlier must be gone): the most rows beyond that count is printed (0: within bound).

The last line of output is ``RESULT {json}``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from tierserve.cache.embedding_cache import EmbeddingCache
from tierserve.ps import HierarchicalParameterServer
from tierserve.ps.config import parse_ps_config
from tierserve.ps.expiry import sweep_interval
from tierserve.ps.sparse_file import write_sparse_model
from tierserve.ps.table_tag import table_tag

DIM = 16
LOADED = 10_000
STEP_S = 0.01


def _server(folder: Path, ttl: float | None) -> HierarchicalParameterServer:
    path = folder / "m" / "m0_sparse_0.model"
    keys = np.arange(LOADED, dtype=np.int64)
    write_sparse_model(path, keys, np.zeros((LOADED, DIM), np.float32))
    model = {"model": "m", "sparse_files": [str(path)], "embedding_vecsize_per_table": [DIM],
             "maxnum_catfeature_query_per_table_per_sample": [1], "ttl_seconds": ttl}  # fmt: skip
    return HierarchicalParameterServer(parse_ps_config({
        "volatile_db": {"type": "hash_map"}, "models": [model],
    }))  # fmt: skip


def run(args, ttl: float | None) -> dict:
    rng = np.random.default_rng(args.seed)
    per_step = max(1, args.rate // 100)
    with tempfile.TemporaryDirectory() as tmp, _server(Path(tmp), ttl) as ps:
        tier = ps.tiers["volatile"]
        storage = table_tag("m", "sparse_embedding1")
        cache = EmbeddingCache(ps, "m", "sparse_embedding1", DIM, args.cache)
        try:
            newest = LOADED - 1
            start = time.monotonic()
            # When each id was last written or looked up: a row can only be alive if that
            # was within its TTL plus one sweep interval (and the sweep's tick).
            used = np.full(LOADED + int(args.rate * args.seconds * 1.1) + 100, start)
            window = (ttl or 0.0) + sweep_interval([ttl]) + 0.2
            next_sample, peak, over, steps = start + 1.0, 0, 0, 0
            while time.monotonic() - start < args.seconds:
                new = np.arange(newest + 1, newest + 1 + per_step, dtype=np.int64)
                ps.apply_update(storage, new, rng.standard_normal((new.size, DIM), np.float32))
                newest += per_step
                ranks = np.minimum(rng.zipf(args.zipf, args.batch) - 1, newest)
                cache.query(newest - ranks)
                now = time.monotonic()
                used[new] = now
                used[newest - ranks] = now
                steps += 1
                if now >= next_sample:
                    size = tier.size(storage)
                    peak = max(peak, size)
                    if ttl is not None:  # rows beyond those used within the window
                        alive = int(np.count_nonzero(used[: newest + 1] >= now - window))
                        over = max(over, size - alive)
                    next_sample = now + 1.0
                    if args.progress:
                        print(f"  [{'ttl' if ttl else 'no expiry'}] {now - start:5.0f} s: "
                              f"{tier.size(storage):,} rows", flush=True)  # fmt: skip
                time.sleep(max(0.0, start + steps * STEP_S - time.monotonic()))
            elapsed = time.monotonic() - start
            m = cache.metrics()
            return {"ttl": ttl, "seconds": round(elapsed, 1), "ids_added": newest + 1 - LOADED,
                    "rows_end": tier.size(storage), "rows_peak": max(peak, tier.size(storage)),
                    "expired": tier.stats.expired, "hit_rate": round(m.hit_rate, 4),
                    "rows_beyond_used_in_window": over,
                    "rate_achieved": round((newest + 1 - LOADED) / elapsed)}  # fmt: skip
        finally:
            cache.close()


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=1800.0)
    p.add_argument("--ttl", type=float, default=60.0)
    p.add_argument("--rate", type=int, default=1000, help="new ids per second")
    p.add_argument("--batch", type=int, default=256, help="lookups per 10 ms")
    p.add_argument("--zipf", type=float, default=1.2)
    p.add_argument("--cache", type=int, default=8192, help="embedding cache rows")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--progress", action="store_true")
    args = p.parse_args(argv)
    with_ttl = run(args, args.ttl)
    without = run(args, None)
    result = {"with_ttl": with_ttl, "no_expiry": without,
              "within_bound": with_ttl["rows_beyond_used_in_window"] <= 0,
              "hit_rate_drop": round(without["hit_rate"] - with_ttl["hit_rate"], 4)}  # fmt: skip
    for name, r in (("ttl", with_ttl), ("no expiry", without)):
        print(f"{name:>9}: {r['ids_added']:,} new ids in {r['seconds']} s; rows peak "
              f"{r['rows_peak']:,}, end {r['rows_end']:,}; expired {r['expired']:,}; "
              f"cache hit rate {r['hit_rate']:.4f}")  # fmt: skip
    print(f"table within the rows used in the last ttl + sweep interval: "
          f"{'met' if result['within_bound'] else 'NOT met'} (most rows beyond: "
          f"{with_ttl['rows_beyond_used_in_window']:,}); hit rate drop "
          f"{result['hit_rate_drop']:+.4f} (target <= 0.01)")
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
