"""HugeCTR's ``Model``: build a graph with ``add``, ``compile``, train with ``fit`` (or the
low-level ``train`` / ``eval`` loop), save and load model files.

This is the facade: HugeCTR's names and arguments over the trainer's
:class:`~tierserve.trainer.training_engine.TrainingEngine`, which holds the tables, the dense
network's parameters and the optimizer states and runs each step.  The facade keeps the
graph's layer descriptions, the data readers, the metrics, the learning-rate scheduler and
the embedding training cache; model files are :mod:`.model_files`, ``fit``'s loop
:mod:`.fit_loop`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tierserve.core.errors import ConfigError
from tierserve.model import manifest
from tierserve.model.device import to_numpy
from tierserve.model.graph_json import Graph, load_graph_json, save_graph_json
from tierserve.model.inference_graph import EMBEDDING_TYPES
from tierserve.trainer.hugectr.layer_specs import (
    DenseLayer,
    GroupDenseLayer,
    Input,
    SparseEmbedding,
)
from tierserve.trainer.hugectr.solver import Solver
from tierserve.trainer.metrics import Metrics
from tierserve.trainer.optimizers import OptParamsPy, make_optimizer
from tierserve.trainer.training_engine import TrainingEngine

from . import adapters, fit_loop, model_files


def _engine_attribute(name: str, doc: str) -> property:
    """A ``Model`` attribute that is its engine's ``name`` (read and written there)."""
    return property(lambda self: getattr(self.engine, name),
                    lambda self, value: setattr(self.engine, name, value), doc=doc)


class Model:
    """A HugeCTR model: ``Model(solver, reader_params, optimizer)``, then ``add`` layers.

    ``etc`` (``CreateETC(...)``): the embedding training cache (:mod:`.etc`); the tables'
    full rows live in its parameter servers and the model trains a keyset's rows at a time.
    """

    def __init__(
        self, solver: Solver, reader_params: Any, opt_params: OptParamsPy, etc: Any = None
    ) -> None:
        if etc is not None:
            from .etc_params import EmbeddingTrainingCacheParams

            if not isinstance(etc, EmbeddingTrainingCacheParams):
                raise ConfigError(f"Model(etc=...) takes what hugectr.CreateETC returns, not "
                                  f"{type(etc).__name__}")
        self._etc_params = etc
        self._etc = None
        if etc is None and getattr(reader_params, "keyset", None):
            from tierserve.core.compat import warn_once

            warn_once("DataReaderParams.keyset", "keyset files are read only by the embedding "
                      "training cache: build the Model with etc=CreateETC(...) to train each "
                      "file list with its keyset; without etc they are not read")
        self.solver = solver
        self.reader_params = reader_params
        self.opt_params = opt_params
        self._input: Input | None = None
        self._embedding_dicts: list[dict[str, Any]] = []
        self._dense_dicts: list[dict[str, Any]] = []
        self._compiled = False
        self.engine = TrainingEngine(solver.lr)
        self._scheduler = adapters.make_scheduler(solver)
        self._train_reader = None
        self._eval_reader = None
        self._metrics = Metrics(solver.metrics_spec)
        self._last_eval: tuple[np.ndarray, np.ndarray] | None = None
        self._dist = None  # the distributed hooks under mpiexec (tierserve.trainer.distributed)

    # -- the engine's state, under the names scripts and tools read ----------------------------

    xp = _engine_attribute("xp", "numpy, or cupy when the model runs on a GPU")
    tables = _engine_attribute("tables", "the embedding tables, in the graph's order")
    embedding_specs = _engine_attribute("embedding_specs", "the embedding layers' specs")
    network = _engine_attribute("network", "the dense network (DenseNetwork)")
    params = _engine_attribute("params", "the dense parameters, per layer")
    states = _engine_attribute("states", "the dense layers' non-trainable state, per layer")
    optimizer = _engine_attribute("optimizer", "the dense optimizer")
    opt_states = _engine_attribute("opt_states", "the dense optimizer's state, per parameter")
    mixed = _engine_attribute("mixed", "whether the network computes in float16")
    compute_dtype = _engine_attribute("compute_dtype", "float16 when mixed, else float32")
    loss_scale = _engine_attribute("loss_scale", "the mixed-precision loss scale (else 1)")
    label_names = _engine_attribute("label_names", "the label tensors' names")
    label_dims = _engine_attribute("label_dims", "the label tensors' widths")
    dense_name = _engine_attribute("dense_name", "the dense input tensor's name")
    dense_dim = _engine_attribute("dense_dim", "the dense input's width")
    sparse_names = _engine_attribute("sparse_names", "the sparse inputs' names")

    # -- building ------------------------------------------------------------------------------

    def add(self, layer: Input | SparseEmbedding | DenseLayer | GroupDenseLayer) -> None:
        """Add an ``Input``, ``SparseEmbedding``, ``DenseLayer`` or ``GroupDenseLayer``."""
        if self._compiled:
            raise ConfigError("Model.add after compile: build the whole graph first")
        if isinstance(layer, Input):
            if self._input is not None:
                raise ConfigError("the model already has an Input layer")
            self._input = layer
        elif isinstance(layer, SparseEmbedding):
            self._embedding_dicts.append(layer.to_json())
        elif isinstance(layer, DenseLayer):
            self._dense_dicts.append(layer.to_json())
        elif isinstance(layer, GroupDenseLayer):
            self._dense_dicts.extend(layer.to_json_layers())
        else:
            raise ConfigError(f"Model.add takes Input, SparseEmbedding, DenseLayer or "
                              f"GroupDenseLayer, not {type(layer).__name__}")

    def _graph_dict(self) -> dict[str, Any]:
        if self._input is None:
            raise ConfigError("the model has no Input layer: add hugectr.Input first")
        return {
            "solver": self.solver.to_dict(),
            "optimizer": self.opt_params.to_dict(),
            "layers": [self._input.to_json(self.reader_params),
                       *(self._with_vocabulary(d) for d in self._embedding_dicts),
                       *self._dense_dicts],
        }

    def _with_vocabulary(self, layer: dict[str, Any]) -> dict[str, Any]:
        """The embedding layer as HugeCTR's graph_to_json writes it: with
        ``max_vocabulary_size_global``, the rows the workspace holds on each device times
        the devices (tools such as hugectr2onnx size their tables by it)."""
        from tierserve.trainer.embedding.table import max_rows_for_workspace

        hparam = dict(layer["sparse_embedding_hparam"])
        if "workspace_size_per_gpu_in_mb" not in hparam:
            return layer
        opt = (OptParamsPy.from_dict(layer["optimizer"]) if "optimizer" in layer
               else self.opt_params)
        rows = max_rows_for_workspace(hparam["workspace_size_per_gpu_in_mb"],
                                      hparam["embedding_vec_size"],
                                      make_optimizer(opt).num_state_copies)
        devices = self._dist.size if self._dist is not None else 1
        hparam["max_vocabulary_size_global"] = rows * devices
        return {**layer, "sparse_embedding_hparam": hparam}

    def compile(self, loss_names: list[str] | None = None,
                loss_weights: list[float] | None = None) -> None:
        """Check the graph, create the embedding tables, initialise the dense parameters and
        open the data readers.  ``loss_names`` / ``loss_weights`` weight the losses of a
        multi-task model (by the loss layers' top or label names; default weight 1)."""
        graph = Graph(**_split(self._graph_dict()))
        self._check_bottoms(graph)
        from tierserve.trainer.distributed import for_solver

        self._dist = for_solver(self.solver)  # None unless mpiexec started several ranks
        self.engine.build(
            graph, self._dense_dicts, self.solver, self.opt_params, self._dist,
            lambda spec, xp: adapters.make_table(spec, self._table_optimizer(spec), self.solver,
                                                 xp),
            loss_names, loss_weights)
        self._graph = graph
        self._compiled = True
        self._open_readers()
        if self._dist is not None:
            self._dist.attach(self)
        if self._etc_params is not None:
            from .etc import EmbeddingTrainingCache

            self._etc = EmbeddingTrainingCache(self, self._etc_params)
            if self.reader_params.keyset:
                self.set_source(self.reader_params.source, self.reader_params.keyset)

    def _check_bottoms(self, graph: Graph) -> None:
        produced = {s["top"] for s in graph.data_layer.get("sparse") or []}
        for layer in self._embedding_dicts:
            if layer["bottom"] not in produced:
                raise ConfigError(
                    f"SparseEmbedding {layer['name']!r}: bottom_name {layer['bottom']!r} is not a "
                    f"sparse input of the Input layer ({', '.join(sorted(produced)) or 'none'})"
                )

    def _table_optimizer(self, spec) -> OptParamsPy:
        """The embedding's own optimizer, else the model's (HugeCTR's rule)."""
        layer = next(d for d in self._embedding_dicts if d["name"] == spec.name)
        if "optimizer" in layer:
            return OptParamsPy.from_dict(layer["optimizer"])
        return self.opt_params

    def _require_compiled(self, what: str) -> None:
        if not self._compiled:
            raise ConfigError(f"Model.{what} needs a compiled model: call compile() first")

    # -- data ----------------------------------------------------------------------------------

    def _open_readers(self) -> None:
        p = self.reader_params
        sparse = self._input.sparse_params
        self._train_reader = adapters.make_reader(
            p, p.source, self.solver.batchsize, self._input, sparse, self.solver,
            repeat=self.solver.repeat_dataset)
        self._eval_reader = None
        if p.eval_source:
            self._eval_reader = adapters.make_reader(
                p, p.eval_source, self.solver.batchsize_eval, self._input, sparse, self.solver,
                repeat=self.solver.repeat_dataset, eval_mode=True)

    def get_data_reader_train(self):
        """The training data reader (``set_source``, ``is_eof``)."""
        self._require_compiled("get_data_reader_train")
        return self._train_reader

    def get_data_reader_eval(self):
        """The evaluation data reader (``set_source``, ``is_eof``)."""
        self._require_compiled("get_data_reader_eval")
        return self._eval_reader

    def start_data_reading(self) -> None:
        """Kept for HugeCTR scripts; readers start on first use."""
        self._require_compiled("start_data_reading")

    def set_source(self, source: Any = None, keyset: Any = None, eval_source: Any = None) -> None:
        """New training (and evaluation) sources for epoch-mode training."""
        self._require_compiled("set_source")
        if keyset and self._etc is not None:  # the ETC trains each file list's keyset in turn
            from .etc_keysets import KeysetReader

            sources = list(source) if isinstance(source, (list, tuple)) else [source]
            keysets = list(keyset) if isinstance(keyset, (list, tuple)) else [keyset]
            self._etc.set_sources(sources, keysets)
            inner = getattr(self._train_reader, "inner", self._train_reader)
            self._train_reader = KeysetReader(inner, self._etc)
            source = None
        elif keyset:
            from tierserve.core.compat import warn_once

            warn_once("Model.set_source.keyset", "keyset files are read only by the embedding "
                      "training cache (Model(..., etc=CreateETC(...))); this Model has none, so "
                      "they are not read")
        if source is not None:
            src = source[0] if isinstance(source, (list, tuple)) and len(source) == 1 else source
            self._train_reader.set_source(src)
        if eval_source is not None and self._eval_reader is not None:
            self._eval_reader.set_source(eval_source)

    # -- one step ------------------------------------------------------------------------------

    def train(self, is_first_batch: bool = True) -> bool:
        """One iteration on the next training batch; False when an epoch-mode source is
        exhausted (nothing is trained then).  ``is_first_batch`` is HugeCTR's hint for its
        overlapped pipeline's prefetch; each batch is read when it is trained here, so it
        changes nothing (in HugeCTR neither does it change what is trained)."""
        self._require_compiled("train")
        batch = self._train_reader.next_batch()
        if batch is None:
            return False
        self.engine.train_on(batch)
        return True

    def train_on_batch(self, batch) -> float:
        """One iteration on ``batch`` (a :class:`~tierserve.model.batch.Batch`) at the
        current learning rate; returns its loss.  A tierserve addition to HugeCTR's API, for
        callers that bring their own batches."""
        self._require_compiled("train_on_batch")
        self.engine.train_on(batch)
        return self.engine.loss

    def get_current_loss(self) -> float:
        """The loss of the last training iteration (regularization included)."""
        return self.engine.loss

    # -- learning rate -------------------------------------------------------------------------

    def get_learning_rate_scheduler(self):
        """The model's learning-rate scheduler (``get_next()``)."""
        return self._scheduler

    def set_learning_rate(self, lr: float) -> None:
        """The learning rate for the next iterations."""
        self.engine.lr = float(lr)

    def reset_learning_rate_scheduler(self, base_lr: float, warmup_steps: int = 1,
                                      decay_start: int = 0, decay_steps: int = 1,
                                      decay_power: float = 2.0, end_lr: float = 0.0) -> None:
        """A fresh scheduler with these settings (fine-tuning)."""
        self._scheduler.reset(base_lr, warmup_steps, decay_start, decay_steps, decay_power,
                              end_lr)
        self.engine.lr = float(base_lr)

    # -- evaluation ----------------------------------------------------------------------------

    def predict_batch(self, batch) -> np.ndarray:
        """Inference-mode probabilities ``[B, label_dim]`` for one batch (host numpy)."""
        self._require_compiled("predict_batch")
        return self.engine.predict_batch(batch)

    def check_out_tensor(self, tensor_name: str, tensor_type: Any = "Train") -> np.ndarray:
        """HugeCTR's ``check_out_tensor``: a host copy of tensor ``tensor_name`` (an input, an
        embedding's output or a layer's top) of the last training step (``Tensor_t.Train``)
        or the last evaluated batch (``Tensor_t.Evaluate``), ``[batch, ...]``."""
        kind = getattr(tensor_type, "value", tensor_type)
        tensors = self.engine.last_tensors.get(str(kind))
        if tensors is None:
            raise ConfigError(f"check_out_tensor: no {kind} step has run yet "
                              "(Tensor_t.Train after train/fit, Tensor_t.Evaluate after eval)")
        if tensor_name not in tensors:
            raise ConfigError(f"check_out_tensor: no tensor {tensor_name!r}; the {kind} step "
                              f"has {sorted(tensors)}")
        return np.asarray(to_numpy(tensors[tensor_name]), dtype=np.float32)

    def eval(self, is_first_batch: bool = True) -> bool:
        """Evaluate one batch of the evaluation source into the running metrics; False at the
        end of an epoch-mode source.  ``is_first_batch``: as in :meth:`train`."""
        self._require_compiled("eval")
        if self._eval_reader is None:
            raise ConfigError("no eval_source was given in DataReaderParams")
        batch = self._eval_reader.next_batch()
        if batch is None:
            return False
        pred, label, loss = self.engine.evaluate_batch(batch)
        self._metrics.update(label, pred, loss)
        self._last_eval = (pred, label)
        return True

    def get_eval_metrics(self) -> list[tuple[str, float]]:
        """The metrics of ``solver.metrics_spec`` over the batches evaluated since the last
        call, as HugeCTR's ``[(name, value), ...]``."""
        results = self._metrics.results()
        self._metrics.reset()
        return results

    def _evaluate(self) -> list[tuple[str, float]]:
        for _ in range(self.solver.max_eval_batches):
            if not self.eval():
                break
        if not self.solver.repeat_dataset and self._eval_reader is not None:
            self._eval_reader.set_source()
        return self.get_eval_metrics()

    def export_predictions(self, output_prediction_file_name: str,
                           output_label_file_name: str) -> None:
        """Append the last evaluated batch's predictions and labels to these text files, as
        HugeCTR writes them: every value (sample after sample, ``label_dim`` values each) as
        C++'s ``ostream << float`` prints it (``%g``: six significant digits), followed by a
        space; no newline, so the calls of a run make one line (``np.loadtxt`` reads a flat
        array)."""
        if self._last_eval is None:
            raise ConfigError("export_predictions: call eval() first")
        pred, label = self._last_eval
        for name, values in ((output_prediction_file_name, pred),
                             (output_label_file_name, label)):
            flat = np.asarray(values, dtype=np.float64).ravel()
            with open(name, "a") as f:
                f.write("".join(np.char.mod("%g ", flat).tolist()))

    # -- fit -----------------------------------------------------------------------------------

    def fit(self, num_epochs: int = 0, max_iter: int = 2000, display: int = 200,
            eval_interval: int = 1000, snapshot: int = 10000, snapshot_prefix: str = "",
            data_source_params: Any = None, *, update_source: Any = None,
            publish_interval: int = 0, repository: str | None = None, export_interval: int = 0,
            model_name: str | None = None) -> None:
        """Train for ``max_iter`` iterations (``repeat_dataset=True``) or ``num_epochs``
        epochs (``repeat_dataset=False``), showing a progress bar, printing the loss every
        ``display`` and the metrics every ``eval_interval`` iterations, and saving model files
        every ``snapshot`` iterations under ``snapshot_prefix``.  Stops early when an AUC
        threshold of ``metrics_spec`` is reached.

        Online learning (:mod:`tierserve.trainer.online`): with ``update_source`` (Kafka
        brokers or ``UpdateSourceParams``) the rows changed are published every
        ``publish_interval`` iterations, beside training; with ``repository`` a new version
        of the model is written there every ``export_interval`` iterations.  Both also happen
        at the end.  ``model_name`` is the served model's (default: the solver's)."""
        return fit_loop.fit(
            self, num_epochs, max_iter, display, eval_interval, snapshot, snapshot_prefix,
            data_source_params, update_source=update_source, publish_interval=publish_interval,
            repository=repository, export_interval=export_interval, model_name=model_name)

    def publish_updates(self, producer: Any, model_name: str | None = None) -> int:
        """Send the rows changed since the last call to Kafka through ``producer`` (an
        ``UpdateProducer`` or :class:`~tierserve.trainer.online.UpdatePublisher`), as the
        served model ``model_name`` (default: the solver's); returns the rows sent."""
        from tierserve.trainer.online import publish_updates

        return publish_updates(self, producer, model_name)

    # -- summary -------------------------------------------------------------------------------

    def summary(self) -> None:
        """Print each layer with its bottom and top tensors and output shapes."""
        self._require_compiled("summary")
        rows = [("Layer Type", "Input Name", "Output Name", "Output Shape")]
        shapes = self.network.shapes
        for name, dim in zip(self.label_names, self.label_dims):
            rows.append(("Input", "", name, f"(None, {dim})"))
        rows.append(("Input", "", self.dense_name, f"(None, {self.dense_dim})"))
        for spec in self.embedding_specs:
            rows.append((spec.type, spec.sparse_input, spec.name,
                         f"(None, {spec.slot_num}, {spec.embedding_vec_size})"))
        for layer in self.network.layers:
            outs = ", ".join("()" if layer.is_loss else
                             "(None, " + ", ".join(map(str, shapes[t])) + ")" for t in layer.top)
            rows.append((layer.type_name, ",".join(layer.bottom), ",".join(layer.top), outs))
        widths = [max(len(r[i]) for r in rows) for i in range(4)]
        line = "=" * (sum(widths) + 9)
        print(line)
        for k, r in enumerate(rows):
            print("  ".join(c.ljust(w) for c, w in zip(r, widths)))
            if k == 0:
                print("-" * (sum(widths) + 9))
        print(line)
        n = sum(int(np.prod(s)) for s in self.network.flat_param_shapes())
        print(f"dense parameters: {n:,}; embedding tables: {len(self.tables)}")

    # -- graph JSON ----------------------------------------------------------------------------

    def graph_to_json(self, graph_config_file: str) -> None:
        """Write the model graph (docs/formats.md, Files and messages 3), recorded in its folder's
        manifest."""
        if self._dist is not None and not self._dist.writes_files:
            return  # rank 0 writes the one graph of a multi-rank run
        save_graph_json(graph_config_file, self._graph_dict())
        manifest.record([graph_config_file])

    def construct_from_json(self, graph_config_file: str, include_dense_network: bool) -> None:
        """Rebuild the graph from a saved JSON: the Input and embedding layers, and the dense
        network too when ``include_dense_network``."""
        if self._compiled:
            raise ConfigError("construct_from_json must come before compile")
        graph = load_graph_json(graph_config_file)
        self._input = adapters.input_from_data_layer(graph.data_layer)
        self._embedding_dicts = [dict(layer) for layer in graph.layers_of_type(*EMBEDDING_TYPES)]
        if include_dense_network:
            self._dense_dicts = [dict(layer) for layer in graph.layers[1:]
                                 if layer["type"] not in EMBEDDING_TYPES]

    # -- model files ---------------------------------------------------------------------------

    def save_params_to_files(self, prefix: str, iter: int = 0) -> list[str]:  # noqa: A002
        """Write every table (``<prefix><i>_sparse_<iter>.model``) with its optimizer state,
        the dense weights (``<prefix>_dense_<iter>.model`` and ``.nontrainable``) and the
        dense optimizer state (``<prefix>_opt_dense_<iter>.model``); returns their paths."""
        return model_files.save_params_to_files(self, prefix, iter)

    def load_dense_weights(self, dense_model_file: str, data_source_params: Any = None) -> None:
        """Load the dense weights (and the ``.nontrainable`` state beside them, if present)."""
        return model_files.load_dense_weights(self, dense_model_file, data_source_params)

    def load_dense_optimizer_states(self, dense_opt_states_file: str,
                                    data_source_params: Any = None) -> None:
        """Load the dense optimizer state written by ``save_params_to_files``."""
        return model_files.load_dense_optimizer_states(
            self, dense_opt_states_file, data_source_params)

    def load_sparse_weights(self, sparse_embedding_files: Any,
                            data_source_params: Any = None) -> None:
        """Load tables from sparse model folders: a list (one per table, in order) or a dict
        by embedding name."""
        return model_files.load_sparse_weights(self, sparse_embedding_files, data_source_params)

    def load_sparse_optimizer_states(self, sparse_opt_states_files: Any,
                                     data_source_params: Any = None) -> None:
        """Load the tables' optimizer states: a list (one per table) or a dict by name."""
        return model_files.load_sparse_optimizer_states(
            self, sparse_opt_states_files, data_source_params)

    # -- freezing ------------------------------------------------------------------------------

    def freeze_dense(self) -> None:
        """Stop updating the dense weights."""
        self.engine.dense_frozen = True

    def unfreeze_dense(self) -> None:
        self.engine.dense_frozen = False

    def _embedding_names(self, name: str | None) -> list[str]:
        names = [d["name"] for d in self._embedding_dicts]
        if name is None:
            return names
        if name not in names:
            raise ConfigError(f"no embedding named {name!r} (embeddings: {names})")
        return [name]

    def freeze_embedding(self, embedding_name: str | None = None) -> None:
        """Stop updating all embedding tables, or the one named."""
        self._require_compiled("freeze_embedding")
        for name in self._embedding_names(embedding_name):
            self._table(name).freeze()

    def unfreeze_embedding(self, embedding_name: str | None = None) -> None:
        self._require_compiled("unfreeze_embedding")
        for name in self._embedding_names(embedding_name):
            self._table(name).unfreeze()

    def _table(self, name: str):
        return self.tables[[s.name for s in self.embedding_specs].index(name)]

    # -- incremental ---------------------------------------------------------------------------

    def get_incremental_model(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per table, ``(keys int64, vectors float32 [n, dim])`` of the rows updated since the
        last call."""
        self._require_compiled("get_incremental_model")
        return [adapters.incremental(t) for t in self.tables]

    # -- HugeCTR compatibility no-ops ----------------------------------------------------------

    def check_overflow(self) -> None:
        """Kept for HugeCTR scripts; tables grow up to their workspace and then raise."""

    def copy_weights_for_evaluation(self) -> None:
        """Kept for HugeCTR scripts; evaluation reads the training weights directly."""

    def get_embedding_training_cache(self):
        """The model's :class:`~tierserve.trainer.hugectr.etc.EmbeddingTrainingCache` (``update``)."""
        self._require_compiled("get_embedding_training_cache")
        if self._etc is None:
            raise ConfigError("get_embedding_training_cache: the model has no embedding "
                              "training cache; build it with Model(..., etc=hugectr.CreateETC("
                              "...))")
        return self._etc

    def dense_parameters(self) -> list[np.ndarray]:
        """The dense weights in dense-file order (host copies)."""
        return self.engine.dense_parameters()

    def graph(self) -> Graph:
        return Graph(**_split(self._graph_dict()))


def _split(data: dict[str, Any]) -> dict[str, Any]:
    return {"layers": data["layers"], "solver": data.get("solver", {}),
            "optimizer": data.get("optimizer", {})}


__all__ = ["Model"]
