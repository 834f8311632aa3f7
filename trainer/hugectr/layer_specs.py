"""HugeCTR's layer description objects — ``Input``, ``SparseEmbedding``, ``DenseLayer``,
``GroupDenseLayer`` — and their enums.  ``Model.add`` turns each into graph-JSON layer
dicts (docs/formats.md, Files and messages 3); :mod:`tierserve.model.layers` runs them.
"""

from __future__ import annotations

import enum
from typing import Any

from tierserve.core.errors import ConfigError
from tierserve.model.layers import LAYER_TYPES


class Layer_t(enum.Enum):  # noqa: N801 - HugeCTR's name
    Add = "Add"
    BatchNorm = "BatchNorm"
    Cast = "Cast"
    Concat = "Concat"
    Dropout = "Dropout"
    ELU = "ELU"
    FmOrder2 = "FmOrder2"
    FusedInnerProduct = "FusedInnerProduct"
    InnerProduct = "InnerProduct"
    Interaction = "Interaction"
    MultiCross = "MultiCross"
    ReLU = "ReLU"
    ReduceSum = "ReduceSum"
    Reshape = "Reshape"
    Sigmoid = "Sigmoid"
    Slice = "Slice"
    WeightMultiply = "WeightMultiply"
    ElementwiseMultiply = "ElementwiseMultiply"
    ElementWiseMultiply = "ElementwiseMultiply"  # the documents' spelling (an alias)
    GRU = "GRU"
    Scale = "Scale"
    FusedReshapeConcat = "FusedReshapeConcat"
    FusedReshapeConcatGeneral = "FusedReshapeConcatGeneral"
    Softmax = "Softmax"
    PReLU_Dice = "PReLU_Dice"
    ReduceMean = "ReduceMean"
    Sub = "Sub"
    MatrixMultiply = "MatrixMultiply"
    Gather = "Gather"
    BinaryCrossEntropyLoss = "BinaryCrossEntropyLoss"
    CrossEntropyLoss = "CrossEntropyLoss"
    MultiCrossEntropyLoss = "MultiCrossEntropyLoss"


class Tensor_t(enum.Enum):  # noqa: N801 - HugeCTR's name
    """Which step's tensors ``Model.check_out_tensor`` returns: the last training or the last
    evaluation batch's."""

    Train = "Train"
    Evaluate = "Evaluate"


#: ``hugectr.ElementWiseMultiply``, as HugeCTR's document spells the layer type.
ElementWiseMultiply = Layer_t.ElementwiseMultiply


class GroupLayer_t(enum.Enum):  # noqa: N801 - HugeCTR's name
    GroupFusedInnerProduct = "GroupFusedInnerProduct"


class Initializer_t(enum.Enum):  # noqa: N801 - HugeCTR's name
    Default = "Default"
    Uniform = "Uniform"
    XavierNorm = "XavierNorm"
    XavierUniform = "XavierUniform"
    Zero = "Zero"


class Regularizer_t(enum.Enum):  # noqa: N801 - HugeCTR's name
    L1 = "L1"
    L2 = "L2"


class FcPosition_t(enum.Enum):  # noqa: N801 - HugeCTR's name
    Head = "Head"
    Body = "Body"
    Tail = "Tail"
    Isolated = "Isolated"
    Non = "Non"


class Activation_t(enum.Enum):  # noqa: N801 - HugeCTR's name
    Relu = "Relu"
    Non = "Non"


def _name(value: Any) -> str:
    return value.name if isinstance(value, enum.Enum) else str(value)


def _names(value: str | list[str]) -> list[str]:
    return [value] if isinstance(value, str) else list(value)


def _one_or_list(names: list[str]) -> str | list[str]:
    return names[0] if len(names) == 1 else names


class Input:
    """The data input: label(s), dense features and the sparse inputs (HugeCTR's ``Input``).

    ``label_dim`` / ``label_name`` may be lists for multi-label data.
    """

    def __init__(
        self,
        label_dim: int | list[int],
        label_name: str | list[str],
        dense_dim: int,
        dense_name: str,
        data_reader_sparse_param_array: list | None = None,
    ) -> None:
        self.label_dims = [int(d) for d in (label_dim if isinstance(label_dim, list) else
                                             [label_dim])]
        self.label_names = _names(label_name)
        if len(self.label_dims) != len(self.label_names):
            raise ConfigError(
                f"Input: {len(self.label_names)} label names for {len(self.label_dims)} "
                "label dimensions"
            )
        if any(d < 1 for d in self.label_dims) or int(dense_dim) < 0:
            raise ConfigError("Input: label_dim must be positive and dense_dim >= 0")
        self.dense_dim = int(dense_dim)
        self.dense_name = dense_name
        self.sparse_params = list(data_reader_sparse_param_array or [])

    @property
    def label_dim(self) -> int:
        return sum(self.label_dims)

    def to_json(self, reader_params: Any = None) -> dict[str, Any]:
        layer: dict[str, Any] = {"name": "data", "type": "Data"}
        if reader_params is not None:
            layer["format"] = _name(reader_params.data_reader_type)
            layer["source"] = reader_params.source
            layer["eval_source"] = reader_params.eval_source
            layer["check"] = _name(reader_params.check_type)
            if reader_params.slot_size_array:
                layer["slot_size_array"] = list(reader_params.slot_size_array)
            if layer["format"] in ("Raw", "RawAsync"):  # how serving reads Raw data too
                layer["float_label_dense"] = bool(reader_params.float_label_dense)
        layer["label"] = {
            "top": _one_or_list(self.label_names),
            "label_dim": self.label_dims[0] if len(self.label_dims) == 1 else self.label_dims,
        }
        layer["dense"] = {"top": self.dense_name, "dense_dim": self.dense_dim}
        layer["sparse"] = [
            {
                "top": p.sparse_name,
                "type": "DistributedSlot",
                "max_feature_num_per_sample": p.max_nnz,
                "nnz_per_slot": p.nnz_list(),  # a list, as HugeCTR writes it
                "is_fixed_length": p.is_fixed_length,
                "slot_num": p.slot_num,
            }
            for p in self.sparse_params
        ]
        return layer


class SparseEmbedding:
    """One embedding table over a sparse input (HugeCTR's ``SparseEmbedding``)."""

    def __init__(
        self,
        embedding_type: Any,
        workspace_size_per_gpu_in_mb: int,
        embedding_vec_size: int,
        combiner: str | int,
        sparse_embedding_name: str,
        bottom_name: str,
        slot_size_array: list[int] | None = None,
        optimizer: Any = None,
        hybrid_embedding_param: Any = None,
    ) -> None:
        if _name(embedding_type) == "HybridSparseEmbedding":
            raise ConfigError(
                f"SparseEmbedding {sparse_embedding_name!r}: HybridSparseEmbedding (HugeCTR's "
                "MLPerf embedding over RawAsync data) is not available; use "
                "LocalizedSlotSparseEmbeddingOneHot or DistributedSlotSparseEmbeddingHash, "
                "which compute the same lookup"
            )
        if isinstance(combiner, int):
            combiner = {0: "sum", 1: "mean"}.get(combiner, combiner)
        if combiner not in ("sum", "mean"):
            raise ConfigError(
                f"SparseEmbedding {sparse_embedding_name!r}: combiner must be 'sum' or 'mean', "
                f"got {combiner!r}"
            )
        if int(embedding_vec_size) < 1 or float(workspace_size_per_gpu_in_mb) <= 0:
            raise ConfigError(
                f"SparseEmbedding {sparse_embedding_name!r}: embedding_vec_size and "
                "workspace_size_per_gpu_in_mb must be positive"
            )
        self.embedding_type = embedding_type
        self.workspace_size_per_gpu_in_mb = workspace_size_per_gpu_in_mb
        self.embedding_vec_size = int(embedding_vec_size)
        self.combiner = combiner
        self.sparse_embedding_name = sparse_embedding_name
        self.bottom_name = bottom_name
        self.slot_size_array = list(slot_size_array or [])
        self.optimizer = optimizer
        if hybrid_embedding_param is not None:
            from tierserve.core.compat import warn_once

            warn_once("SparseEmbedding.hybrid_embedding_param", "HugeCTR's MLPerf hybrid "
                      "embedding (frequent keys replicated, the rest model-parallel) is a "
                      "multi-GPU communication scheme; the table is looked up and trained as "
                      "one table on one device (the same values)", stacklevel=2)

    def to_json(self) -> dict[str, Any]:
        hparam: dict[str, Any] = {
            "workspace_size_per_gpu_in_mb": self.workspace_size_per_gpu_in_mb,
            "embedding_vec_size": self.embedding_vec_size,
            "combiner": self.combiner,
        }
        if self.slot_size_array:
            hparam["slot_size_array"] = self.slot_size_array
        layer = {
            "name": self.sparse_embedding_name,
            "type": _name(self.embedding_type),
            "bottom": self.bottom_name,
            "top": self.sparse_embedding_name,
            "sparse_embedding_hparam": hparam,
        }
        if self.optimizer is not None:
            layer["optimizer"] = self.optimizer.to_dict()
        return layer


class DenseLayer:
    """A dense layer or loss (HugeCTR's ``DenseLayer``); arguments and defaults are HugeCTR's.

    The regularizer's lambda is passed as ``**{"lambda": 0.1}`` (or ``lambda_=0.1``).
    """

    def __init__(
        self,
        layer_type: Any,
        bottom_names: str | list[str],
        top_names: str | list[str],
        factor: float = 1.0,
        eps: float = 1e-5,
        gamma_init_type: Any = Initializer_t.Default,
        beta_init_type: Any = Initializer_t.Default,
        dropout_rate: float = 0.5,
        elu_alpha: float = 1.0,
        num_output: int = 1,
        weight_init_type: Any = Initializer_t.Default,
        bias_init_type: Any = Initializer_t.Default,
        num_layers: int = 0,
        leading_dim: int = 1,
        time_step: int = 0,
        batchsize: int = 1,
        SeqLength: int = 1,  # noqa: N803 - HugeCTR's name
        vector_size: int = 1,
        selected: bool = False,
        selected_slots: list[int] | None = None,
        ranges: list | None = None,
        indices: list[int] | None = None,
        weight_dims: list[int] | None = None,
        out_dim: int = 0,
        axis: int = 1,
        target_weight_vec: list[float] | None = None,
        use_regularizer: bool = False,
        regularizer_type: Any = Regularizer_t.L1,
        lambda_: float = 0.0,
        pos_type: Any = FcPosition_t.Non,
        act_type: Any = Activation_t.Relu,
        **kwargs: Any,
    ) -> None:
        if "lambda" in kwargs:
            lambda_ = kwargs.pop("lambda")
        if kwargs:
            raise ConfigError(f"DenseLayer got unknown arguments {sorted(kwargs)}")
        if _name(pos_type) != "Non":
            from tierserve.core.compat import warn_once

            warn_once("DenseLayer.pos_type", "HugeCTR's MLPerf chain of fused layers is not "
                      "used; each FusedInnerProduct computes act(x W + b) on its own (the same "
                      "values)", stacklevel=3)
        self.layer_type = _name(layer_type)
        self.bottom_names = _names(bottom_names)
        self.top_names = _names(top_names)
        if self.layer_type not in LAYER_TYPES:
            raise ConfigError(f"DenseLayer {self.top_names}: unknown layer type {layer_type!r}")
        self.settings = dict(
            factor=factor, eps=eps, gamma_init_type=_name(gamma_init_type),
            beta_init_type=_name(beta_init_type), dropout_rate=dropout_rate,
            elu_alpha=elu_alpha, num_output=num_output, weight_init_type=_name(weight_init_type),
            bias_init_type=_name(bias_init_type), num_layers=num_layers,
            leading_dim=leading_dim, time_step=time_step, batchsize=batchsize,
            SeqLength=SeqLength, vector_size=vector_size, selected=selected,
            selected_slots=list(selected_slots or []), ranges=[list(r) for r in ranges or []],
            indices=list(indices or []), weight_dims=list(weight_dims or []), out_dim=out_dim,
            axis=axis, target_weight_vec=list(target_weight_vec or []),
            use_regularizer=use_regularizer, regularizer_type=_name(regularizer_type),
            reg_lambda=float(lambda_), pos_type=_name(pos_type), act_type=_name(act_type),
        )

    def to_json(self) -> dict[str, Any]:
        s = self.settings
        t = self.layer_type
        layer: dict[str, Any] = {
            "name": self.top_names[0],
            "type": t,
            "bottom": _one_or_list(self.bottom_names),
            "top": _one_or_list(self.top_names),
        }
        if t in ("InnerProduct", "FusedInnerProduct"):
            layer["fc_param"] = {
                "num_output": int(s["num_output"]),
                "weight_init": s["weight_init_type"],
                "bias_init": s["bias_init_type"],
            }
            if t == "FusedInnerProduct":
                layer["position"] = s["pos_type"]
                layer["activation"] = s["act_type"]
        elif t == "BatchNorm":
            layer["bn_param"] = {
                "factor": float(s["factor"]), "eps": float(s["eps"]),
                "gamma_init": s["gamma_init_type"], "beta_init": s["beta_init_type"],
            }
        elif t == "Dropout":
            layer["rate"] = float(s["dropout_rate"])
        elif t == "ELU":
            layer["elu_param"] = {"alpha": float(s["elu_alpha"])}
        elif t == "PReLU_Dice":
            layer["prelu_dice_param"] = {"alpha": float(s["elu_alpha"]), "eps": float(s["eps"])}
        elif t == "MultiCross":
            layer["mc_param"] = {
                "num_layers": int(s["num_layers"]),
                "weight_init": s["weight_init_type"], "bias_init": s["bias_init_type"],
            }
        elif t == "Reshape":
            layer["leading_dim"] = int(s["leading_dim"])
            if s["time_step"]:
                layer["time_step"] = int(s["time_step"])
            if s["selected"]:
                layer["selected"] = s["selected_slots"]
        elif t == "Slice":
            layer["ranges"] = s["ranges"]
        elif t == "WeightMultiply":
            layer["weight_dims"] = s["weight_dims"]
            layer["weight_init"] = s["weight_init_type"]
        elif t == "FmOrder2":
            layer["out_dim"] = int(s["out_dim"])
        elif t in ("ReduceSum", "ReduceMean", "Concat"):
            layer["axis"] = int(s["axis"])
        elif t == "Gather":
            layer["indices"] = s["indices"]
        elif t == "GRU":
            layer["gru_param"] = {
                "num_output": int(s["num_output"]), "batchsize": int(s["batchsize"]),
                "SeqLength": int(s["SeqLength"]), "vector_size": int(s["vector_size"]),
                "weight_init": s["weight_init_type"], "bias_init": s["bias_init_type"],
            }
        elif t == "Scale":
            layer["scale_param"] = {"axis": int(s["axis"]), "factor": int(s["factor"])}
        if t.endswith("Loss"):
            if s["use_regularizer"]:
                layer["regularizer"] = s["regularizer_type"]
                layer["lambda"] = s["reg_lambda"]
            if t == "MultiCrossEntropyLoss" and s["target_weight_vec"]:
                layer["target_weight"] = s["target_weight_vec"]
        return layer


class GroupDenseLayer:
    """A stack of fused fully connected layers (``GroupLayer_t.GroupFusedInnerProduct``).

    Every layer but the last has a ReLU; the last has ``last_act_type``.  Added to the
    graph as one ``FusedInnerProduct`` layer per entry of ``top_name_list``.
    """

    def __init__(
        self,
        group_layer_type: Any,
        bottom_name_list: str | list[str] | None = None,
        top_name_list: list[str] | None = None,
        num_outputs: list[int] | None = None,
        last_act_type: Any = Activation_t.Relu,
        bottom_name: str | list[str] | None = None,
    ) -> None:
        if _name(group_layer_type) != "GroupFusedInnerProduct":
            raise ConfigError(f"GroupDenseLayer: unknown group_layer_type {group_layer_type!r}")
        bottoms = bottom_name_list if bottom_name_list is not None else bottom_name
        if not bottoms:
            raise ConfigError("GroupDenseLayer: bottom_name_list is required")
        self.bottom_names = _names(bottoms)
        self.top_names = list(top_name_list or [])
        self.num_outputs = [int(n) for n in num_outputs or []]
        if len(self.top_names) < 2 or len(self.top_names) != len(self.num_outputs):
            raise ConfigError(
                f"GroupDenseLayer {self.top_names}: needs at least two layers and one "
                f"num_outputs entry per top name (got {len(self.num_outputs)})"
            )
        self.last_act_type = _name(last_act_type)

    def to_json_layers(self) -> list[dict[str, Any]]:
        out, bottom = [], _one_or_list(self.bottom_names)
        for i, (top, n) in enumerate(zip(self.top_names, self.num_outputs)):
            last = i == len(self.top_names) - 1
            out.append({
                "name": top,
                "type": "FusedInnerProduct",
                "bottom": bottom,
                "top": top,
                "fc_param": {"num_output": n, "weight_init": "Default", "bias_init": "Default"},
                "position": "Non",
                "activation": self.last_act_type if last else "Relu",
            })
            bottom = top
        return out
