"""tierserve's embedded trainer: HugeCTR's Python training API on numpy (and cupy).

A HugeCTR training script runs after changing only its import line to
``import tierserve.trainer as hugectr``.
"""

from . import tools
from .data.generator import DataGenerator, DataGeneratorParams, Distribution_t, PowerLaw_t
from .data.params import (
    AsyncParam,
    Check_t,
    DataReaderParams,
    DataReaderSparseParam,
    DataReaderType_t,
)
from .embedding import Embedding_t
from .inference_graph import InferenceGraph
from .layer_specs import (
    Activation_t,
    DenseLayer,
    FcPosition_t,
    GroupDenseLayer,
    GroupLayer_t,
    Initializer_t,
    Input,
    Layer_t,
    Regularizer_t,
    SparseEmbedding,
)
from .lr_scheduler import LearningRateScheduler
from .metrics import MetricsType
from .model import Model
from .optimizers import CreateOptimizer, Optimizer_t, OptParamsPy, Update_t
from .solver import AllReduceAlgo, CreateSolver, DeviceLayout, LrPolicy_t, Solver

__all__ = [
    "Activation_t",
    "AllReduceAlgo",
    "AsyncParam",
    "Check_t",
    "CreateOptimizer",
    "CreateSolver",
    "DataGenerator",
    "DataGeneratorParams",
    "DataReaderParams",
    "DataReaderSparseParam",
    "DataReaderType_t",
    "DenseLayer",
    "DeviceLayout",
    "Embedding_t",
    "Distribution_t",
    "FcPosition_t",
    "GroupDenseLayer",
    "GroupLayer_t",
    "InferenceGraph",
    "Initializer_t",
    "Input",
    "Layer_t",
    "LearningRateScheduler",
    "LrPolicy_t",
    "MetricsType",
    "Model",
    "OptParamsPy",
    "Optimizer_t",
    "PowerLaw_t",
    "Regularizer_t",
    "Solver",
    "SparseEmbedding",
    "Update_t",
    "tools",
]
