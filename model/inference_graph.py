"""Forward-only dense network for serving: a graph JSON plus its dense model file.

The server looks embeddings up itself (cache, parameter server) and hands them here with the
dense features; the layers and their forward are the trainer's own, so predictions match
training's exactly (same float32 arithmetic).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from tierserve.core.errors import ConfigError, InvalidInputError

from .dense_file import NONTRAINABLE_SUFFIX, read_dense_file
from .device import to_xp
from .graph_json import Graph, load_graph_json
from .network import DenseNetwork
from .served_weights import ServedWeights, read_served_weights

EMBEDDING_TYPES = (
    "DistributedSlotSparseEmbeddingHash",
    "LocalizedSlotSparseEmbeddingHash",
    "LocalizedSlotSparseEmbeddingOneHot",
    "HybridSparseEmbedding",
)


@dataclass(frozen=True)
class EmbeddingSpec:
    """One embedding table of a graph: its name, sparse input, slots and vector size."""

    name: str
    type: str
    sparse_input: str
    slot_num: int
    embedding_vec_size: int
    combiner: str
    max_nnz: int
    hparam: dict


def graph_inputs(graph: Graph) -> tuple[dict, list[EmbeddingSpec]]:
    """The Data layer's settings and the embedding tables of ``graph``, in graph order."""
    data = graph.data_layer
    sparse = {s["top"]: s for s in data.get("sparse", []) or []}
    specs = []
    for layer in graph.layers_of_type(*EMBEDDING_TYPES):
        bottom = layer["bottom"] if isinstance(layer["bottom"], str) else layer["bottom"][0]
        if bottom not in sparse:
            raise ConfigError(
                f"embedding layer {layer['name']!r}: bottom {bottom!r} is not a sparse input "
                f"of the Data layer ({', '.join(sparse)})"
            )
        hp = dict(layer.get("sparse_embedding_hparam") or {})
        combiner = hp.get("combiner", "sum")
        combiner = {0: "sum", 1: "mean"}.get(combiner, combiner)
        specs.append(
            EmbeddingSpec(
                name=layer["name"],
                type=layer["type"],
                sparse_input=bottom,
                slot_num=int(sparse[bottom]["slot_num"]),
                embedding_vec_size=int(hp["embedding_vec_size"]),
                combiner=str(combiner),
                max_nnz=int(sparse[bottom].get("max_feature_num_per_sample", 0) or 0),
                hparam=hp,
            )
        )
    return data, specs


def label_layout(data: dict) -> tuple[list[str], list[int]]:
    """Label tensor names and widths of a Data layer dict."""
    label = data.get("label") or {}
    names = label.get("top", "label")
    dims = label.get("label_dim", 1)
    names = [names] if isinstance(names, str) else list(names)
    dims = [int(dims)] if isinstance(dims, int) else [int(d) for d in dims]
    return names, dims


_LOSSES = ("BinaryCrossEntropyLoss", "CrossEntropyLoss", "MultiCrossEntropyLoss")


def dense_layers(graph: Graph) -> list[dict[str, Any]]:
    """The graph's dense layers (everything after the Data and embedding layers).

    HugeCTR's older inference JSON ends in a ``Sigmoid`` layer instead of the loss; such a
    graph's last layer is read as the binary cross-entropy loss over the Sigmoid's input
    (whose prediction is that sigmoid), so one forward serves both forms.
    """
    layers = [
        layer for layer in graph.layers[1:] if layer["type"] not in (*EMBEDDING_TYPES, "Data")
    ]
    if (layers and layers[-1]["type"] == "Sigmoid"
            and not any(layer["type"] in _LOSSES for layer in layers)):
        names, _ = label_layout(graph.data_layer)
        last = layers[-1]
        layers[-1] = {"name": last.get("name", "sigmoid"), "type": "BinaryCrossEntropyLoss",
                      "bottom": [last["bottom"] if isinstance(last["bottom"], str)
                                 else last["bottom"][0], names[0]],
                      "top": last.get("top", "loss")}
    return layers


def input_shapes(graph: Graph) -> dict[str, tuple[int, ...]]:
    """Per-sample shapes of the tensors the dense network starts from."""
    data, specs = graph_inputs(graph)
    shapes: dict[str, tuple[int, ...]] = {}
    for name, dim in zip(*label_layout(data)):
        shapes[name] = (dim,)
    dense = data.get("dense") or {}
    if dense.get("top"):
        shapes[dense["top"]] = (int(dense.get("dense_dim", 0)),)
    for spec in specs:
        shapes[spec.name] = (spec.slot_num, spec.embedding_vec_size)
    return shapes


class InferenceGraph:
    """The dense network of a graph with its weights, ready to predict.

    ``weights`` may be a dense model file path (its ``.nontrainable`` sibling is read when
    the graph has non-trainable state) or a list of arrays in file order.

    With ``keep_tensors`` set, :meth:`predict` keeps every tensor of the last batch in
    ``last_tensors`` (HugeCTR's ``check_out_tensor``); off by default, as a server wants it:
    kept, a batch's intermediate tensors stay resident until the next batch replaces them
    (about 120 MiB after one 65,536-row request to the demo DLRM).
    """

    keep_tensors: bool = False

    def __init__(
        self,
        graph: Graph | str | os.PathLike,
        weights: str | os.PathLike | list[np.ndarray],
        nontrainable: str | os.PathLike | list[np.ndarray] | None = None,
        xp: Any = np,
    ) -> None:
        self.graph = graph if isinstance(graph, Graph) else load_graph_json(graph)
        #: The dense file's weights as served (:mod:`.served_weights`); None for arrays given.
        self.served: ServedWeights | None = None
        self.last_tensors: dict[str, Any] | None = None
        self.xp = xp
        data, self.embeddings = graph_inputs(self.graph)
        self.dense_name = (data.get("dense") or {}).get("top")
        self.dense_dim = int((data.get("dense") or {}).get("dense_dim", 0))
        self.label_names, self.label_dims = label_layout(data)
        self.network = DenseNetwork(dense_layers(self.graph), input_shapes(self.graph))
        if not self.network.loss_layers:
            raise ConfigError("the graph has no loss layer, so it defines no prediction")
        pshapes = self.network.flat_param_shapes()
        sshapes = self.network.flat_state_shapes()
        if isinstance(weights, (str, os.PathLike)):
            if nontrainable is None and sshapes:
                nontrainable = os.fspath(weights) + NONTRAINABLE_SUFFIX
            self.served = read_served_weights(weights, pshapes)
            weights = self.served.arrays
        if isinstance(nontrainable, (str, os.PathLike)):
            nontrainable = read_dense_file(nontrainable, sshapes, "non-trainable dense file")
        if len(weights) != len(pshapes):
            raise InvalidInputError(f"{len(weights)} weight arrays given, graph needs {len(pshapes)}")
        state = list(nontrainable) if nontrainable is not None else [
            s for per_layer in self.network.init_state() for s in per_layer
        ]
        self.params = self.network.unflatten(list(weights), self.network.param_shapes())
        self.states = self.network.unflatten(state, self.network.state_shapes())
        self.to_device(xp)

    def release(self) -> None:
        """Give up the pool's shared copy of the weights (the version is discarded)."""
        if self.served is not None:
            self.served.release()

    def to_device(self, xp: Any) -> None:
        """Move the weights to ``xp`` (cupy: its current device; numpy: the host) and predict
        there from now on."""
        self.params = [[to_xp(xp, w, np.float32) for w in layer] for layer in self.params]
        self.states = [[to_xp(xp, s, np.float32) for s in layer] for layer in self.states]
        self.xp = xp

    def predict(self, dense: Any, embeddings: dict[str, Any] | list[Any]) -> Any:
        """Probabilities ``[B, label_dim]`` from dense features ``[B, dense_dim]`` (None when
        ``dense_dim`` is 0) and each table's combined embeddings ``[B, slot_num, vec_size]``
        (a dict by table name, or a list in graph order)."""
        xp = self.xp
        if not isinstance(embeddings, dict):
            if len(embeddings) != len(self.embeddings):
                raise InvalidInputError(
                    f"{len(embeddings)} embedding arrays given; the graph has "
                    f"{len(self.embeddings)} tables"
                )
            embeddings = {s.name: e for s, e in zip(self.embeddings, embeddings)}
        tensors: dict[str, Any] = {}
        batch = None
        for spec in self.embeddings:
            if spec.name not in embeddings:
                raise InvalidInputError(f"no embeddings given for table {spec.name!r}")
            e = to_xp(xp, embeddings[spec.name], np.float32)
            want = (spec.slot_num, spec.embedding_vec_size)
            if e.ndim != 3 or tuple(e.shape[1:]) != want:
                raise InvalidInputError(
                    f"embeddings of table {spec.name!r} have shape {tuple(e.shape)}; "
                    f"expected [batch, {want[0]}, {want[1]}]"
                )
            tensors[spec.name] = e
            batch = e.shape[0]
        if self.dense_name:
            if dense is None and self.dense_dim == 0 and batch is not None:
                dense = np.zeros((batch, 0), np.float32)
            d = to_xp(xp, dense, np.float32)
            if d.ndim == 1 and self.dense_dim and d.size % self.dense_dim == 0:
                d = d.reshape(-1, self.dense_dim)
            if d.ndim != 2 or d.shape[1] != self.dense_dim:
                raise InvalidInputError(
                    f"dense features have shape {tuple(d.shape)}; expected "
                    f"[batch, {self.dense_dim}]"
                )
            if batch is not None and d.shape[0] != batch:
                raise InvalidInputError(
                    f"dense features hold {d.shape[0]} samples, the embeddings {batch}"
                )
            tensors[self.dense_name] = d
        self.network.forward(xp, tensors, self.params, self.states, False, with_loss=False)
        if self.keep_tensors:
            self.last_tensors = tensors
        outs = [layer.predict(xp, tensors[logits]) for layer, logits in
                self.network.prediction_inputs()]
        outs = [o.reshape(o.shape[0], -1) for o in outs]
        return outs[0] if len(outs) == 1 else xp.concatenate(outs, axis=1)
