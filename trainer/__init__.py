"""tierserve's embedded trainer: HugeCTR's Python training API on numpy (and cupy).

A HugeCTR training script runs after changing only its import line to
``import tierserve.trainer as hugectr``; ``hugectr.inference`` (HugeCTR's inference API) is
imported on first use, so importing the trainer does not import the server.
"""

from typing import Any

from tierserve.model.inference_graph import InferenceGraph
from tierserve.ps.config_base import (
    DatabaseHashMapAlgorithm_t,
    DatabaseOverflowPolicy_t,
    DatabaseType_t,
    UpdateSourceType_t,
)
from tierserve.trainer.hugectr.adapters import ReaderHandle as DataReader32
from tierserve.trainer.hugectr.etc_params import CreateHMemCache
from tierserve.trainer.hugectr.layer_specs import (
    Activation_t,
    DenseLayer,
    ElementWiseMultiply,
    FcPosition_t,
    GroupDenseLayer,
    GroupLayer_t,
    Initializer_t,
    Input,
    Layer_t,
    Regularizer_t,
    SparseEmbedding,
    Tensor_t,
)
from tierserve.trainer.hugectr.mlperf import (
    CommunicationType,
    CreateETC,
    HybridEmbeddingParam,
    HybridEmbeddingType,
    TrainPSType_t,
)
from tierserve.trainer.hugectr.model import Model
from tierserve.trainer.hugectr.session import (
    ModelOversubscriber,
    Session,
    SolverParser,
    get_learning_rate_scheduler,
    solver_parser_helper,
)
from tierserve.trainer.hugectr.solver import (
    AllReduceAlgo,
    CreateSolver,
    DeviceLayout,
    LrPolicy_t,
    Solver,
)

# estimator: the Estimator API (tf.estimator / tf.feature_column names); importing it also
# registers its layer types (Tanh, MeanSquaredErrorLoss, ...) that exported graphs use.
from . import data, estimator, feature_column, tools
from .data.generator import DataGenerator, DataGeneratorParams, Distribution_t, PowerLaw_t
from .data.params import (
    Alignment_t,
    AsyncParam,
    Check_t,
    DataReaderParams,
    DataReaderSparseParam,
    DataReaderType_t,
)
from .embedding import Embedding_t
from .lr_scheduler import LearningRateScheduler
from .metrics import MetricsType
from .optimizers import CreateOptimizer, Optimizer_t, OptParamsPy, Update_t

#: HugeCTR's reader classes by key width: the object ``get_data_reader_train`` returns.
DataReader64 = DataReader32


def __getattr__(name: str) -> Any:
    if name == "inference":  # HugeCTR's hugectr.inference, imported on first use
        import importlib

        return importlib.import_module(".inference", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "Activation_t",
    "Alignment_t",
    "AllReduceAlgo",
    "AsyncParam",
    "Check_t",
    "CommunicationType",
    "CreateETC",
    "CreateHMemCache",
    "CreateOptimizer",
    "CreateSolver",
    "DatabaseHashMapAlgorithm_t",
    "DatabaseOverflowPolicy_t",
    "DatabaseType_t",
    "DataGenerator",
    "DataGeneratorParams",
    "DataReader32",
    "DataReader64",
    "DataReaderParams",
    "DataReaderSparseParam",
    "DataReaderType_t",
    "DenseLayer",
    "DeviceLayout",
    "ElementWiseMultiply",
    "Embedding_t",
    "Distribution_t",
    "FcPosition_t",
    "GroupDenseLayer",
    "GroupLayer_t",
    "HybridEmbeddingParam",
    "HybridEmbeddingType",
    "InferenceGraph",
    "Initializer_t",
    "Input",
    "Layer_t",
    "LearningRateScheduler",
    "LrPolicy_t",
    "MetricsType",
    "Model",
    "ModelOversubscriber",
    "OptParamsPy",
    "Optimizer_t",
    "PowerLaw_t",
    "Regularizer_t",
    "Session",
    "Solver",
    "Tensor_t",
    "TrainPSType_t",
    "SolverParser",
    "SparseEmbedding",
    "Update_t",
    "UpdateSourceType_t",
    "data",
    "estimator",
    "feature_column",
    "get_learning_rate_scheduler",
    "solver_parser_helper",
    "tools",
]
