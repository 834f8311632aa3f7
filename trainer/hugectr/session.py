"""HugeCTR's older, JSON-configured training API: ``solver_parser_helper``,
``get_learning_rate_scheduler(json)`` and ``Session``.

A ``Session`` is a thin wrapper of :class:`~tierserve.trainer.hugectr.model.Model`: the configuration
file (``{"solver", "optimizer", "layers"}``, the graph JSON ``Model.graph_to_json`` writes)
gives the data layer (format, sources, check), the optimizer and the layers; the
``SolverParser`` gives batch sizes, seed, devices and the files to start from.  The older
method names map onto the Model's (``download_params_to_files`` is ``save_params_to_files``,
``evaluation`` evaluates ``max_eval_batches`` batches and can export predictions and labels).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tierserve.core.errors import ConfigError
from tierserve.trainer.data.params import Check_t, DataReaderParams, DataReaderType_t
from tierserve.trainer.hugectr.model import Model
from tierserve.trainer.lr_scheduler import LearningRateScheduler
from tierserve.trainer.optimizers import OptParamsPy

from .solver import CreateSolver


@dataclass
class SolverParser:
    """What ``solver_parser_helper`` returns (HugeCTR's older ``SolverParser``)."""

    seed: int = 0
    max_eval_batches: int = 100
    batchsize_eval: int = 2048
    batchsize: int = 2048
    model_file: str = ""
    dense_opt_states_file: str = ""
    embedding_files: list = field(default_factory=list)
    sparse_opt_states_file: Any = field(default_factory=list)
    vvgpu: list = field(default_factory=lambda: [[0]])
    use_mixed_precision: bool = False
    enable_tf32_compute: bool = False
    scaler: float = 1.0
    i64_input_key: bool = False
    use_algorithm_search: bool = True
    use_cuda_graph: bool = True
    repeat_dataset: bool = True


def solver_parser_helper(**kwargs: Any) -> SolverParser:
    """HugeCTR's ``solver_parser_helper``: keyword arguments, HugeCTR's defaults."""
    unknown = sorted(set(kwargs) - set(SolverParser.__dataclass_fields__))
    if unknown:
        raise ConfigError(f"solver_parser_helper got unknown arguments {unknown}")
    parser = SolverParser(**kwargs)
    if isinstance(parser.embedding_files, (str, os.PathLike)):
        parser.embedding_files = [os.fspath(parser.embedding_files)]
    if isinstance(parser.sparse_opt_states_file, (str, os.PathLike)):
        parser.sparse_opt_states_file = [os.fspath(parser.sparse_opt_states_file)]
    return parser


def _config(path: str | os.PathLike) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ConfigError(f"configuration file {path} does not exist") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"configuration file {path} is not valid JSON: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("layers"), list):
        raise ConfigError(f"configuration file {path} has no 'layers' list")
    return data


_SCHEDULE = ("lr", "warmup_steps", "decay_start", "decay_steps", "decay_power", "end_lr")


def get_learning_rate_scheduler(configure_file: str | os.PathLike) -> LearningRateScheduler:
    """HugeCTR's module-level ``get_learning_rate_scheduler``: the schedule of the JSON
    file's ``solver`` clause (``lr``, ``warmup_steps``, ``decay_start``, ``decay_steps``,
    ``decay_power``, ``end_lr``; HugeCTR's defaults where absent)."""
    solver = _config(configure_file).get("solver") or {}
    defaults = dict(lr=0.001, warmup_steps=1, decay_start=0, decay_steps=1, decay_power=2.0,
                    end_lr=0.0)
    values = {k: solver.get(k, defaults[k]) for k in _SCHEDULE}
    return LearningRateScheduler(float(values["lr"]), int(values["warmup_steps"]),
                                 int(values["decay_start"]), int(values["decay_steps"]),
                                 float(values["decay_power"]), float(values["end_lr"]))


def _data_reader_params(config: dict[str, Any], path) -> DataReaderParams:
    data = next((layer for layer in config["layers"] if layer.get("type") == "Data"), None)
    if data is None:
        raise ConfigError(f"configuration file {path} has no Data layer")
    source = data.get("source")
    if not source:
        raise ConfigError(f"configuration file {path}: the Data layer names no 'source'")
    return DataReaderParams(
        data_reader_type=DataReaderType_t(data.get("format", "Norm")),
        source=source,
        eval_source=data.get("eval_source", ""),
        check_type=Check_t(data.get("check", "Sum")),
        num_samples=int(data.get("num_samples", 0)),
        eval_num_samples=int(data.get("eval_num_samples", 0)),
        float_label_dense=bool(data.get("float_label_dense", False)),
        slot_size_array=list(data.get("slot_size_array", []) or []),
    )


class Session:
    """HugeCTR's older ``Session(solver_config, config_file, use_model_oversubscriber=False,
    temp_embedding_dir='')``; see the module docstring.

    ``use_model_oversubscriber``: the model oversubscriber loaded a keyset's share of a table
    onto the GPU.  Here every table lives in host memory, so ``get_model_oversubscriber()``
    returns an object whose ``update(keyset_file)`` checks that the keyset files exist and
    otherwise has nothing to do; training reads and writes the same rows either way.
    """

    def __init__(self, solver_config: SolverParser, config_file: str | os.PathLike,
                 use_model_oversubscriber: bool = False, temp_embedding_dir: str = "") -> None:
        config = _config(config_file)
        clause = config.get("solver") or {}
        sp = solver_config
        solver = CreateSolver(
            model_name=str(clause.get("model_name", "")),
            seed=sp.seed, max_eval_batches=sp.max_eval_batches,
            batchsize_eval=sp.batchsize_eval, batchsize=sp.batchsize, vvgpu=sp.vvgpu,
            use_mixed_precision=sp.use_mixed_precision,
            enable_tf32_compute=sp.enable_tf32_compute, scaler=sp.scaler,
            i64_input_key=sp.i64_input_key, use_algorithm_search=sp.use_algorithm_search,
            use_cuda_graph=sp.use_cuda_graph, repeat_dataset=sp.repeat_dataset,
            **{k: clause[k] for k in _SCHEDULE if k in clause},
        )
        self.solver_config = sp
        self.model = Model(solver, _data_reader_params(config, config_file),
                           OptParamsPy.from_dict(config.get("optimizer") or {"type": "Adam"}))
        self.model.construct_from_json(str(config_file), True)
        self.model.compile()
        if sp.model_file:
            self.model.load_dense_weights(sp.model_file)
        if sp.dense_opt_states_file:
            self.model.load_dense_optimizer_states(sp.dense_opt_states_file)
        if sp.embedding_files:
            self.model.load_sparse_weights(list(sp.embedding_files))
        if sp.sparse_opt_states_file:
            self.model.load_sparse_optimizer_states(list(sp.sparse_opt_states_file))
        self._oversubscriber = ModelOversubscriber() if use_model_oversubscriber else None
        self.temp_embedding_dir = temp_embedding_dir

    # -- the older names --------------------------------------------------------------------

    def get_model_oversubscriber(self) -> ModelOversubscriber:
        """The model oversubscriber (see the class docstring); only with
        ``use_model_oversubscriber=True``, as in HugeCTR."""
        if self._oversubscriber is None:
            raise ConfigError("get_model_oversubscriber needs Session(..., "
                              "use_model_oversubscriber=True)")
        return self._oversubscriber

    def get_data_reader_train(self):
        return self.model.get_data_reader_train()

    def get_data_reader_eval(self):
        return self.model.get_data_reader_eval()

    def start_data_reading(self) -> None:
        self.model.start_data_reading()

    def set_learning_rate(self, lr: float) -> None:
        self.model.set_learning_rate(lr)

    def train(self) -> bool:
        """One iteration; False at the end of the data in epoch mode."""
        return self.model.train()

    def get_current_loss(self) -> float:
        return self.model.get_current_loss()

    def check_overflow(self) -> None:
        self.model.check_overflow()

    def copy_weights_for_evaluation(self) -> None:
        self.model.copy_weights_for_evaluation()

    def eval(self) -> bool:
        return self.model.eval()

    def get_eval_metrics(self) -> list[tuple[str, float]]:
        return self.model.get_eval_metrics()

    def evaluation(self, export_predictions_out_file: str | None = None,
                   export_labels_out_file: str | None = None) -> list[tuple[str, float]]:
        """Evaluate ``max_eval_batches`` batches from the start of the eval source and return
        the metrics; the predictions and labels of those batches go to the files when given
        (appended, every value followed by a space, as ``Model.export_predictions`` does)."""
        if (export_predictions_out_file is None) != (export_labels_out_file is None):
            raise ConfigError("evaluation: give both export_predictions_out_file and "
                              "export_labels_out_file, or neither")
        reader = self.model.get_data_reader_eval()
        if reader is not None and hasattr(reader, "set_source"):
            reader.set_source()
        for _ in range(self.solver_config.max_eval_batches):
            if not self.model.eval():
                break
            if export_predictions_out_file is not None:
                self.model.export_predictions(export_predictions_out_file,
                                              export_labels_out_file)
        return self.model.get_eval_metrics()

    def download_params_to_files(self, prefix: str, iter: int = 0) -> None:  # noqa: A002
        """``Model.save_params_to_files``: sparse, dense and optimizer files under ``prefix``."""
        self.model.save_params_to_files(prefix, iter)


class ModelOversubscriber:
    """HugeCTR's ``ModelOversubscriber``: whole tables stay in host memory here, so an
    ``update`` has no rows to move; it checks the keyset files it is given exist."""

    def update(self, keyset_file: str | list[str]) -> None:
        files = [keyset_file] if isinstance(keyset_file, (str, os.PathLike)) else keyset_file
        for f in files:
            if not os.path.exists(f):
                raise ConfigError(f"keyset file {f} does not exist")
