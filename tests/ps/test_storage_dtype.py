"""Compact rows (``storage_dtype``) in every tier and through the parameter server.

The tier contract over storage_dtype: each tier holds a compact table's stored rows (4-byte
words that are not float32 values: int8 bytes and float16 pairs read as floats are NaNs,
infinities and subnormals of every kind) and must give back their exact bits.  Then the
parameter server on each tier: loaded rows, lookups, online updates (the path Kafka updates
take), refusals, attaching and converted sparse folders.
"""

from __future__ import annotations

import uuid

import numpy as np
import pytest
from ps_helpers import expected, write_model

from tierserve.core.errors import ConfigError, CorruptModelFileError, InvalidInputError
from tierserve.ps import HierarchicalParameterServer
from tierserve.ps.config import parse_ps_config
from tierserve.ps.row_codec import RowCodec
from tierserve.ps.sparse_file import convert_sparse_model, read_rows, read_sparse_model

DIM = 8
COMPACT = ["float16", "int8"]
DTYPES = ["float32", *COMPACT]


def _awkward_words(n: int, words: int, rng) -> np.ndarray:
    """Rows of words whose bits are NaNs (quiet, signalling, with payloads), infinities,
    subnormals, zeros of both signs, and random patterns."""
    special = np.array([0x7FC00000, 0x7F800001, 0xFFBFFFFF, 0x7F800000, 0xFF800000, 0x00000001,
                        0x807FFFFF, 0x80000000, 0x00000000, 0x7FFFFFFF], np.uint32)  # fmt: skip
    bits = rng.integers(0, 2**32, size=(n, words), dtype=np.uint64).astype(np.uint32)
    bits.reshape(-1)[: special.size * 7 : 7] = special[: min(special.size, (bits.size + 6) // 7)]
    return bits.view(np.float32)


@pytest.mark.parametrize("dtype", DTYPES)
def test_tiers_keep_stored_rows_bit_exact(tiers, dtype):
    codec = RowCodec(dtype, DIM)
    tier = tiers()
    tag = tiers.tag(tier, dim=codec.words)
    rng = np.random.default_rng(11)
    keys = rng.choice(2**40, size=400, replace=False).astype(np.int64)
    raw = _awkward_words(200, codec.words, rng)
    emb = rng.standard_normal((200, DIM)).astype(np.float32)
    stored = np.concatenate([raw, codec.encode(emb)])
    tier.insert(tag, keys, stored)
    got, found = tier.lookup(tag, keys[::-1])
    assert found.all() and got.shape == (400, codec.words)
    np.testing.assert_array_equal(got.view(np.uint32), stored[::-1].view(np.uint32))
    decoded = codec.decode(got[:200][::-1])  # the encoded half, back in insert order
    np.testing.assert_allclose(decoded, emb, atol=_tolerance(dtype, emb))
    # overwrite, then (shared tiers) reopen: the bits stay
    newer = codec.encode(emb[:50] * 2)
    tier.insert(tag, keys[200:250], newer)
    if tiers.shared:
        tier.close()
        tier = tiers()
        tier.create_table(tag, codec.words)
        tiers._tags.append((tier, tag))
    got, found = tier.lookup(tag, keys[200:250])
    assert found.all()
    np.testing.assert_array_equal(got.view(np.uint32), newer.view(np.uint32))


def _tolerance(dtype: str, emb: np.ndarray) -> float:
    peak = float(np.abs(emb).max())
    return {"float32": 0.0, "float16": peak * 2.0**-11, "int8": 2 * peak / 255 / 2 * 1.001}[dtype]


# --- the parameter server on each tier --------------------------------------------------------


def _server(tmp_path, tiers, models):
    """A parameter server whose one tier is of ``tiers``' kind."""
    cfg = tiers.config()
    this = {**cfg.model_dump(mode="json", exclude_unset=True), "type": cfg.type.value}
    volatile_db, persistent_db = {"type": "disabled"}, {"type": "disabled"}
    if tiers.kind == "rocks_db":
        persistent_db = this
    else:
        volatile_db = this
    config = parse_ps_config({"models": models, "volatile_db": volatile_db,
                              "persistent_db": persistent_db})  # fmt: skip
    ps = HierarchicalParameterServer(config)
    tiers._made.append(ps)
    return ps


def _model(tmp_path, dtype, name=None):
    name = name or f"m{uuid.uuid4().hex[:10]}"  # the Redis servers are shared
    keys = np.arange(300)
    model = write_model(tmp_path, name, [(keys, DIM), (keys, 3)])
    model["storage_dtype"] = [dtype, "float32"]
    return model


@pytest.mark.parametrize("dtype", COMPACT)
def test_served_lookups_and_updates_are_the_stored_rows(tmp_path, tiers, dtype):
    codec = RowCodec(dtype, DIM)
    model = _model(tmp_path, dtype)
    ps = _server(tmp_path, tiers, [model])
    name = model["model"]
    keys = np.array([5, 299, 0, 1000])
    got = ps.lookup(name, "sparse_embedding1", keys)
    want = codec.decode(codec.encode(expected(keys[:3], DIM)))
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got[:3], want)
    np.testing.assert_array_equal(got[3], [-1] * DIM)  # the default, not quantized
    assert np.abs(want - expected(keys[:3], DIM)).max() > 0  # it really is compact
    # the other table stays float32, exact
    np.testing.assert_array_equal(ps.lookup(name, "sparse_embedding2", [7]), expected([7], 3, 1))
    # stored compact in the tier: words per row
    storage = ps.model(name).table("sparse_embedding1").storage
    tier = ps.volatile or ps.persistent
    assert tier.dim(storage) == codec.words
    # an online update (Kafka's path: apply_update) is quantized on apply; listeners hear
    # the stored values
    heard = []
    ps.add_update_listener(lambda m, t, k, e: heard.append(e))
    update = np.random.default_rng(3).standard_normal((2, DIM)).astype(np.float32) * 4
    ps.apply_update(f"hps_et.{name}.sparse_embedding1", [5, 777], update)
    stored = codec.decode(codec.encode(update))
    np.testing.assert_array_equal(ps.lookup(name, "sparse_embedding1", [5, 777]), stored)
    np.testing.assert_array_equal(heard[-1], stored)


@pytest.mark.parametrize("dtype", COMPACT)
def test_a_value_the_layout_cannot_hold_is_refused_and_nothing_is_written(tmp_path, tiers, dtype):
    model = _model(tmp_path, dtype)
    ps = _server(tmp_path, tiers, [model])
    name = model["model"]
    before = ps.lookup(name, "sparse_embedding1", [1, 2])
    bad = np.ones((2, DIM), np.float32)
    bad[1, 3] = np.nan
    with pytest.raises(InvalidInputError, match=f"row 1 holds nan at column 3; storage_dtype {dtype}"):
        ps.apply_update(f"hps_et.{name}.sparse_embedding1", [1, 2], bad)
    np.testing.assert_array_equal(ps.lookup(name, "sparse_embedding1", [1, 2]), before)


def test_attaching_to_a_table_stored_in_another_layout_is_refused(tmp_path):
    rocks = {"type": "rocks_db", "path": str(tmp_path / "rocksdb")}
    model = _model(tmp_path, "int8", name="m")
    with HierarchicalParameterServer(parse_ps_config(
        {"models": [model], "volatile_db": {"type": "hash_map"}, "persistent_db": rocks}
    )) as ps:  # fmt: skip
        want = ps.lookup("m", "sparse_embedding1", [4])
    attach = {"type": "hash_map", "initialize_after_startup": False}
    with HierarchicalParameterServer(parse_ps_config(
        {"models": [model], "volatile_db": attach, "persistent_db": rocks}
    )) as ps:  # fmt: skip
        np.testing.assert_array_equal(ps.lookup("m", "sparse_embedding1", [4]), want)
    model["storage_dtype"] = ["float16", "float32"]
    with pytest.raises(ConfigError, match="stores hps_et.m.sparse_embedding1 as int8, but "
                       "ps.json gives storage_dtype float16"):  # fmt: skip
        HierarchicalParameterServer(parse_ps_config(
            {"models": [model], "volatile_db": attach, "persistent_db": rocks}
        ))  # fmt: skip


# --- sparse folders converted ahead of time ---------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_converted_folder_loads_the_rows_it_holds(tmp_path, dtype):
    model = _model(tmp_path, dtype, name="m")
    src = model["sparse_files"][0]
    dst = tmp_path / "converted" / "m0_sparse_0.model"
    convert_sparse_model(src, dst, dtype)
    codec = RowCodec(dtype, DIM)
    keys, words = read_rows(dst, codec)
    k0, w0 = read_rows(src, codec)  # converted at load
    np.testing.assert_array_equal(keys, k0)
    np.testing.assert_array_equal(words.view(np.uint32), np.asarray(w0).view(np.uint32))
    if dtype != "float32":
        assert sorted(p.name for p in dst.iterdir()) == ["emb_vector." + dtype, "key"]
        # a folder converted for another layout only is refused, naming both
        other = RowCodec("float16" if dtype == "int8" else "int8", DIM)
        with pytest.raises(CorruptModelFileError, match=f"holds emb_vector.{dtype} but the table's "
                           f"storage_dtype is {other.dtype.value}"):  # fmt: skip
            read_rows(dst, other)
    model["sparse_files"][0] = str(dst)
    with HierarchicalParameterServer(parse_ps_config({"models": [model]})) as ps:
        got = ps.lookup("m", "sparse_embedding1", [3, 17])
    np.testing.assert_array_equal(got, codec.decode(codec.encode(expected([3, 17], DIM))))


def test_a_converted_folder_of_the_wrong_size_is_refused(tmp_path):
    model = _model(tmp_path, "int8", name="m")
    dst = tmp_path / "c.model"
    convert_sparse_model(model["sparse_files"][0], dst, "int8")
    with open(dst / "emb_vector.int8", "ab") as f:
        f.write(b"\0" * 4)
    with pytest.raises(CorruptModelFileError, match=r"not a multiple of the 16-byte int8 row"):
        read_rows(dst, RowCodec("int8", DIM))
    assert read_sparse_model(model["sparse_files"][0]).dim == DIM  # the source is untouched
