"""Data readers (Norm, Raw, Parquet), the data generator and the Criteo converter."""

from .batch import Batch, SparseInput
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
from .params import (
    AsyncParam,
    Check_t,
    DataReaderParams,
    DataReaderSparseParam,
    DataReaderType_t,
)
from .planted import auc_score
from .reader import DataReader, create_data_reader
from .records import Records
from .source import DataSource, DataSourceParams

__all__ = [
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
