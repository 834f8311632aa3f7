"""Redis Cluster failover: a master is SIGKILLed, its replica is promoted, the tier follows.

A real cluster of three masters with one replica each (``cluster-node-timeout`` 1 s, so the
replica takes over about two seconds after the kill).  While the partition has no master its
keys read as not found (never an exception); once the replica says ``ROLE`` master, the tier
finds the promoted node within a bounded time and reads and writes the rows it holds.
"""

from __future__ import annotations

import time
import uuid

import numpy as np
import pytest
from polling import until
from ps_helpers import expected

from tierserve.core.errors import BackendUnavailableError
from tierserve.ps.partition import partition_of
from tierserve.ps.redis_tier import RedisClusterConfig, value_hash
from tierserve.ps.tier_registry import create_tier

#: How soon after the promotion is visible the tier must read the rows again: one topology
#: refresh (``topology_refresh_ms``, 500 here) plus slack for a loaded 2-core machine.
FOLLOW_WITHIN_S = 3.0
PARTITIONS = 8
DIM = 4


@pytest.fixture
def failover_cluster(redis_cluster_factory):
    return redis_cluster_factory(masters=3, replicas=1, node_timeout_ms=1000)


def _tier(cluster):
    config = RedisClusterConfig(
        address=cluster.addresses, num_partitions=PARTITIONS, socket_timeout_ms=300,
        connect_timeout_ms=300, failure_threshold=2, failure_backoff_ms=200,
        max_failure_backoff_ms=1000, topology_refresh_ms=500,
    )  # fmt: skip
    tier = create_tier(config)
    tag = f"hps_et.f{uuid.uuid4().hex[:10]}.emb"
    tier.create_table(tag, DIM)
    keys = np.arange(4000, dtype=np.int64)
    tier.insert(tag, keys, expected(keys, DIM))
    cluster.wait_replicated()  # every row is on the replicas too
    return tier, tag, keys


def test_a_killed_master_is_followed_to_its_promoted_replica(failover_cluster):
    cluster = failover_cluster
    tier, tag, keys = _tier(cluster)
    with tier:
        victim = cluster.node_index_for_key(value_hash(tag, 0))
        replica = cluster.replicas_of(victim)[0]
        on_victim = np.isin(
            partition_of(keys, PARTITIONS),
            [p for p in range(PARTITIONS)
             if cluster.node_index_for_key(value_hash(tag, p)) == victim],
        )  # fmt: skip
        assert on_victim.any() and not on_victim.all()
        cluster.kill_node(victim)
        killed = time.monotonic()
        down_lookups = 0

        def promoted() -> bool:
            # Meanwhile: lookups answer (the dead master's keys as not found), never raise.
            nonlocal down_lookups
            emb, found = tier.lookup(tag, keys)
            assert found[~on_victim].all()
            np.testing.assert_array_equal(emb[found], expected(keys[found], DIM))
            down_lookups += 1
            return cluster.role(replica) == "master"

        assert until(promoted, timeout=30), "the replica was never promoted"
        promoted_at = time.monotonic()
        assert down_lookups > 1

        def all_found() -> bool:
            return bool(tier.lookup(tag, keys)[1].all())

        assert until(all_found, timeout=30), (
            f"the promoted replica's rows were never read again (breakers {tier.breakers.states()})"
        )
        took = time.monotonic() - promoted_at
        print(f"promoted {promoted_at - killed:.2f} s after the kill; rows read again "
              f"{took:.2f} s after the promotion was visible")  # fmt: skip
        assert took < FOLLOW_WITHIN_S, took
        emb, found = tier.lookup(tag, keys)
        np.testing.assert_array_equal(emb, expected(keys, DIM))

        # Writes go to the promoted master too.
        fresh = expected(keys[on_victim], DIM, seed=7)

        def written() -> bool:
            try:
                tier.insert(tag, keys[on_victim], fresh)
            except BackendUnavailableError:
                return False
            return True

        assert until(written, timeout=FOLLOW_WITHIN_S)
        np.testing.assert_array_equal(tier.lookup(tag, keys[on_victim])[0], fresh)
