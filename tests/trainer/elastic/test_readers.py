"""DLRover's readers and conf data sets: the document's FakeReader (import changed), the
non-elastic Reader, FileReader, and the input_fn built from a data set."""

# ruff: noqa: B007, UP028, UP032 - the document's code is kept as the document has it

import numpy as np
import pytest

from tierserve.core.errors import ConfigError, InvalidInputError
from tierserve.trainer.elastic import (
    Column,
    ElasticReader,
    FileReader,
    ShardDispatcher,
    build_input_fn,
)


# -- the document's code, with the import changed ------------------------------------------
# fmt: off
class FakeReader(ElasticReader):
    def __init__(self, path=None):
        self.count = 1
        super().__init__(path=path)

    def count_data(self):
        self._data_nums = 10

    def read_data_by_index_range(self, start_index, end_index):
        data = []
        for i in range(start_index, end_index):
            x = np.random.randint(1, 1000)
            y = 2 * x + np.random.randint(1, 5)
            d = "{},{}".format(x, y)
            data.append(d)
        return data


class Reader:
    def __init__(
        self,
        path=None,
        batch_size=None
    ):
        pass

    def get_data(self):
        # you custom code
        while True:
            yield "1,1"

    def iterator(self):
        while True:
            for d in self.get_data():
                yield d


train_set = {
    "reader": FakeReader("test.data"),
    "columns": (
        Column.create(  # type: ignore
            name="x",
            dtype="float32",
            is_label=False,
        ),
        Column.create(  # type: ignore
            name="y",
            dtype="float32",
            is_label=True,
        ),
    ),
}
eval_set = {"reader": FakeReader("./eval.data"), "columns": train_set["columns"]}
# fmt: on
# ------------------------------------------------------------------------------------------


def test_fake_reader_input_fn():
    input_fn = build_input_fn(train_set, batch_size=4, epoch=3)
    batches = list(input_fn())
    assert [len(y) for _, y in batches] == [4] * 7 + [2]  # 3 epochs of 10 records
    features, labels = batches[0]
    assert list(features) == ["x"] and features["x"].dtype == np.float32
    x = np.concatenate([f["x"] for f, _ in batches])
    y = np.concatenate([lab for _, lab in batches])
    assert len(x) == 30 and ((y - 2 * x >= 1) & (y - 2 * x <= 4)).all()
    assert list(input_fn()) == []  # the train set's shards are handed out once
    eval_fn = build_input_fn(eval_set, batch_size=8, restart_each_call=True)
    assert sum(len(y) for _, y in eval_fn()) == 10 == sum(len(y) for _, y in eval_fn())


def test_non_elastic_reader():
    data_set = {"reader": Reader("./eval.data"), "columns": train_set["columns"]}
    batches = build_input_fn(data_set, batch_size=16)().take(3)
    got = list(batches)
    assert len(got) == 3 and all((f["x"] == 1).all() and (y == 1).all() for f, y in got)


def test_file_reader_reads_ranges_and_skips_the_header(tmp_path):
    path = tmp_path / "data.csv"
    rows = [f"{i},{i % 3},c{i}" for i in range(1001)]
    path.write_text("x,k,name\n" + "\n".join(rows))  # no final newline
    reader = FileReader(str(path), batch_size=100)
    assert reader._data_nums == 1001
    assert reader.read_data_by_index_range(0, 3) == rows[:3]
    assert reader.read_data_by_index_range(999, 1001) == rows[999:]
    assert list(reader.iterator()) == rows  # shards of two batches, in order, once
    crlf = tmp_path / "crlf.csv"
    crlf.write_text("a\r\nb\r\n", newline="")
    assert FileReader(str(crlf), skip_header=False).read_data_by_index_range(0, 2) == ["a", "b"]

    columns = [
        Column.create("x", "int64"),
        Column.create("k", "int32", is_label=True),
        Column.create("name", "string", is_sparse=True),
    ]
    input_fn = build_input_fn({"reader": reader, "columns": columns, "batch_size": 256}, epoch=2)
    got = list(input_fn())
    x = np.concatenate([f["x"] for f, _ in got])
    assert sorted(x.tolist()) == sorted(list(range(1001)) * 2)
    assert all((y == f["x"] % 3).all() for f, y in got)
    assert all((f["name"] == np.char.add("c", f["x"].astype(str))).all() for f, _ in got)


def test_two_readers_sharing_a_dispatcher_read_every_record_once(tmp_path):
    path = tmp_path / "data.csv"
    path.write_text("".join(f"{i}\n" for i in range(500)))
    readers = [FileReader(str(path), skip_header=False) for _ in range(2)]
    dispatcher = ShardDispatcher(500, batch_size=16, num_epochs=1)
    for i, r in enumerate(readers):
        r.use_dispatcher(dispatcher, f"worker-{i}")
    its = [r.iterator() for r in readers]
    got, alive = [], [True, True]
    while any(alive):  # interleave the two workers
        for i, it in enumerate(its):
            if alive[i]:
                line = next(it, None)
                alive[i] = line is not None
                if line is not None:
                    got.append(int(line))
    assert sorted(got) == list(range(500)) and dispatcher.finished()


def test_bad_records_and_confs_are_named(tmp_path):
    path = tmp_path / "data.csv"
    path.write_text("x,y\n1,2\n3,4\n5,6,7\n")
    columns = train_set["columns"]
    input_fn = build_input_fn({"reader": FileReader(str(path)), "columns": columns})
    with pytest.raises(InvalidInputError, match=r"data.csv, line 4: expected 2 fields, got 3"):
        list(input_fn())
    path.write_text("x,y\n1,2\nabc,4\n")
    input_fn = build_input_fn({"reader": FileReader(str(path)), "columns": columns})
    with pytest.raises(InvalidInputError, match=r"line 3, column 'x': field 'abc' is not a valid"):
        list(input_fn())
    with pytest.raises(ConfigError, match=r"unknown key\(s\) \['shuffle'\]"):
        build_input_fn({**train_set, "shuffle": True})
    with pytest.raises(ConfigError, match="has no 'columns'"):
        build_input_fn({"reader": FakeReader()})
    with pytest.raises(ConfigError, match="Column 'x': dtype 'complex64'"):
        Column.create(name="x", dtype="complex64")
    with pytest.raises(ConfigError, match="unknown setting"):
        Column.create(name="x", dtype="float32", shape=3)

    class Uncounted(ElasticReader):
        def count_data(self):
            pass

        def read_data_by_index_range(self, start_index, end_index):
            return []

    with pytest.raises(ConfigError, match="must set self._data_nums"):
        Uncounted("u")

    class Short(FakeReader):
        def read_data_by_index_range(self, start_index, end_index):
            return ["1,2"]

    with pytest.raises(InvalidInputError, match=r"gave 1 records, expected 4"):
        list(build_input_fn({"reader": Short(), "columns": columns}, batch_size=2)())
