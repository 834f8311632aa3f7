import numpy as np
import pytest

from tierserve.core.errors import ConfigError
from tierserve.trainer.data import (
    Check_t,
    DataFileError,
    DataGeneratorParams,
    DataReaderParams,
    DataReaderSparseParam,
    DataReaderType_t,
    Distribution_t,
    PowerLaw_t,
)


def test_reader_params_hugectr_defaults():
    p = DataReaderParams(
        data_reader_type=DataReaderType_t.Norm,
        source=["./wdl_norm/file_list.txt"],
        eval_source="./wdl_norm/file_list_test.txt",
        check_type=Check_t.Sum,
    )
    assert p.keyset == [] and p.cache_eval_data == 0
    assert p.num_samples == 0 and p.eval_num_samples == 0
    # float_label_dense: the binding's default (HugeCTR's document says True in one place,
    # False in another; pybind/model_wrapper.hpp has false)
    assert p.float_label_dense is False and p.num_workers == 12
    assert p.slot_size_array == [] and p.async_param is None and p.data_source_params is None
    # positional, in HugeCTR's order, and enum values by name
    q = DataReaderParams("Raw", "train.bin", [], "test.bin", "Non", 0, 100, 10)
    assert q.data_reader_type is DataReaderType_t.Raw and q.num_samples == 100
    assert DataReaderType_t.RawAsync.value == "RawAsync"


def test_raw_data_as_hugectr_generates_it_reads_right_with_the_default_params(tmp_path):
    """HugeCTR's generator writes int32 label and dense by default (float_label_dense=False);
    read with a default reader that once gave label 1 as 1.4e-45 (loss 0.0002, AUC nan).
    Float data read with the default is refused, naming the setting."""
    from hugectr_layout import raw_bytes

    from tierserve.trainer.data.reader import create_data_reader

    n = 64
    labels = [[i % 2] for i in range(n)]  # data_generation_for_raw: label i % 2, dense j
    dense = [list(range(3)) for _ in range(n)]
    keys = np.random.default_rng(0).integers(0, 100, (n, 2)).tolist()
    (tmp_path / "int.bin").write_bytes(raw_bytes(labels, dense, keys, False))
    params = DataReaderParams(data_reader_type=DataReaderType_t.Raw,
                              source=str(tmp_path / "int.bin"), check_type=Check_t.Non)
    sparse = [DataReaderSparseParam("d", 1, True, 2)]
    with create_data_reader(params, n, 1, 3, sparse) as reader:
        batch = reader.read_a_batch()
    np.testing.assert_array_equal(batch.label, np.array(labels, np.float32))
    np.testing.assert_array_equal(batch.dense, np.log1p(np.array(dense, np.float32)))

    (tmp_path / "float.bin").write_bytes(raw_bytes(labels, dense, keys, True))
    params = DataReaderParams(data_reader_type=DataReaderType_t.Raw,
                              source=str(tmp_path / "float.bin"), check_type=Check_t.Non)
    with (create_data_reader(params, n, 1, 3, sparse) as reader,
          pytest.raises(DataFileError, match="set float_label_dense=True") as err):
        reader.read_a_batch()
    assert err.value.record == 1 and "1065353216" in str(err.value)
    params = DataReaderParams(data_reader_type=DataReaderType_t.Raw, float_label_dense=True,
                              source=str(tmp_path / "int.bin"), check_type=Check_t.Non)
    with (create_data_reader(params, n, 1, 3, sparse) as reader,
          pytest.raises(DataFileError, match="int32 1; .* set float_label_dense=False")):
        reader.read_a_batch()


def test_reader_params_errors():
    with pytest.raises(ConfigError, match="data_reader_type"):
        DataReaderParams(data_reader_type="Csv", source="x")
    with pytest.raises(ConfigError, match="unknown field"):
        DataReaderParams(data_reader_type="Norm", source="x", bogus=1)
    with pytest.raises(ConfigError, match="num_workers"):
        DataReaderParams(data_reader_type="Norm", source="x", num_workers=0)


def test_sparse_param():
    p = DataReaderSparseParam("wide_data", 2, False, 26)
    assert p.name == p.sparse_name == "wide_data" and p.max_nnz == 52
    q = DataReaderSparseParam(name="deep", nnz_per_slot=[1, 3], is_fixed_length=True, slot_num=2)
    assert q.max_nnz == 4
    with pytest.raises(ConfigError, match="nnz_per_slot has 2 entries but slot_num is 3"):
        DataReaderSparseParam("x", [1, 2], True, 3)


def test_generator_params_defaults_and_checks():
    p = DataGeneratorParams(
        format=DataReaderType_t.Norm,
        label_dim=1,
        dense_dim=13,
        num_slot=2,
        i64_input_key=False,
        source="./a/file_list.txt",
        eval_source="./a/file_list_test.txt",
        slot_size_array=[10, 20],
    )
    assert p.check_type is Check_t.Sum and p.dist_type is Distribution_t.PowerLaw
    assert p.power_law_type is PowerLaw_t.Specific and p.alpha == 1.2
    assert (p.num_files, p.eval_num_files, p.num_samples_per_file) == (128, 32, 40960)
    assert (p.num_samples, p.eval_num_samples, p.float_label_dense) == (5242880, 1310720, False)
    assert p.nnz == [1, 1] and p.power_law_alpha == 1.2
    assert (
        DataGeneratorParams(**{**p.model_dump(), "power_law_type": "Long"}).power_law_alpha == 0.9
    )
    bad = p.model_dump()
    with pytest.raises(ConfigError, match="slot_size_array has 1 entries"):
        DataGeneratorParams(**{**bad, "slot_size_array": [3]})
    with pytest.raises(ConfigError, match="one-hot"):
        DataGeneratorParams(**{**bad, "format": "Raw", "nnz_array": [1, 2]})
    with pytest.raises(ConfigError, match="int32 keys"):
        DataGeneratorParams(**{**bad, "format": "Raw", "i64_input_key": True})
    # Parquet train and eval lists in one folder, as HugeCTR's examples have them
    assert DataGeneratorParams(**{**bad, "format": "Parquet"}).format is DataReaderType_t.Parquet
    with pytest.raises(ConfigError, match="alpha"):
        DataGeneratorParams(**{**bad, "alpha": 1.0})
