"""TensorFlow's feature hashing (``trainer/feature_column/hashing.py``) against values computed
by TensorFlow 2.15 itself.

The vectors below were printed by this script under ``tensorflow-cpu==2.15.1``
(``~/.cache/tierserve/tf215-venv``, see ``bench/estimator/tf_peer.py --install``)::

    import tensorflow as tf, numpy as np
    fc = tf.feature_column
    # Fingerprint64: tf.fingerprint's 8 bytes, little-endian
    [int.from_bytes(bytes(r), "little")
     for r in tf.fingerprint(tf.constant(STRINGS), method="farmhash64").numpy()]
    # integers: tf.strings.to_hash_bucket_fast(tf.strings.as_string(INTS), 1000003)
    # columns: the ids of each row, read back from
    #   tf.keras.layers.DenseFeatures([fc.indicator_column(column)])(FEATURES)
    # with FEATURES = {"a": A[:, None], "b": B[:, None], "n": N[:, None]} (dense tensors)

TensorFlow's own sources name the functions: ``tensorflow/core/kernels/string_to_hash_bucket_op``
(``Fingerprint64(s) % num_buckets``), ``tensorflow/core/kernels/sparse_cross_op.cc``
(``HashCrosser``: ``FingerprintCat64`` from ``hash_key``),
``tensorflow/python/ops/sparse_ops.py`` (``_DEFAULT_HASH_KEY = 0xDECAFCAFFE``) and
``tensorflow/python/ops/lookup_ops.py`` (``IdTableWithHashBuckets``: integer keys go through
``as_string`` before ``to_hash_bucket_fast``).
"""

from __future__ import annotations

import numpy as np
import pytest

from tierserve.core.errors import ConfigError, InvalidInputError
from tierserve.trainer import feature_column as fc
from tierserve.trainer.feature_column.hashing import (
    DEFAULT_HASH_KEY,
    fingerprint64,
    fingerprint_cat64,
)

#: (string, TensorFlow's Fingerprint64) -- lengths 0..129 cover every branch of FarmHash's
#: Hash64 (0, 1-3, 4-7, 8-16, 17-32, 33-64 bytes and the 64-byte loop, once and twice) and
#: multi-byte UTF-8.
FINGERPRINTS = [
    ("", 11160318154034397263),
    ("a", 12917804110809363939),
    ("ab", 12289600257749001502),
    ("abc", 2640714258260161385),
    ("abcd", 1897425971756105985),
    ("hello", 13009744463427800296),
    ("68fd1e64", 7920289447977470598),
    ("80e26c9b", 11379605520594866572),
    ("fb936136", 8874981813069878764),
    ("7b4723c4", 14276329464931770333),
    ("25c83c98", 7761033983362701688),
    ("7e0ccccf", 17246863631068268082),
    ("de7995b8", 13576119306600334933),
    ("1f89b562", 5512364859905845726),
    ("a73ee510", 338211911509601372),
    ("0123456789abcdef", 6105018409752412263),
    ("0123456789abcdefg", 12024047538191061578),
    ("a" * 31, 17509042933260905194),
    ("b" * 32, 18393449188595247930),
    ("c" * 33, 10994328715251001597),
    ("x" * 63, 3985643400710983581),
    ("y" * 64, 4471793200125962424),
    ("z" * 65, 8299915583762718517),
    ("The quick brown fox jumps over the lazy dog" * 3, 7943048688984171807),
    ("naïve café", 10985537734658424218),
    ("日本語テキスト", 1653575045406466613),
    ("emoji 😀", 14221504416002359556),
]

INTS = [0, 1, -1, 7, 10, 123456789, -987654321, 2**62, -2**63, 2**63 - 1]
INT_BUCKETS_1000003 = [537292, 361198, 285648, 929154, 340076, 924877, 15771, 35490, 400334,
                       121738]

A = ["68fd1e64", "80e26c9b", "fb936136", "", "7b4723c4"]
B = ["de7995b8", "1f89b562", "", "a73ee510", "25c83c98"]
N = [3, 0, -7, 12, 2**40]
FEATURES = {"a": np.array(A)[:, None], "b": np.array(B)[:, None],
            "n": np.array(N, np.int64)[:, None]}


def _vocab_a():
    return fc.categorical_column_with_vocabulary_list("a", ["fb936136", "68fd1e64"])


def _bucketized_n():
    return fc.bucketized_column(fc.numeric_column("n"), [0.0, 5.0, 100.0])


#: column -> TensorFlow's ids per row.
COLUMN_IDS = [
    (lambda: fc.crossed_column(["a", "b"], 1000), [[97], [361], [528], [38], [823]]),
    (lambda: fc.crossed_column(["a", "n"], 997), [[290], [60], [233], [59], [183]]),
    (lambda: fc.crossed_column(["a", "b"], 1000, hash_key=42),
     [[396], [73], [397], [17], [931]]),
    (lambda: fc.crossed_column([_bucketized_n(), "a"], 101), [[56], [14], [2], [65], [61]]),
    # "80e26c9b" is out of vocabulary (id -1): crossed all the same; "" has no id: no cross
    (lambda: fc.crossed_column([_vocab_a(), "b"], 77), [[46], [40], [0], [], [34]]),
    (lambda: fc.categorical_column_with_hash_bucket("a", 50), [[48], [22], [14], [], [33]]),
    (lambda: fc.categorical_column_with_hash_bucket("n", 13, dtype="int64"),
     [[6], [3], [1], [1], [12]]),
    (lambda: fc.categorical_column_with_vocabulary_list(
        "a", ["68fd1e64", "fb936136"], num_oov_buckets=5), [[0], [4], [1], [], [5]]),
    (lambda: fc.categorical_column_with_vocabulary_list("n", [3, 12], num_oov_buckets=4),
     [[0], [5], [4], [1], [4]]),
]

#: Two values per example in both inputs: every pair is crossed (TensorFlow's ids).
A2 = [["68fd1e64", "80e26c9b"], ["fb936136", "7b4723c4"], ["", "25c83c98"]]
B2 = [["de7995b8", "1f89b562"], ["a73ee510", "x"], ["y", "z"]]
CROSS_A2_B2_1000 = [[97, 101, 361, 586], [268, 459, 763, 957], [339, 554, 787, 794]]
CROSS_VOCAB_A2_B2_1000 = [[587, 664, 694, 933], [43, 331, 561, 932], [808, 963]]


def _rows(ids) -> list[list[int]]:
    values, offsets = ids.csr()
    return [sorted(values[offsets[i]:offsets[i + 1]].tolist()) for i in range(ids.batch_size)]


def test_fingerprint64_equals_tensorflow_for_str_bytes_and_object_arrays():
    strings = [s for s, _ in FINGERPRINTS]
    expected = np.array([f for _, f in FINGERPRINTS], np.uint64)
    np.testing.assert_array_equal(fingerprint64(np.array(strings)), expected)
    np.testing.assert_array_equal(fingerprint64(np.array([s.encode() for s in strings])),
                                  expected)
    np.testing.assert_array_equal(fingerprint64(np.array(strings, dtype=object)), expected)
    np.testing.assert_array_equal(fc.fingerprint(np.array(strings)), expected)


def test_integers_hash_as_their_decimal_strings():
    got = fingerprint64(np.array(INTS, np.int64)) % np.uint64(1000003)
    assert got.astype(np.int64).tolist() == INT_BUCKETS_1000003
    np.testing.assert_array_equal(fingerprint64(np.array([7, -1], np.int32)),
                                  fingerprint64(np.array(["7", "-1"])))
    np.testing.assert_array_equal(fingerprint64(np.array([3.0, -2.0])),
                                  fingerprint64(np.array(["3", "-2"])))
    with pytest.raises(InvalidInputError, match="non-integral"):
        fingerprint64(np.array([0.5]))


def test_fingerprint_cat64_chain_equals_tensorflows_cross():
    """FingerprintCat64 chained by hand from the hash key gives TensorFlow's crossed ids."""
    fa = fingerprint64(np.array(A))
    fb = fingerprint64(np.array(B))
    h = fingerprint_cat64(fingerprint_cat64(np.uint64(DEFAULT_HASH_KEY), fa), fb)
    assert (h % np.uint64(1000)).astype(np.int64).tolist() == [97, 361, 528, 38, 823]


@pytest.mark.parametrize("make, expected", COLUMN_IDS)
def test_column_ids_equal_tensorflows(make, expected):
    assert _rows(make().ids(FEATURES)) == expected


def test_multivalent_crosses_take_every_combination():
    feats = {"a": np.array(A2), "b": np.array(B2)}
    assert _rows(fc.crossed_column(["a", "b"], 1000).ids(feats)) == CROSS_A2_B2_1000
    crossed = fc.crossed_column([_vocab_a(), "b"], 1000)
    assert _rows(crossed.ids(feats)) == CROSS_VOCAB_A2_B2_1000
    nested = fc.crossed_column([fc.crossed_column(["a", "b"], 10), "n"], 1000)
    flat = fc.crossed_column(["a", "b", "n"], 1000)
    assert _rows(nested.ids(FEATURES)) == _rows(flat.ids(FEATURES))  # TF flattens nesting


def test_ragged_inputs_cross_only_present_values():
    feats = {"a": [["68fd1e64"], []], "b": [["de7995b8", "x"], ["y"]]}
    ids = fc.crossed_column(["a", "b"], 1000).ids(feats)
    assert ids.counts().tolist() == [2, 0]


def test_crossing_refuses_what_tensorflow_refuses():
    with pytest.raises(ConfigError, match="hash_bucket 'a' is not supported for crossing"):
        fc.crossed_column([fc.categorical_column_with_hash_bucket("a", 5), "b"], 10)
    weighted = fc.weighted_categorical_column(_vocab_a(), "w")
    with pytest.raises(ConfigError, match="does not support weighted columns"):
        fc.crossed_column([weighted, "b"], 10)
    with pytest.raises(InvalidInputError, match="crossed_column 'a_X_x': feature 'x': .*"
                                                "non-integral"):
        fc.crossed_column(["a", "x"], 10).ids({"a": np.array(["u"]), "x": np.array([0.5])})


def test_crossed_column_names_are_tensorflows():
    """``feature_column_v2.CrossedColumn.name``: the names of the leaf keys (nested crosses
    flattened, ``_collect_leaf_level_keys``), sorted, joined by ``_X_``; TensorFlow 2.15
    prints ``a_X_n_bucketized`` and ``a_X_aa_X_b_X_c`` for these two.  The name is the
    variable's (``linear/linear_model/<name>/weights``), so a TensorFlow checkpoint's crossed
    weights are found under it."""
    assert fc.crossed_column([_bucketized_n(), "a"], 10).name == "a_X_n_bucketized"
    vocab = fc.categorical_column_with_vocabulary_list("aa", ["x"])
    nested = fc.crossed_column([fc.crossed_column(["b", "a"], 10), "c", vocab], 10)
    assert nested.name == "a_X_aa_X_b_X_c"
