"""``refresh_time_after_fetch`` is honoured by the in-process hash maps, as by Redis (issue
13): with it, a read stamps the rows' access time, so evict_oldest keeps rows that are read;
without it (HugeCTR's default) only writes do."""

from __future__ import annotations

import numpy as np
import pytest

from tierserve.ps.hash_map import HashMapConfig, ParallelHashMapConfig
from tierserve.ps.tier_registry import create_tier


@pytest.mark.parametrize("kind", ["hash_map", "parallel_hash_map"])
@pytest.mark.parametrize("refresh", [False, True])
def test_reads_refresh_the_time_only_when_asked(kind, refresh):
    settings = dict(overflow_margin=100, overflow_resolution_target=0.5,
                    overflow_policy="evict_oldest", refresh_time_after_fetch=refresh)
    config = (HashMapConfig(**settings) if kind == "hash_map"
              else ParallelHashMapConfig(num_partitions=1, **settings))
    tier = create_tier(config)
    tag = "hps_et.refresh.t"
    tier.create_table(tag, 2)
    old, new = np.arange(50), np.arange(50, 100)
    tier.insert(tag, old, np.zeros((50, 2), np.float32))
    tier.insert(tag, new, np.zeros((50, 2), np.float32))
    for _ in range(3):
        assert tier.lookup(tag, old)[1].all()
    tier.insert(tag, np.array([100]), np.zeros((1, 2), np.float32))  # overflow: evict to 50
    kept_old = int(tier.lookup(tag, old)[1].sum())
    kept_new = int(tier.lookup(tag, new)[1].sum())
    if refresh:
        # the 50 newest stay: key 100, then the rows read (49 of them), none of the others
        assert kept_old == 49 and kept_new == 0
    else:
        assert kept_old == 0  # written first, so oldest, however often read
    tier.close()
