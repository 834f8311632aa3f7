"""Admission of new ids by online updates (``min_update_count``): the count-min sketch against
exact counts, the rule in every tier through ``apply_update``, the settings, and /metrics."""

from __future__ import annotations

import uuid

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ps_helpers import expected, write_model

from tierserve.core.errors import ConfigError
from tierserve.ps import HierarchicalParameterServer
from tierserve.ps.config import parse_ps_config
from tierserve.ps.id_admission import CountMinSketch, UpdateAdmission
from tierserve.ps.table_tag import table_tag
from tierserve.server.runtime.metrics import ServerMetrics

DIM = 4


@settings(max_examples=60, deadline=None)
@given(
    ids=st.lists(st.integers(-(2**63), 2**63 - 1), min_size=1, max_size=40, unique=True),
    repeats=st.lists(st.integers(1, 30), min_size=40, max_size=40),
    width=st.sampled_from([64, 256, 4096]),
)
def test_the_sketch_never_under_counts_and_over_counts_within_its_bound(ids, repeats, width):
    sketch = CountMinSketch(width, depth=4)
    keys = np.array(ids, np.int64)
    exact = np.array(repeats[: keys.size])
    stream = np.repeat(keys, exact)
    np.random.default_rng(0).shuffle(stream)
    for chunk in np.array_split(stream, 5):  # several batches, repeated ids within each
        sketch.add(chunk)
    got = sketch.estimate(keys)
    assert (got >= exact).all()
    # Each row's over-count of an id is the count of the other ids hashed to its column,
    # so the minimum over the rows is at most the total of the other ids' counts; and the
    # sketch holds exactly the stream's length in every row.
    assert (got - exact <= stream.size - exact).all()
    assert (sketch.counters.sum(axis=1) == stream.size).all()


def test_the_sketch_over_counts_rarely_at_its_window():
    # At the halving point (width / 4 ids counted) the bound says P(over-count) <= 4**-4.
    width = 2**14
    rng = np.random.default_rng(1)
    keys = rng.choice(2**62, size=width // 4, replace=False).astype(np.int64)
    sketch = CountMinSketch(width)
    sketch.add(keys)
    over = int(np.count_nonzero(sketch.estimate(keys) > 1))
    assert over <= keys.size * 4**-4 * 3, over  # 3x the bound's mean: a generous margin
    fresh = rng.choice(2**62, size=1000, replace=False).astype(np.int64) | (1 << 62)
    assert int(np.count_nonzero(sketch.estimate(fresh))) <= 1000 * 4**-4 * 3


def test_the_sketch_halves_and_its_width_is_a_power_of_two():
    sketch = CountMinSketch(100)
    assert sketch.width == 128
    sketch.add(np.array([7, 7, 7, 7, 7], np.int64))
    sketch.halve()
    assert sketch.estimate(np.array([7]))[0] == 2
    rule = UpdateAdmission(3, width=64)  # halves after 16 held-back updates
    keys = np.arange(16, dtype=np.int64)
    rule.record(keys, np.ones(16, bool))
    assert rule.sketch.counted == 8 and rule.sketch.estimate(keys).max() <= 1


def test_admit_counts_the_updates_within_a_batch():
    rule = UpdateAdmission(3)
    keys = np.array([5, 5, 6, 7, 7, 7], np.int64)
    stored = np.array([False, False, False, True, True, True])
    admit = rule.admit(keys, stored)
    assert admit.tolist() == [False, False, False, True, True, True]
    rule.record(keys, ~admit)
    # 5 has 2 so far: one more admits it; 6 has 1: one more is not enough
    admit = rule.admit(np.array([5, 6], np.int64), np.zeros(2, bool))
    assert admit.tolist() == [True, False]


def _server(tmp_path, name, model_extra=None, volatile=None, persistent=None):
    model = write_model(tmp_path / name, name, [(np.arange(100), DIM)])
    model.update(model_extra or {})
    return HierarchicalParameterServer(parse_ps_config({
        "volatile_db": volatile or {"type": "hash_map"},
        "persistent_db": persistent or {"type": "disabled"},
        "models": [model],
    }))  # fmt: skip


def test_a_new_id_is_stored_only_after_min_update_count_updates(tmp_path, tiers):
    # every tier kind, alone (rocks_db behind no volatile tier)
    cfg = tiers.config()
    db = {"type": cfg.type.value, **cfg.model_dump(mode="json", exclude_unset=True)}
    volatile, persistent = (db, None) if tiers.volatile else ({"type": "disabled"}, db)
    name = f"adm{uuid.uuid4().hex[:8]}"  # unique on the shared Redis servers
    tag = table_tag(name, "sparse_embedding1")
    with _server(tmp_path, name, {"min_update_count": 3}, volatile, persistent) as ps:
        new = np.full((2, DIM), 2.5, np.float32)
        try:
            _admits_on_the_third_update(ps, name, tag, new)
        finally:
            ps.unload_model(name)


def _admits_on_the_third_update(ps, name, tag, new):
    ps.apply_update(tag, [7, 500], new)  # 7 is stored: applies at once; 500 is new
    got = ps.lookup(name, "sparse_embedding1", [7, 500])
    np.testing.assert_array_equal(got[0], new[0])
    np.testing.assert_array_equal(got[1], np.full(DIM, -1.0))  # the table's default
    ps.apply_update(tag, [500], new[:1] + 1)
    np.testing.assert_array_equal(ps.lookup(name, "sparse_embedding1", [500])[0], -1.0)
    (tier,) = ps.tiers.values()
    assert not tier.lookup(tag, np.array([500]))[1].any()
    ps.apply_update(tag, [500], new[:1] + 2)  # the third: admitted
    np.testing.assert_array_equal(ps.lookup(name, "sparse_embedding1", [500]), new[:1] + 2)
    assert tier.lookup(tag, np.array([500]))[1].all()
    assert tier.stats.admitted == 1 and tier.stats.held_back == 2
    ps.apply_update(tag, [500], new[:1] + 3)  # stored now: applies at once
    np.testing.assert_array_equal(ps.lookup(name, "sparse_embedding1", [500]), new[:1] + 3)
    np.testing.assert_array_equal(ps.lookup(name, "sparse_embedding1", [8]), expected([8], DIM))


def test_an_id_stored_in_either_tier_is_not_new(tmp_path):
    # hash map in front of RocksDB: an id only RocksDB holds (not cached) updates at once
    rdb = {"type": "rocks_db", "path": str(tmp_path / "rdb")}
    with _server(tmp_path, "both", {"min_update_count": 2}, {"type": "hash_map"}, rdb) as ps:
        tag = table_tag("both", "sparse_embedding1")
        ps.tiers["volatile"].evict(tag, np.array([3]))
        ps.apply_update(tag, [3, 600], np.ones((2, DIM)))
        np.testing.assert_array_equal(ps.lookup("both", "sparse_embedding1", [3, 600]),
                                      [[1.0] * DIM, [-1.0] * DIM])  # fmt: skip
        ps.apply_update(tag, [600], np.full((1, DIM), 2.0))
        for tier in ps.tiers.values():
            np.testing.assert_array_equal(tier.lookup(tag, np.array([600]))[0], 2.0)
            assert (tier.stats.admitted, tier.stats.held_back) == (1, 1)


def test_without_min_update_count_new_ids_apply_at_once(tmp_path):
    with _server(tmp_path, "plain") as ps:
        ps.apply_update(table_tag("plain", "sparse_embedding1"), [999], np.ones((1, DIM)))
        np.testing.assert_array_equal(ps.lookup("plain", "sparse_embedding1", [999]), 1.0)
        assert ps.tiers["volatile"].stats.held_back == 0


def test_admission_counters_reach_metrics(tmp_path):
    with _server(tmp_path, "met", {"min_update_count": 2}) as ps:
        tag = table_tag("met", "sparse_embedding1")
        ps.apply_update(tag, [1000, 1001], np.ones((2, DIM)))
        ps.apply_update(tag, [1000], np.ones((1, DIM)))
        metrics = ServerMetrics()
        metrics.add_tier_source(
            lambda: {level: st.snapshot() for level, st in ps.tier_stats().items()}
        )
        text = metrics.render().decode()
        assert 'tierserve_tier_admitted_total{tier="volatile:hash_map"} 1.0' in text
        assert 'tierserve_tier_held_back_total{tier="volatile:hash_map"} 2.0' in text


@pytest.mark.parametrize(
    "value",
    [0, -2, 1.5, "3", True, [2, 0], [2, 2]],
)
def test_a_bad_min_update_count_is_refused_naming_it(tmp_path, value):
    model = write_model(tmp_path, "bad", [(np.arange(4), DIM)])
    model["min_update_count"] = value
    with pytest.raises(ConfigError, match="min_update_count") as err:
        parse_ps_config({"models": [model]})
    assert "unknown field" not in str(err.value)  # refused for its value, not its name


@pytest.mark.parametrize("value", [0, 63, 2**31, "big"])
def test_a_bad_sketch_width_is_refused_naming_it(tmp_path, value):
    model = write_model(tmp_path, "bad", [(np.arange(4), DIM)])
    model["admission_sketch_width"] = value
    with pytest.raises(ConfigError, match="admission_sketch_width") as err:
        parse_ps_config({"models": [model]})
    assert "unknown field" not in str(err.value)


def test_min_update_count_per_table(tmp_path):
    model = write_model(tmp_path, "two", [(np.arange(4), DIM), (np.arange(4), DIM)])
    model["min_update_count"] = [1, 4]
    config = parse_ps_config({"models": [model]})
    assert config.models[0].min_update_count == [1, 4]
    assert parse_ps_config({"models": [{**model, "min_update_count": 2}]}).models[
        0
    ].min_update_count == [2, 2]
