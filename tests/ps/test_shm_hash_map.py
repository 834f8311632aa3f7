"""``multi_process_hash_map``: tables in shared memory, read and written by several real
processes (ps/shm_hash_map.py)."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import uuid

import numpy as np
import pytest
from polling import until

from tierserve.core.errors import ConfigError
from tierserve.ps import shm_expiry, shm_hash_map
from tierserve.ps.config import load_ps_config
from tierserve.ps.hash_table import _TICK_REBASE
from tierserve.ps.shm_hash_map import MultiProcessHashMapConfig
from tierserve.ps.tier_registry import create_tier

TAG = "hps_et.m.t@2"
DIM = 8


@pytest.fixture
def name():
    folder = f"tierserve-test-{uuid.uuid4().hex[:12]}"
    yield folder
    import shutil

    shutil.rmtree(shm_hash_map.SHM_ROOT / folder, ignore_errors=True)


def _rows(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    return rng.permutation(10 * n)[:n].astype(np.int64), rng.random((n, DIM), dtype=np.float32)


def _tier(name: str, **extra):
    return create_tier(MultiProcessHashMapConfig(shared_memory_name=name, **extra))


def _other_process(name, keys, emb, commands, replies, ttl=None):
    """Another process of the host: loads the same table, then runs commands."""
    tier = _tier(name)
    tier.create_table(TAG, DIM)
    tier.set_ttl(TAG, ttl)
    tier.load_table(TAG, keys, emb)
    replies.put(("loaded", os.getpid()))
    while True:
        command, arg = commands.get()
        if command == "lookup":
            replies.put(tier.lookup(TAG, arg))
        elif command == "insert":
            tier.insert(TAG, *arg)
            replies.put("done")
        elif command == "expire":
            replies.put((tier.expire(TAG), tier.stats.expired, tier.size(TAG)))
        elif command == "drop":
            tier.drop_table(TAG)
            replies.put("done")
        elif command == "exit":
            tier.close()
            return


@contextlib.contextmanager
def _other(name, keys, emb, ttl=None):
    """``(commands, replies)`` of another process that loaded the table (:func:`_other_process`),
    stopped at the end."""
    ctx = multiprocessing.get_context("spawn")
    commands, replies = ctx.Queue(), ctx.Queue()
    other = ctx.Process(target=_other_process, args=(name, keys, emb, commands, replies, ttl))
    other.start()
    try:
        assert replies.get(timeout=60)[0] == "loaded"
        yield commands, replies
        commands.put(("exit", None))
        other.join(timeout=30)
    finally:
        if other.is_alive():
            other.kill()


def test_processes_share_one_copy_and_see_each_others_writes(name):
    keys, emb = _rows(200_000)
    tier = _tier(name)
    tier.create_table(TAG, DIM)
    tier.load_table(TAG, keys, emb)
    folder = shm_hash_map.SHM_ROOT / name
    files = sorted(p.name for p in folder.iterdir())
    try:
        with _other(name, keys, emb) as (commands, replies):
            # the other process attached: no second copy of the slots
            assert sorted(p.name for p in folder.iterdir()) == files
            data = [p for p in folder.iterdir() if p.name.split(".")[-1].isdigit()]
            assert len(data) == 1 and data[0].stat().st_size >= keys.size * DIM * 4
            probe = np.concatenate([keys[:1000], [-5, 10 * keys.size + 1]])
            commands.put(("lookup", probe))
            their_emb, their_found = replies.get(timeout=30)
            ours_emb, ours_found = tier.lookup(TAG, probe)
            np.testing.assert_array_equal(their_found, ours_found)
            np.testing.assert_array_equal(their_emb[:1000], emb[:1000])
            np.testing.assert_array_equal(ours_emb[:1000], emb[:1000])
            # its writes (overwrites, and new keys past a rebuild) are read here without a reload
            new_keys = np.arange(10 * keys.size + 10, 10 * keys.size + 200_010, dtype=np.int64)
            new_emb = np.full((new_keys.size, DIM), 3.0, np.float32)
            commands.put(("insert", (np.concatenate([keys[:10], new_keys]),
                                     np.concatenate([np.zeros((10, DIM), np.float32), new_emb]))))  # fmt: skip
            assert replies.get(timeout=60) == "done"
            got, found = tier.lookup(TAG, np.concatenate([keys[:10], new_keys[-5:]]))
            assert found.all()
            np.testing.assert_array_equal(got[:10], 0.0)
            np.testing.assert_array_equal(got[10:], 3.0)
            assert tier.size(TAG) == keys.size + new_keys.size
            # and ours there
            tier.insert(TAG, keys[10:20], np.full((10, DIM), 7.0, np.float32))
            commands.put(("lookup", keys[10:20]))
            np.testing.assert_array_equal(replies.get(timeout=30)[0], 7.0)
            # the other drops it: we keep reading; we drop it last: the files go
            commands.put(("drop", None))
            assert replies.get(timeout=30) == "done"
            assert tier.lookup(TAG, keys[:5])[1].all()
            tier.drop_table(TAG)
            assert list(folder.iterdir()) == []
    finally:
        tier.close()


def test_different_rows_under_one_storage_name_are_never_mixed(name):
    a, b = _tier(name), _tier(name)
    keys, emb = _rows(1000, 1)
    a.create_table(TAG, DIM)
    a.load_table(TAG, keys, emb)
    b.create_table(TAG, DIM)
    b.load_table(TAG, keys, emb * 2)  # another version that got the same storage name
    np.testing.assert_array_equal(a.lookup(TAG, keys)[0], emb)
    np.testing.assert_array_equal(b.lookup(TAG, keys)[0], emb * 2)
    a.close()
    b.close()


def test_a_table_that_does_not_fit_is_refused_naming_the_size(name, monkeypatch):
    keys, emb = _rows(100_000)
    tier = _tier(name, shared_memory_size=1 << 20)
    tier.create_table(TAG, DIM)
    with pytest.raises(ConfigError, match="shared_memory_size 1.0 MiB"):
        tier.load_table(TAG, keys, emb)
    tier.close()

    class Tiny:  # /dev/shm as small as a container's default
        f_bavail, f_frsize = 16, 4096

    monkeypatch.setattr(shm_hash_map.os, "statvfs", lambda path: Tiny)
    tier = _tier(name)
    tier.create_table(TAG, DIM)
    with pytest.raises(ConfigError, match=r"/dev/shm has 0.1 MiB free .*shm_size"):
        tier.load_table(TAG, keys, emb)
    tier.close()


def test_ps_json_names_it_as_hugectr_does(tmp_path):
    path = tmp_path / "ps.json"
    path.write_text(
        '{"volatile_db": {"type": "multi_process_hash_map", "shared_memory_size": 1073741824,'
        ' "shared_memory_name": "tierserve-x", "num_partitions": 2}, "models": []}'
    )
    config = load_ps_config(path).volatile_db
    assert (config.shared_memory_size, config.shared_memory_name, config.num_partitions) == (
        1 << 30, "tierserve-x", 2,
    )  # fmt: skip
    path.write_text(
        '{"volatile_db": {"type": "multi_process_hash_map", "heart_beat": 1}, "models": []}'
    )
    with pytest.raises(ConfigError, match="heart_beat"):
        load_ps_config(path)
    path.write_text(
        '{"volatile_db": {"type": "multi_process_hash_map", "initialize_after_startup": false},'
        ' "models": []}'
    )
    with pytest.raises(ConfigError, match="initialize_after_startup false is not available"):
        load_ps_config(path)


def test_fingerprints_tell_compact_rows_apart():
    """Compact rows are words that may read as NaN: the digest must still see every row."""
    from tierserve.ps.row_codec import RowCodec
    from tierserve.ps.shm_hash_map import fingerprint

    codec = RowCodec("int8", 16)
    rng = np.random.default_rng(0)
    keys = np.arange(8192, dtype=np.int64)
    emb = rng.standard_normal((8192, 16)).astype(np.float32)
    a = codec.encode(emb)
    emb[1] *= 3  # row 1 is not among the sampled rows (every 2nd from 0)
    b = codec.encode(emb)
    assert np.isnan(a).any()  # some words read as NaN
    assert fingerprint(keys, a) != fingerprint(keys, b)


TTL = 2.0  # short, but well above a round trip to the other process on a busy machine


def _ttl_tier(name, keys, emb, ttl=TTL):
    tier = _tier(name)
    tier.create_table(TAG, DIM)
    tier.set_ttl(TAG, ttl)
    tier.load_table(TAG, keys, emb)
    return tier


def test_a_ttl_counts_on_one_clock_and_one_process_sweeps_for_all(name):
    keys, emb = np.arange(1, 101, dtype=np.int64), np.ones((100, DIM), np.float32)
    tier = _ttl_tier(name, keys, emb)  # first user: the one that sweeps
    try:
        with _other(name, keys, emb, TTL) as (commands, replies):
            assert tier.size(TAG) == 100  # attached to our copy, not reloaded
            commands.put(("lookup", np.zeros(1, np.int64)))  # compiles its kernel (stamps first)
            replies.get(timeout=60)
            gone = []

            def swept_all_but_key_1() -> bool:
                commands.put(("lookup", keys[:1]))  # the other process keeps key 1 in use
                assert replies.get(timeout=30)[1].all()
                gone.append(tier.expire(TAG))
                return tier.size(TAG) == 1

            # Its stamps count on our clock: key 1 stays while the rows nobody uses expire.
            assert until(swept_all_but_key_1, timeout=60)
            assert tier.contains(TAG, keys[:1]).all()
            assert sorted(np.concatenate(gone).tolist()) == list(range(2, 101))
            assert tier.stats.expired == 99
            # The other process removed nothing itself, and hears of every expired key, once.
            commands.put(("expire", None))
            their_keys, their_expired, their_size = replies.get(timeout=30)
            assert sorted(their_keys.tolist()) == list(range(2, 101))
            assert (their_expired, their_size) == (0, 1)
            commands.put(("expire", None))
            assert replies.get(timeout=30)[0].size == 0
            # Both read it: the next sweep empties the log.
            tier.expire(TAG)
            for part in tier._tables[TAG]:
                assert part._log_path().stat().st_size == 0
            # We stop using the table: the other process sweeps now, and key 1 (unused) expires.
            tier.drop_table(TAG)

            def they_swept_key_1() -> bool:
                commands.put(("expire", None))
                their_keys, their_expired, their_size = replies.get(timeout=30)
                return their_keys.tolist() == [1] and their_expired == 1 and their_size == 0

            assert until(they_swept_key_1, timeout=60)
    finally:
        tier.close()


def test_processes_sharing_a_table_must_give_it_the_same_ttl(name):
    keys, emb = _rows(1000)
    tier = _ttl_tier(name, keys, emb)
    for ttl in (5.0, None):
        with pytest.raises(ConfigError, match=f"ttl_seconds {ttl} differs from the 2.0"):
            _ttl_tier(name, keys, emb, ttl)
    tier.close()


def test_the_shared_clock_rebases_before_its_ticks_overflow(name):
    keys, emb = np.arange(1, 11, dtype=np.int64), np.ones((10, DIM), np.float32)
    tier = _ttl_tier(name, keys, emb)
    (part,) = tier._tables[TAG]
    part.header[shm_expiry.CLOCK] -= _TICK_REBASE * 10**9 // 10  # ~3.4 years on
    assert tier.lookup(TAG, keys[:1])[1].all()  # stamps key 1 now, then rebases
    assert part._now() < _TICK_REBASE // 2 + 100
    assert sorted(tier.expire(TAG).tolist()) == list(range(2, 11))  # stamped ~3.4 years ago
    assert tier.contains(TAG, keys).tolist() == [True] + [False] * 9
    tier.close()
