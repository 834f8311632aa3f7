"""Layer configurations with input shapes, shared by the gradient and forward tests."""

from __future__ import annotations

# (id, layer dict, per-sample input shapes, label input index or None)
CASES = [
    ("InnerProduct", {"type": "InnerProduct", "fc_param": {"num_output": 4}}, [(5,)]),
    ("InnerProduct3d", {"type": "InnerProduct", "fc_param": {"num_output": 3}}, [(2, 4)]),
    ("FusedInnerProduct", {"type": "FusedInnerProduct", "fc_param": {"num_output": 4}}, [(5,)]),
    (
        "FusedInnerProductNon",
        {"type": "FusedInnerProduct", "fc_param": {"num_output": 3}, "activation": "Non"},
        [(4,)],
    ),
    ("ReLU", {"type": "ReLU"}, [(6,)]),
    ("ELU", {"type": "ELU", "elu_param": {"alpha": 0.7}}, [(6,)]),
    ("Sigmoid", {"type": "Sigmoid"}, [(5,)]),
    ("PReLU_Dice", {"type": "PReLU_Dice", "elu_alpha": 0.3, "eps": 1e-6}, [(4,)]),
    ("Dropout", {"type": "Dropout", "rate": 0.4}, [(7,)]),
    ("BatchNorm", {"type": "BatchNorm", "bn_param": {"factor": 0.5, "eps": 1e-5}}, [(4,)]),
    ("Concat", {"type": "Concat"}, [(3,), (2,), (4,)]),
    ("Concat3dSlots", {"type": "Concat", "axis": 1}, [(2, 3), (1, 3)]),
    ("Concat3dVectors", {"type": "Concat", "axis": 2}, [(2, 3), (2, 1)]),
    ("Reshape", {"type": "Reshape", "leading_dim": 12}, [(3, 4)]),
    ("ReshapeRows", {"type": "Reshape", "leading_dim": 4}, [(12,)]),
    ("ReshapeTimeStep", {"type": "Reshape", "leading_dim": 2, "time_step": 3}, [(6,)]),
    ("ReshapeSelected", {"type": "Reshape", "leading_dim": 1, "selected": [2, 0, 2]}, [(3, 2)]),
    ("Slice", {"type": "Slice", "ranges": [[0, 3], [2, 5]]}, [(6,)]),
    ("Interaction", {"type": "Interaction"}, [(3,), (4, 3)]),
    ("MultiCross", {"type": "MultiCross", "mc_param": {"num_layers": 3}}, [(5,)]),
    ("FmOrder2", {"type": "FmOrder2", "out_dim": 3}, [(12,)]),
    ("WeightMultiply", {"type": "WeightMultiply", "weight_dims": [4, 3]}, [(4,)]),
    ("ElementwiseMultiply", {"type": "ElementwiseMultiply"}, [(5,), (5,), (5,)]),
    ("Add", {"type": "Add"}, [(2, 3), (2, 3), (2, 3)]),
    ("Sub", {"type": "Sub"}, [(4,), (4,)]),
    ("MatrixMultiply", {"type": "MatrixMultiply"}, [(2, 3), (3, 4)]),
    ("MatrixMultiply4d", {"type": "MatrixMultiply"}, [(2, 1, 3), (2, 3, 2)]),
    ("ReduceSum", {"type": "ReduceSum", "axis": 1}, [(3, 4)]),
    ("ReduceSumLast", {"type": "ReduceSum", "axis": 2}, [(3, 4)]),
    ("ReduceMean", {"type": "ReduceMean", "axis": 1}, [(3, 4)]),
    ("ScaleRepeat", {"type": "Scale", "axis": 0, "factor": 3}, [(4,)]),
    ("ScaleTile", {"type": "Scale", "axis": 1, "factor": 2}, [(4,)]),
    ("Gather", {"type": "Gather", "indices": [2, 0, 2]}, [(3, 4)]),
    ("Softmax", {"type": "Softmax"}, [(5,)]),
    ("Cast", {"type": "Cast"}, [(3,)]),
    ("FusedReshapeConcat", {"type": "FusedReshapeConcat"}, [(3, 2), (3, 1)]),
    ("FusedReshapeConcatGeneral", {"type": "FusedReshapeConcatGeneral"}, [(3, 2), (3, 2)]),
    ("GRU", {"type": "GRU", "gru_param": {"num_output": 3, "SeqLength": 4, "vector_size": 2}},
     [(8,)]),
    ("BinaryCrossEntropyLoss", {"type": "BinaryCrossEntropyLoss"}, [(1,), (1,)]),
    ("CrossEntropyLoss", {"type": "CrossEntropyLoss"}, [(3,), (1,)]),
    (
        "MultiCrossEntropyLoss",
        {"type": "MultiCrossEntropyLoss", "target_weight": [0.5, 1.0, 2.0]},
        [(3,), (3,)],
    ),
]


def num_tops(config: dict) -> int:
    if config["type"] == "FusedReshapeConcat":
        return 2
    return len(config.get("ranges", [])) or 1


def layer_config(case_id: str, config: dict, num_inputs: int, num_outputs: int = 1) -> dict:
    return {
        "name": case_id,
        "bottom": [f"in{i}" for i in range(num_inputs)],
        "top": [f"out{i}" for i in range(num_outputs)],
        **config,
    }
