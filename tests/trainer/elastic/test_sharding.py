"""The shard dispatcher: every index once per epoch, across workers, also when a worker
stops holding shards it had not finished."""

import threading

import numpy as np
import pytest

from tierserve.core.errors import ConfigError, InvalidInputError
from tierserve.trainer.elastic import ShardDispatcher, ShardingClient


def covered(shards, size, epochs):
    counts = np.zeros((epochs, size), dtype=np.int64)
    for s in shards:
        counts[s.epoch, s.start : s.end] += 1
    return counts


@pytest.mark.parametrize(
    "size,batch,per_shard,epochs", [(1000, 16, 2, 1), (997, 7, 3, 3), (5, 64, 2, 2)]
)
def test_one_worker_covers_every_index_once_per_epoch(size, batch, per_shard, epochs):
    d = ShardDispatcher(size, batch, epochs, per_shard)
    client = ShardingClient(d)
    fetched = []
    while (shard := client.fetch_shard()) is not None:
        assert 0 < len(shard) <= batch * per_shard
        fetched.append(shard)
    assert d.finished() and d.pending() == 0
    assert (covered(fetched, size, epochs) == 1).all()
    assert [s.epoch for s in fetched] == sorted(s.epoch for s in fetched)
    assert sorted(d.completed, key=lambda s: s.id) == fetched


def test_workers_share_the_shards_and_a_stopped_workers_go_back():
    size, epochs = 10_000, 2
    d = ShardDispatcher(size, 50, epochs, 2, shuffle=True, seed=4)
    clients = [ShardingClient(d, f"w{i}") for i in range(4)]
    for c in clients:
        c.report_on_fetch = False  # shards are reported as batches are trained on
    done, dropped, alive = [], [], [True] * 4
    step = 0
    while any(alive):  # the workers take turns
        for i, client in enumerate(clients):
            if not alive[i]:
                continue
            shard = client.fetch_shard()
            if shard is None:
                alive[i] = False
                continue
            step += 1
            if i == 1 and step > 30:  # w1 stops halfway through a shard
                client.report_batch_done(len(shard) // 2)
                dropped.extend(client.stop())
                alive[i] = False
            elif i == 2 and step > 60 and len(client._held) < 3:
                continue  # w2 fetches ahead without training...
            elif i == 2 and step > 60:
                dropped.extend(client.stop())  # ...and stops holding three shards
                alive[i] = False
            else:
                client.report_batch_done(len(shard))
                done.append(shard)
    assert len(dropped) == 4  # the shard w1 was in, the three w2 held
    ids = [s.id for s in done]
    assert len(set(ids)) == len(ids) and {s.id for s in dropped} <= set(ids)
    # the others took the dropped shards over: each index exactly once per epoch
    assert (covered(done, size, epochs) == 1).all()
    assert (covered(d.completed, size, epochs) == 1).all() and d.finished()


def test_threads_fetching_at_once_get_disjoint_shards():
    d = ShardDispatcher(50_000, 10, 1, 1)
    got = [[] for _ in range(4)]

    def worker(i):
        client = ShardingClient(d, f"w{i}")
        while (shard := client.fetch_shard()) is not None:
            got[i].append(shard)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert (covered([s for g in got for s in g], 50_000, 1) == 1).all() and d.finished()


def test_dropped_shards_are_handed_out_first_and_reports_are_checked():
    d = ShardDispatcher(100, 10, 1, 1)
    a, b = ShardingClient(d, "a"), ShardingClient(d, "b")
    a.report_on_fetch = b.report_on_fetch = False
    first, second = a.fetch_shard(), a.fetch_shard()
    assert a.stop() == [first, second]
    assert b.fetch_shard() == first and b.fetch_shard() == second
    with pytest.raises(InvalidInputError, match="held by 'b', not 'a'"):
        d.report_done(first.id, "a")
    d.report_done(first.id, "b")
    with pytest.raises(InvalidInputError, match="not handed out"):
        d.report_done(first.id, "b")
    with pytest.raises(ConfigError, match="batch_size"):
        ShardDispatcher(10, 0)
    with pytest.raises(ConfigError, match="dataset_size"):
        ShardDispatcher(-1)
    assert ShardDispatcher(0).fetch_shard() is None


def test_forever_keeps_making_epochs():
    d = ShardDispatcher(10, 5, None, 1)
    client = ShardingClient(d)
    shards = [client.fetch_shard() for _ in range(7)]
    assert [s.epoch for s in shards] == [0, 0, 1, 1, 2, 2, 3] and not d.finished()
