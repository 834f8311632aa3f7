import json

import numpy as np
import pytest
from shared_data import CRITEO_SAMPLE, require

from tierserve.clients.cli import main
from tierserve.trainer.data import (
    DataFileError,
    DataReaderParams,
    DataReaderSparseParam,
    create_data_reader,
)
from tierserve.trainer.data.criteo import convert_criteo, load_conversion

SPARSE = [DataReaderSparseParam("data1", 1, True, 26)]


def write_csv(path, rows, header=True, delim=","):
    lines = []
    if header:
        names = ["label"] + [f"I{i}" for i in range(1, 14)] + [f"C{i}" for i in range(1, 27)]
        lines.append(delim.join(names))
    lines += [delim.join(r) for r in rows]
    path.write_text("\n".join(lines) + "\n")


def synthetic_rows(n, seed=0):
    rng = np.random.default_rng(seed)
    rows, cats = [], []
    for i in range(n):
        dense = [str(int(x)) if x >= -2 else "" for x in rng.integers(-3, 50, 13)]
        values = rng.integers(0, 6, 26)  # few distinct values per slot
        cat = [f"{0x1000 * (v + 1) + s:08x}" if v < 5 else "" for s, v in enumerate(values)]
        rows.append([str(i % 2)] + dense + cat)
        cats.append(cat)
    return rows


def read_back(conv, eval=False):
    params = DataReaderParams(
        data_reader_type=conv.format,
        source=conv.train_source,
        eval_source=conv.eval_source or "",
        check_type=conv.check_type,
        slot_size_array=conv.reader_slot_size_array,
    )
    with create_data_reader(params, 1000, 1, 13, SPARSE, i64_input_key=True, eval=eval) as r:
        batches = list(r)
    label = np.concatenate([b.label for b in batches])
    dense = np.concatenate([b.dense for b in batches])
    keys = np.concatenate([b.sparse[0].keys for b in batches]).reshape(-1, 26)
    return label, dense, keys


@pytest.mark.parametrize("fmt", ["Norm", "Parquet"])
def test_hashing_split_and_dense_transform(tmp_path, fmt):
    if fmt == "Parquet":
        pytest.importorskip("pyarrow")
    rows = synthetic_rows(50)
    write_csv(tmp_path / "in.csv", rows)
    conv = convert_criteo(
        tmp_path / "in.csv",
        tmp_path / "out",
        format=fmt,
        train_rows=30,
        hash_buckets=64,
        rows_per_file=7,
    )
    assert (conv.train_rows, conv.eval_rows) == (30, 20)
    assert conv.slot_size_array == [64] * 26
    label, dense, keys = read_back(conv)
    label_e, dense_e, keys_e = read_back(conv, eval=True)
    assert len(label) == 30 and len(label_e) == 20
    table = np.array(rows, dtype=object)
    assert np.array_equal(np.concatenate([label, label_e])[:, 0], table[:, 0].astype(float))
    raw = np.array([[float(x) if x else 0.0 for x in r[1:14]] for r in rows])
    want = np.log1p(np.maximum(raw, 0)).astype(np.float32)
    assert np.allclose(np.concatenate([dense, dense_e]), want)
    offsets = np.arange(26) * 64  # keys are global once read (Norm: in the file; Parquet: reader)
    local = np.concatenate([keys, keys_e]) - offsets
    missing = table[:, 14:] == ""
    assert ((local == 0) == missing).all() and (local < 64).all() and (local >= 0).all()
    # the same value in the same slot always gets the same key
    col = table[:, 14]
    for value in set(col) - {""}:
        assert len(set(local[col == value, 0])) == 1
    info = json.loads((tmp_path / "out" / "slot_size_array.json").read_text())
    assert info["slot_size_array"] == [64] * 26 and info["train_rows"] == 30
    assert load_conversion(tmp_path / "out") == conv


def test_vocabulary_tsv_without_header(tmp_path):
    rows = synthetic_rows(60, seed=1)
    rows[45][14] = "0000abcd"  # only in the eval rows: rare/unseen
    write_csv(tmp_path / "in.tsv", rows, header=False, delim="\t")
    conv = convert_criteo(
        tmp_path / "in.tsv",
        tmp_path / "out",
        train_rows=40,
        min_frequency=2,
        dense_transform="none",
    )
    table = np.array(rows, dtype=object)
    sizes = []
    for s in range(26):
        values, counts = np.unique(table[:40, 14 + s], return_counts=True)
        sizes.append(2 + int(((counts >= 2) & (values != "")).sum()))
    assert conv.slot_size_array == sizes
    _, dense, _ = read_back(conv)
    raw = np.array([[float(x) if x else 0.0 for x in r[1:14]] for r in rows[:40]], np.float32)
    assert np.array_equal(dense, raw)  # "none": negatives kept, missing -> 0
    _, _, keys = read_back(conv, eval=True)
    assert keys[5, 0] == 1  # row 45, slot 0: unseen -> the rare key (offset 0 for slot 0)


def test_cli_and_bad_rows(tmp_path, capsys):
    rows = synthetic_rows(10)
    write_csv(tmp_path / "in.csv", rows)
    out = tmp_path / "cli"
    assert (
        main(
            [
                "convert",
                str(tmp_path / "in.csv"),
                str(out),
                "--train-rows",
                "6",
                "--hash-buckets",
                "100",
                "--quiet",
            ]
        )
        == 0
    )
    assert "wrote 6 train rows" in capsys.readouterr().out
    assert load_conversion(out).eval_rows == 4
    rows[3] = rows[3][:-1]
    write_csv(tmp_path / "bad.csv", rows)
    with pytest.raises(DataFileError, match="record 3: 39 fields, expected 40"):
        convert_criteo(tmp_path / "bad.csv", tmp_path / "bad", hash_buckets=10)
    assert main(["convert", str(tmp_path / "bad.csv"), str(tmp_path / "b2"), "--quiet"]) == 2
    assert "39 fields" in capsys.readouterr().err


def test_real_criteo_sample(tmp_path):
    conv = convert_criteo(
        require(CRITEO_SAMPLE), tmp_path / "out", train_rows=6000, hash_buckets=1 << 15
    )
    assert (conv.train_rows, conv.eval_rows) == (6000, 2000)
    assert conv.slot_size_array == [1 << 15] * 26
    label, dense, keys = read_back(conv)
    assert label.shape == (6000, 1) and dense.shape == (6000, 13) and keys.shape == (6000, 26)
    assert 0.15 < label.mean() < 0.3 and dense.min() >= 0
    vocab = convert_criteo(CRITEO_SAMPLE, tmp_path / "vocab", format="Norm", train_rows=6000)
    assert len(vocab.slot_size_array) == 26 and vocab.slot_size_array[8] < 10  # C9: few values
    label_e, _, keys_e = read_back(vocab, eval=True)
    assert len(label_e) == 2000
    assert (keys_e < sum(vocab.slot_size_array)).all()
