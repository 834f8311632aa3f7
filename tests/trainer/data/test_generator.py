from pathlib import Path

import numpy as np
import pytest

from tierserve.trainer.data import (
    DataGenerator,
    DataGeneratorParams,
    Distribution_t,
    PowerLaw_t,
    auc_score,
    read_file_list,
)
from tierserve.trainer.data.norm import read_norm_header


def params(tmp_path, **kw):
    base = dict(
        format="Norm",
        label_dim=1,
        dense_dim=4,
        num_slot=5,
        i64_input_key=False,
        source=str(tmp_path / "file_list.txt"),
        eval_source=str(tmp_path / "file_list_test.txt"),
        slot_size_array=[100, 2000, 30, 5000, 10],
        num_files=2,
        eval_num_files=1,
        num_samples_per_file=4000,
    )
    base.update(kw)
    return DataGeneratorParams(**base)


def test_auc_score_matches_pair_counting():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, 300)
    scores = rng.integers(0, 20, 300).astype(float)  # many ties
    pos, neg = scores[labels == 1], scores[labels == 0]
    pairs = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
    assert auc_score(labels, scores) == pytest.approx(pairs / (len(pos) * len(neg)))
    assert np.isnan(auc_score(np.ones(3), np.arange(3)))


def test_norm_layout_and_determinism(tmp_path, monkeypatch):
    dataset = DataGenerator(params(tmp_path / "a")).generate()
    files = read_file_list(dataset.train.source)
    assert files == [str(tmp_path / "a" / "train" / f"gen_{i}.data") for i in range(2)]
    # HugeCTR's generator lists the paths it formed from source, as given
    assert (tmp_path / "a" / "file_list.txt").read_text().splitlines() == [
        "2", *files]
    monkeypatch.chdir(tmp_path)
    DataGenerator(params(tmp_path, source="./rel/file_list.txt",
                         eval_source="./rel/file_list_test.txt")).generate()
    assert (tmp_path / "rel" / "file_list.txt").read_text().splitlines() == [
        "2", "./rel/train/gen_0.data", "./rel/train/gen_1.data"]
    monkeypatch.chdir(tmp_path / "a")  # found from elsewhere too: in the list's parent folder
    assert read_file_list(tmp_path / "rel" / "file_list.txt") == [
        str(tmp_path / "./rel/train" / f"gen_{i}.data") for i in range(2)]
    assert read_file_list(dataset.eval.source) == [str(tmp_path / "a" / "val" / "gen_0.data")]
    header = read_norm_header(files[0])
    assert header["number_of_records"] == 4000 and header["slot_num"] == 5
    assert header["error_check"] == 1
    assert dataset.train.num_samples == 8000 and dataset.eval.num_samples == 4000
    assert dataset.reader_slot_size_array == []
    again = DataGenerator(params(tmp_path / "b")).generate()
    other = DataGenerator(params(tmp_path / "c", seed=1)).generate()
    for x, y, z in zip(
        files, read_file_list(again.train.source), read_file_list(other.train.source)
    ):
        x, y, z = (Path(f).read_bytes() for f in (x, y, z))
        assert x == y != z


def test_planted_labels_depend_on_the_features(tmp_path):
    generator = DataGenerator(params(tmp_path))
    dataset = generator.generate()
    # the true click probabilities rank the sampled labels well (Bayes-optimal AUC)
    assert dataset.train.bayes_auc >= 0.8 and dataset.eval.bayes_auc >= 0.8
    assert 0.2 < dataset.train.positive_rate < 0.6
    # and the signal is learnable from what the files hold: per-key click rates and a
    # least-squares fit on the dense features, both fitted on train, rank eval samples
    train = generator.expected_records("train", 0)
    evals = generator.expected_records("eval", 0)
    y = train.label[:, 0]
    size = sum(generator.params.slot_size_array)
    clicks = np.bincount(train.keys, np.repeat(y, 5), size)
    shows = np.bincount(train.keys, minlength=size)
    rate = (clicks + y.mean() * 5) / (shows + 5)
    key_logit = np.log(rate / (1 - rate))[evals.keys].reshape(-1, 5).sum(axis=1)
    dense = np.hstack([train.dense, np.ones((len(y), 1))])
    w = np.linalg.lstsq(dense, y, rcond=None)[0]
    dense_score = np.hstack([evals.dense, np.ones((len(evals), 1))]) @ w
    assert auc_score(evals.label[:, 0], key_logit) > 0.62
    assert auc_score(evals.label[:, 0], dense_score) > 0.62
    combined = key_logit / key_logit.std() + dense_score / dense_score.std()
    assert auc_score(evals.label[:, 0], combined) > 0.7


def test_key_distributions(tmp_path):
    def slot_keys(**kw):
        g = DataGenerator(params(tmp_path, slot_size_array=[10000] * 5, **kw))
        return g.samples("train", 0, 20000)[0].keys

    uniform = slot_keys(dist_type=Distribution_t.Uniform)
    short = slot_keys(power_law_type=PowerLaw_t.Short)
    long = slot_keys(power_law_type=PowerLaw_t.Long)
    for keys in (uniform, short, long):
        assert keys.min() >= 0 and keys.max() < 10000
    top = [(k < 100).mean() for k in (uniform, long, short)]  # share of the 1% lowest keys
    assert top[0] < 0.02 < top[1] < top[2]


def test_multi_hot_and_multi_label(tmp_path):
    g = DataGenerator(
        params(tmp_path, label_dim=2, dense_dim=0, nnz_array=[1, 4, 2, 1, 3], variable_nnz=True)
    )
    records, counts, logits = g.samples("train", 0, 500)
    c = records.counts()
    assert c.min() >= 1 and (c.max(axis=0) == [1, 4, 2, 1, 3]).all()
    assert records.label.shape == (500, 2) and logits.shape == (500, 2)
    assert records.dense.shape == (500, 0) and counts.shape == (500, 0)
    fixed = DataGenerator(params(tmp_path, nnz_array=[1, 4, 2, 1, 3])).samples("train", 0, 10)[0]
    assert (fixed.counts() == [1, 4, 2, 1, 3]).all()


def test_parquet_and_raw_layout(tmp_path):
    pytest.importorskip("pyarrow")
    import json

    import pyarrow.parquet as pq

    # HugeCTR's layout: both lists in one folder, data and _metadata.json in train/ and val/
    p = params(
        tmp_path,
        format="Parquet",
        source=str(tmp_path / "pq" / "file_list.txt"),
        eval_source=str(tmp_path / "pq" / "file_list_test.txt"),
        nnz_array=[1, 3, 1, 1, 2],
    )
    generator = DataGenerator(p)
    dataset = generator.generate()
    assert dataset.reader_slot_size_array == p.slot_size_array
    for split, folder, n in (("train", "train", 2), ("eval", "val", 1)):
        listed = (tmp_path / "pq" / ("file_list.txt" if split == "train" else
                                     "file_list_test.txt")).read_text().split()
        assert int(listed[0]) == n and len(listed) == n + 1
        files = read_file_list(getattr(dataset, split).source)
        assert files == [str(tmp_path / "pq" / folder / f"gen_{i}.parquet") for i in range(n)]
        # read as HugeCTR does: _metadata.json beside the first data file, columns by index
        meta = json.loads((tmp_path / "pq" / folder / "_metadata.json").read_text())
        assert [e["num_rows"] for e in meta["file_stats"]] == [4000] * n
        for i, path in enumerate(files):
            table = pq.read_table(path)
            cols = [table.column(e["index"]).to_pylist()
                    for role in ("labels", "conts", "cats") for e in meta[role]]
            want = generator.expected_records(split, i)
            assert np.array_equal(np.array(cols[0], np.float32), want.label[:, 0])
            assert np.array_equal(np.array(cols[1:5], np.float32).T, want.dense)
            local = want.keys - np.repeat(
                np.tile(generator._offsets, len(want)), want.counts().ravel())
            flat = [k for row in zip(*cols[5:]) for v in row
                    for k in (v if isinstance(v, list) else [v])]
            assert flat == local.tolist()
            types = {str(table.schema.field(e["index"]).type) for e in meta["cats"]}
            assert types == {"uint32", "list<element: uint32>"}, types
    raw = params(
        tmp_path,
        format="Raw",
        source=str(tmp_path / "raw" / "train.bin"),
        eval_source=str(tmp_path / "raw" / "test.bin"),
        num_samples=70000,
        eval_num_samples=10,
        float_label_dense=True,
    )
    dataset = DataGenerator(raw).generate()
    assert (tmp_path / "raw" / "train.bin").stat().st_size == 70000 * 4 * (1 + 4 + 5)
    assert dataset.train.num_samples == 70000 and dataset.eval.num_samples == 10
