"""The hierarchical parameter server: fall-through, defaults, caching, models and versions."""

from __future__ import annotations

import json
import logging
import threading

import numpy as np
import pytest
from polling import until
from ps_helpers import expected, write_model

from tierserve.core.errors import CorruptModelFileError, InvalidInputError, NotFoundError
from tierserve.ps import CreateParameterServer, HierarchicalParameterServer
from tierserve.ps.config import parse_ps_config


def server(tmp_path, models, volatile=None, persistent=None, **top):
    config = {
        "volatile_db": volatile if volatile is not None else {"type": "hash_map"},
        "persistent_db": persistent if persistent is not None else {"type": "disabled"},
        "models": models,
        **top,
    }
    return HierarchicalParameterServer(parse_ps_config(config))


def rocks(tmp_path, **extra):
    return {"type": "rocks_db", "path": str(tmp_path / "rocksdb"), **extra}


def test_lookup_from_the_volatile_tier(tmp_path):
    model = write_model(tmp_path, "m", [(np.arange(100), 4), (np.arange(0, 300, 3), 16)])
    with server(tmp_path, [model]) as ps:
        np.testing.assert_array_equal(ps.lookup("m", "sparse_embedding1", [5, 99, 0]),
                                      expected([5, 99, 0], 4))
        got = ps.lookup("m", "sparse_embedding2", np.array([3, 297], np.int64))
        np.testing.assert_array_equal(got, expected([3, 297], 16, table=1))
        assert got.dtype == np.float32


def test_unknown_keys_get_the_table_default(tmp_path):
    model = write_model(tmp_path, "m", [(np.arange(10), 4), (np.arange(10), 2)])
    with server(tmp_path, [model], persistent=rocks(tmp_path)) as ps:
        got = ps.lookup("m", "sparse_embedding1", [1, 1000, 2])
        np.testing.assert_array_equal(got[1], [-1] * 4)
        np.testing.assert_array_equal(got[[0, 2]], expected([1, 2], 4))
        np.testing.assert_array_equal(ps.lookup("m", "sparse_embedding2", [-7]), [[-2, -2]])
        assert ps.lookup("m", "sparse_embedding1", np.empty(0, np.int64)).shape == (0, 4)


def test_fall_through_order_volatile_then_persistent_then_default(tmp_path):
    model = write_model(tmp_path, "m", [(np.arange(10), 4)])
    vol = {"type": "hash_map", "initial_cache_rate": 0.5}
    with server(tmp_path, [model], volatile=vol, persistent=rocks(tmp_path)) as ps:
        storage = ps.model("m").table("sparse_embedding1").storage
        # key 0 is in both tiers: make the volatile copy differ so we see who answered.
        ps.volatile.insert(storage, np.array([0]), np.full((1, 4), 42, np.float32))
        assert ps.volatile.size(storage) == 5 and ps.persistent.size(storage) == 10
        got = ps.lookup("m", "sparse_embedding1", [0, 7, 12345])
        np.testing.assert_array_equal(got[0], [42] * 4)  # volatile first
        np.testing.assert_array_equal(got[1], expected([7], 4)[0])  # then persistent
        np.testing.assert_array_equal(got[2], [-1] * 4)  # then the default
        stats = ps.tier_stats()
        assert (stats["volatile"].hits, stats["volatile"].misses) == (1, 2)
        assert (stats["persistent"].hits, stats["persistent"].misses) == (1, 1)


@pytest.mark.parametrize("cache", [True, False])
def test_cache_missed_embeddings_copies_persistent_hits_up(tmp_path, cache):
    model = write_model(tmp_path, "m", [(np.arange(100), 4)])
    vol = {"type": "parallel_hash_map", "num_partitions": 2, "initial_cache_rate": 0.0,
           "cache_missed_embeddings": cache}
    with server(tmp_path, [model], volatile=vol, persistent=rocks(tmp_path)) as ps:
        storage = ps.model("m").table("sparse_embedding1").storage
        assert ps.volatile.size(storage) == 0
        first = ps.lookup("m", "sparse_embedding1", [3, 4, 500])
        assert ps.volatile.size(storage) == (2 if cache else 0)
        again = ps.lookup("m", "sparse_embedding1", [3, 4, 500])
        np.testing.assert_array_equal(first, again)
        np.testing.assert_array_equal(again[:2], expected([3, 4], 4))
        assert ps.tier_stats()["volatile"].hits == (2 if cache else 0)


@pytest.mark.parametrize("rate,cached", [(0.0, 0), (0.25, 25), (0.333, 34), (1.0, 100)])
def test_initial_cache_rate(tmp_path, rate, cached):
    model = write_model(tmp_path, "m", [(np.arange(100), 4)])
    vol = {"type": "hash_map", "initial_cache_rate": rate}
    with server(tmp_path, [model], volatile=vol, persistent=rocks(tmp_path)) as ps:
        storage = ps.model("m").table("sparse_embedding1").storage
        assert ps.volatile.size(storage) == cached
        assert ps.persistent.size(storage) == 100
        np.testing.assert_array_equal(ps.lookup("m", "sparse_embedding1", np.arange(100)),
                                      expected(np.arange(100), 4))


def test_two_models_with_several_tables(tmp_path):
    a = write_model(tmp_path, "a", [(np.arange(50), 4), (np.arange(20), 8)], seed=1)
    b = write_model(tmp_path, "b", [(np.arange(30), 4)], seed=2)
    with server(tmp_path, [a, b], persistent=rocks(tmp_path)) as ps:
        assert sorted(ps.models()) == ["a", "b"]
        ea, ea2 = ps.lookup_tables("a", [np.array([1, 2]), np.array([3])])
        np.testing.assert_array_equal(ea, expected([1, 2], 4, seed=1))
        np.testing.assert_array_equal(ea2, expected([3], 8, table=1, seed=1))
        np.testing.assert_array_equal(ps.lookup("b", "sparse_embedding1", [1, 2]),
                                      expected([1, 2], 4, seed=2))
        with pytest.raises(NotFoundError):
            ps.lookup("c", "sparse_embedding1", [1])
        with pytest.raises(NotFoundError):
            ps.lookup("b", "sparse_embedding2", [1])
        with pytest.raises(InvalidInputError):
            ps.lookup_tables("a", [np.array([1])])


def test_version_swap_while_another_thread_looks_up(tmp_path):
    keys = np.arange(2000)
    v1 = write_model(tmp_path / "v1", "m", [(keys, 8), (keys, 4)], fill=1.0)
    v2 = write_model(tmp_path / "v2", "m", [(keys, 8), (keys, 4)], fill=2.0)
    vol = {"type": "parallel_hash_map", "num_partitions": 2}
    with server(tmp_path, [v1], volatile=vol, persistent=rocks(tmp_path)) as ps:
        seen, errors, stop = set(), [], threading.Event()

        def reader():
            rng = np.random.default_rng(0)
            try:
                while not stop.is_set():
                    q = rng.integers(0, 2000, 512)
                    a, b = ps.lookup_tables("m", [q, q[:100]])
                    values = np.unique(np.concatenate([a.ravel(), b.ravel()]))
                    if values.size != 1:
                        errors.append(f"mixed versions in one call: {values}")
                    seen.add(float(values[0]))
            except Exception as exc:  # noqa: BLE001 - reported below
                errors.append(repr(exc))

        threads = [threading.Thread(target=reader) for _ in range(2)]
        for t in threads:
            t.start()
        try:
            configs = [parse_model(v2), parse_model(v1)] * 3
            for config in configs:
                ps.load_model(config)
        finally:
            stop.set()
            for t in threads:
                t.join()
        assert not errors, errors[:3]
        assert seen == {1.0, 2.0}
        assert float(ps.lookup("m", "sparse_embedding1", [0])[0, 0]) == 1.0
        # Replaced versions are gone from both tiers: only the live tables remain.
        live = {s.storage for s in ps.model("m").tables.values()}
        assert set(ps.volatile.tables()) == live
        assert set(ps.persistent.tables()) == live


def parse_model(entry):
    return parse_ps_config({"models": [entry]}).models[0]


def test_unload_frees_the_tables(tmp_path):
    a = write_model(tmp_path, "a", [(np.arange(100), 4)])
    b = write_model(tmp_path, "b", [(np.arange(100), 4)])
    with server(tmp_path, [a, b], persistent=rocks(tmp_path)) as ps:
        before = ps.volatile.nbytes(ps.model("a").table("sparse_embedding1").storage)
        assert before > 0
        ps.unload_model("a")
        assert ps.models() == ["b"]
        assert ps.volatile.tables() == [ps.model("b").table("sparse_embedding1").storage]
        assert ps.persistent.tables() == ps.volatile.tables()
        with pytest.raises(NotFoundError):
            ps.lookup("a", "sparse_embedding1", [1])


def test_a_version_staged_while_an_unloaded_one_is_still_dropped_keeps_its_tables(tmp_path):
    """An unloaded version whose last lookup is still running is dropped once that lookup
    ends; a version staged meanwhile must not take its storage name, or the drop would free
    the new version's tables (404 "no table", or default vectors) under its requests."""
    keys = np.arange(100)
    v1 = write_model(tmp_path / "v1", "m", [(keys, 4)], fill=1.0)
    v2 = write_model(tmp_path / "v2", "m", [(keys, 4)], fill=2.0)
    with server(tmp_path, [v1], persistent=rocks(tmp_path)) as ps:
        old = ps.model("m")
        assert old.acquire()  # a lookup of the unloaded version, still running
        dropping = threading.Thread(target=ps.drop_model, args=(old,))
        dropping.start()
        assert until(lambda: "m" not in ps.models())  # the drop waits for that lookup
        new = ps.load_model(parse_model(v2))
        old.release()
        dropping.join()
        assert new.table("sparse_embedding1").storage != old.table("sparse_embedding1").storage
        np.testing.assert_array_equal(ps.lookup("m", "sparse_embedding1", keys),
                                      np.full((100, 4), 2.0, np.float32))  # fmt: skip
        live = {s.storage for s in new.tables.values()}
        assert set(ps.volatile.tables()) == live == set(ps.persistent.tables())


def test_a_replaced_version_still_read_keeps_its_storage_from_later_versions(tmp_path):
    """Version 1 (the plain storage name) is replaced by version 2 but requests still read
    it; version 2 is unloaded, so nothing is committed or staged; version 3 must not take
    version 1's storage name (staging it first drops what is there: version 1's table)."""
    keys = np.arange(100)
    v1, v2, v3 = (write_model(tmp_path / f"v{i}", "m", [(keys, 4)], fill=float(i))
                  for i in (1, 2, 3))  # fmt: skip
    with server(tmp_path, [v1], persistent=rocks(tmp_path)) as ps:
        first = ps.model("m")
        view = ps.version_view(first)
        second = ps.stage_model(parse_model(v2))
        assert ps.commit_model(second) is first  # first is replaced, still read by requests
        ps.drop_model(second)  # unloaded: nothing of m is committed or staged now
        third = ps.load_model(parse_model(v3))
        assert third.table("sparse_embedding1").storage != first.table("sparse_embedding1").storage
        np.testing.assert_array_equal(view.lookup("m", "sparse_embedding1", keys),
                                      np.full((100, 4), 1.0, np.float32))  # fmt: skip
        ps.drop_model(first)  # its last request is done
        np.testing.assert_array_equal(ps.lookup("m", "sparse_embedding1", keys),
                                      np.full((100, 4), 3.0, np.float32))  # fmt: skip
        live = {s.storage for s in third.tables.values()}
        assert set(ps.volatile.tables()) == live == set(ps.persistent.tables())


def test_duplicate_keys_in_a_key_file_warn_with_a_count_and_the_last_row_wins(tmp_path, caplog):
    """As HugeCTR's backends insert a table's rows in order (a repeated key updates the row
    before), the last row of a key wins, in every tier alike; loading says how many rows
    were repeated instead of taking them silently."""
    from tierserve.ps.sparse_file import write_sparse_model

    keys = np.array([7, 3, 7, 9, 3, 7, 1], np.int64)
    vectors = np.arange(keys.size, dtype=np.float32)[:, None].repeat(4, 1)
    folder = tmp_path / "m0_sparse_0.model"
    write_sparse_model(folder, keys, vectors)
    model = {"model": "m", "sparse_files": [str(folder)], "embedding_vecsize_per_table": [4],
             "maxnum_catfeature_query_per_table_per_sample": [1]}  # fmt: skip
    vol = {"type": "parallel_hash_map", "num_partitions": 3}
    with (
        caplog.at_level(logging.WARNING, logger="tierserve.ps.hierarchy"),
        server(tmp_path, [model], volatile=vol, persistent=rocks(tmp_path)) as ps,
    ):
        storage = ps.model("m").table("sparse_embedding1").storage
        want = np.array([5, 4, 3, 6], np.float32)  # keys 7, 3, 9, 1: their last rows
        for level, tier in ps.tiers.items():
            got, found = tier.lookup(storage, np.array([7, 3, 9, 1]))
            assert found.all(), level
            np.testing.assert_array_equal(got[:, 0], want, err_msg=level)
    assert "3 rows repeat a key of an earlier row" in caplog.text
    assert str(folder) in caplog.text


def test_corrupt_sparse_file_fails_the_load_and_the_old_version_keeps_serving(tmp_path):
    v1 = write_model(tmp_path / "v1", "m", [(np.arange(100), 4)], fill=1.0)
    v2 = write_model(tmp_path / "v2", "m", [(np.arange(100), 4)], fill=2.0)
    vector_file = tmp_path / "v2" / "m" / "m0_sparse_0.model" / "emb_vector"
    with open(vector_file, "r+b") as f:
        f.truncate(100 * 4 * 4 - 6)
    with server(tmp_path, [v1], persistent=rocks(tmp_path)) as ps:
        tables_before = set(ps.volatile.tables())
        with pytest.raises(CorruptModelFileError, match="emb_vector"):
            ps.load_model(parse_model(v2))
        np.testing.assert_array_equal(ps.lookup("m", "sparse_embedding1", [1, 2]),
                                      np.ones((2, 4)))
        assert set(ps.volatile.tables()) == tables_before
        assert set(ps.persistent.tables()) == tables_before
        assert ps.model("m").generation == 1


def test_missing_sparse_file_fails_clearly(tmp_path):
    model = write_model(tmp_path, "m", [(np.arange(10), 4)])
    model["sparse_files"] = [str(tmp_path / "nope_sparse_0.model")]
    with pytest.raises(CorruptModelFileError, match="does not exist"):
        server(tmp_path, [model])


def test_int32_keys_when_supportlonglong_is_false(tmp_path):
    model = write_model(tmp_path, "m", [(np.arange(10), 4)])
    with server(tmp_path, [model], supportlonglong=False) as ps:
        got = ps.lookup("m", "sparse_embedding1", np.array([1, 2], np.int32))
        np.testing.assert_array_equal(got, expected([1, 2], 4))
        # int64 values that fit a 32-bit key are the same keys; others are refused
        got = ps.lookup("m", "sparse_embedding1", np.array([1, 2], np.int64))
        np.testing.assert_array_equal(got, expected([1, 2], 4))
        with pytest.raises(InvalidInputError, match="not a 32-bit key"):
            ps.lookup("m", "sparse_embedding1", np.array([2**32], np.int64))
    with server(tmp_path, [model]) as ps:  # int64 server also takes int32 keys
        got = ps.lookup("m", "sparse_embedding1", np.array([1], np.int32))
        np.testing.assert_array_equal(got, expected([1], 4))
        with pytest.raises(InvalidInputError):
            ps.lookup("m", "sparse_embedding1", np.array([1.5]))


def test_attach_to_an_existing_rocksdb_without_reloading(tmp_path):
    model = write_model(tmp_path, "m", [(np.arange(100), 4)])
    with server(tmp_path, [model], persistent=rocks(tmp_path)) as ps:
        ps.load_model("m")  # a reload: the live tables now have a versioned storage name
        ps.insert("m", "sparse_embedding1", [7], np.full((1, 4), 9, np.float32))
    # Remove the files: attaching must not read them.
    for f in (tmp_path / "m").rglob("*"):
        if f.is_file():
            f.unlink()
    vol = {"type": "hash_map", "initialize_after_startup": False}
    with server(tmp_path, [model], volatile=vol, persistent=rocks(tmp_path)) as ps:
        got = ps.lookup("m", "sparse_embedding1", [1, 7])
        np.testing.assert_array_equal(got[0], expected([1], 4)[0])
        np.testing.assert_array_equal(got[1], [9] * 4)
    with server(tmp_path, [model], persistent=rocks(tmp_path, read_only=True)) as ps:
        np.testing.assert_array_equal(ps.lookup("m", "sparse_embedding1", [7]), [[9] * 4])


def test_online_updates_respect_update_filters(tmp_path):
    a = write_model(tmp_path, "alpha", [(np.arange(10), 4)])
    b = write_model(tmp_path, "beta", [(np.arange(10), 4)])
    vol = {"type": "hash_map", "update_filters": ["alpha"]}
    with server(tmp_path, [a, b], volatile=vol, persistent=rocks(tmp_path)) as ps:
        new = np.full((2, 4), 5, np.float32)
        assert ps.accepts_updates("volatile", "alpha") and not ps.accepts_updates("volatile", "beta")
        ps.insert("alpha", "sparse_embedding1", [1, 50], new)
        ps.update("beta", "sparse_embedding1", [1, 50], new)
        np.testing.assert_array_equal(ps.lookup("alpha", "sparse_embedding1", [1, 50]), new)
        # beta's volatile tier ignored the update; its persistent tier took it.
        np.testing.assert_array_equal(ps.lookup("beta", "sparse_embedding1", [1]),
                                      expected([1], 4))
        np.testing.assert_array_equal(ps.lookup("beta", "sparse_embedding1", [50]), new[:1])
        ps.insert("alpha", "sparse_embedding1", [2], new[:1], level="persistent")
        storage = ps.model("alpha").table("sparse_embedding1").storage
        np.testing.assert_array_equal(ps.persistent.lookup(storage, np.array([2]))[0], new[:1])
        assert ps.update_filters("volatile") == ["alpha"]
        ps.apply_update("hps_et.alpha.sparse_embedding1", [3], new[:1] + 1)
        np.testing.assert_array_equal(ps.lookup("alpha", "sparse_embedding1", [3]), new[:1] + 1)


def test_create_parameter_server_from_ps_json_files(tmp_path):
    a = write_model(tmp_path, "a", [(np.arange(10), 4)])
    b = write_model(tmp_path, "b", [(np.arange(10), 2)], seed=3)
    for name, entry in (("a", a), ("b", b)):
        (tmp_path / f"{name}.json").write_text(json.dumps({
            "supportlonglong": True,
            "volatile_db": {"type": "hash_map"},
            "models": [entry],
        }))
    ps = CreateParameterServer([tmp_path / "a.json", tmp_path / "b.json"], ["a", "b"], False)
    with ps:
        assert ps.models() == ["a", "b"]
        assert not ps.config.supportlonglong
        np.testing.assert_array_equal(ps.lookup("b", "sparse_embedding1", np.array([4], np.int32)),
                                      expected([4], 2, seed=3))


def test_stats_count_and_time(tmp_path, caplog):
    model = write_model(tmp_path, "m", [(np.arange(10), 4)])
    with server(tmp_path, [model]) as ps, caplog.at_level(logging.WARNING):
        ps.lookup("m", "sparse_embedding1", np.arange(20))
        snap = ps.tier_stats()["volatile"].snapshot()
        assert (snap["hits"], snap["misses"], snap["errors"]) == (10, 10, 0)
        assert snap["latency"]["lookup"]["count"] == 1
        assert snap["latency"]["load"]["count"] == 1
