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
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from tierserve.core.errors import ConfigError
from tierserve.trainer.data.params import Check_t, DataReaderParams, DataReaderType_t
from tierserve.trainer.hugectr.model import Model
from tierserve.trainer.lr_scheduler import LearningRateScheduler
from tierserve.trainer.optimizers import OptParamsPy

from .solver import Solver, like_solver, solver_from_clause


@dataclass
class SolverParser:
    """What ``solver_parser_helper`` returns (HugeCTR's older ``SolverParser``): solver
    settings, whose defaults are :class:`~tierserve.trainer.hugectr.solver.Solver`'s, and the files a
    :class:`Session` starts from (:data:`FILES`)."""

    seed: int = like_solver("seed")
    max_eval_batches: int = like_solver("max_eval_batches")
    batchsize_eval: int = like_solver("batchsize_eval")
    batchsize: int = like_solver("batchsize")
    model_file: str = ""
    dense_opt_states_file: str = ""
    embedding_files: list = field(default_factory=list)
    sparse_opt_states_file: Any = field(default_factory=list)
    vvgpu: list = like_solver("vvgpu")
    use_mixed_precision: bool = like_solver("use_mixed_precision")
    enable_tf32_compute: bool = like_solver("enable_tf32_compute")
    scaler: float = like_solver("scaler")
    i64_input_key: bool = like_solver("i64_input_key")
    use_algorithm_search: bool = like_solver("use_algorithm_search")
    use_cuda_graph: bool = like_solver("use_cuda_graph")
    repeat_dataset: bool = like_solver("repeat_dataset")

    def solver(self, clause: dict[str, Any] | None = None) -> Solver:
        """The :class:`Solver` these settings give over a graph JSON's ``"solver"`` clause
        (which gives the rest: ``model_name``, the learning-rate schedule, ``metrics_spec``;
        where both give a setting, this object's wins, as in HugeCTR)."""
        given = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in FILES}
        return solver_from_clause(clause, **given)


#: The fields of :class:`SolverParser` that are not solver settings: the files a Session
#: loads, each with the Model method that loads it.
FILES = {
    "model_file": "load_dense_weights",
    "dense_opt_states_file": "load_dense_optimizer_states",
    "embedding_files": "load_sparse_weights",
    "sparse_opt_states_file": "load_sparse_optimizer_states",
}


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


def get_learning_rate_scheduler(configure_file: str | os.PathLike) -> LearningRateScheduler:
    """HugeCTR's module-level ``get_learning_rate_scheduler``: the schedule of the JSON
    file's ``solver`` clause (``lr``, ``warmup_steps``, ``decay_start``, ``decay_steps``,
    ``decay_power``, ``end_lr``; the solver's defaults where absent)."""
    from .adapters import make_scheduler

    return make_scheduler(solver_from_clause(_config(configure_file).get("solver")))


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
        sp = solver_config
        self.solver_config = sp
        self.model = Model(sp.solver(config.get("solver")),
                           _data_reader_params(config, config_file),
                           OptParamsPy.from_dict(config.get("optimizer") or {"type": "Adam"}))
        self.model.construct_from_json(str(config_file), True)
        self.model.compile()
        for name, load in FILES.items():
            files = getattr(sp, name)
            if files:
                getattr(self.model, load)(list(files) if isinstance(files, (list, tuple)) else files)
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
        for _ in range(self.model.solver.max_eval_batches):  # as Model's own evaluation
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
