"""Data readers (Norm, Raw, Parquet), the data generator, the Criteo converter and ``tf.data``-style
streaming datasets (``Dataset``, ``TextLineDataset``, ``decode_csv``)."""

from tierserve.model.batch import Batch, SparseInput

from .csv_decode import CSVRecordError, DecodeCSVError, decode_csv
from .dataset import AUTOTUNE, Dataset
from .errors import DataFileError
from .filelist import read_file_list, write_file_list
from .generator import (
    DataGenerator,
    DataGeneratorParams,
    Distribution_t,
    GeneratedDataset,
    GeneratedSplit,
    PowerLaw_t,
)
from .iterator import OutOfRangeError, make_one_shot_iterator
from .params import (
    AsyncParam,
    Check_t,
    DataReaderParams,
    DataReaderSparseParam,
    DataReaderType_t,
)
from .planted import auc_score
from .reader import DataReader, create_data_reader
from .reader_datasets import NormDataset, ParquetDataset, RawDataset
from .records import Records
from .source import DataSource, DataSourceParams
from .text_lines import TextLineDataset

__all__ = [
    "AUTOTUNE",
    "CSVRecordError",
    "Dataset",
    "DecodeCSVError",
    "OutOfRangeError",
    "NormDataset",
    "ParquetDataset",
    "RawDataset",
    "TextLineDataset",
    "decode_csv",
    "make_one_shot_iterator",
    "AsyncParam",
    "Batch",
    "Check_t",
    "DataFileError",
    "DataGenerator",
    "DataGeneratorParams",
    "DataReader",
    "DataReaderParams",
    "DataReaderSparseParam",
    "DataReaderType_t",
    "DataSource",
    "DataSourceParams",
    "Distribution_t",
    "GeneratedDataset",
    "GeneratedSplit",
    "PowerLaw_t",
    "Records",
    "SparseInput",
    "auc_score",
    "create_data_reader",
    "read_file_list",
    "write_file_list",
]
