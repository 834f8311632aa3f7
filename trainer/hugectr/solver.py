"""``CreateSolver``: the training resources and task settings of a HugeCTR model.

:class:`Solver` declares every solver setting and its default once.  The other ways HugeCTR
gives the same settings convert into it: the older ``solver_parser_helper`` (its
``SolverParser`` takes its defaults from here, see :func:`like_solver`) and a graph JSON's
``"solver"`` clause (:func:`solver_from_clause`: the keys :meth:`Solver.to_dict` writes, and
HugeCTR's older JSON spellings).
"""

from __future__ import annotations

import enum
import typing
from dataclasses import MISSING, asdict, dataclass, field
from typing import Any

from tierserve.core.errors import ConfigError


class LrPolicy_t(enum.Enum):  # noqa: N801 - HugeCTR's name
    fixed = "fixed"


class DeviceLayout(enum.Enum):
    LocalFirst = "LocalFirst"
    NODE_FIRST = "NODE_FIRST"


class AllReduceAlgo(enum.Enum):
    OneShot = "OneShot"
    NCCL = "NCCL"


_SCALERS = (1.0, 128.0, 256.0, 512.0, 1024.0)


@dataclass
class Solver:
    """What ``CreateSolver`` returns; fields and defaults are HugeCTR's.

    Used here: ``model_name``, ``seed``, the learning-rate schedule (``lr``, ``warmup_steps``,
    ``decay_start``, ``decay_steps``, ``decay_power``, ``end_lr``), ``max_eval_batches``,
    ``batchsize_eval``, ``batchsize``, ``vvgpu`` (one device per process; under ``mpiexec``
    one per rank, see :mod:`tierserve.trainer.distributed.devices`), ``repeat_dataset``,
    ``use_mixed_precision`` and ``scaler`` (float16 compute with loss scaling on a GPU; the
    CPU computes in float32 and ignores them), ``metrics_spec``, ``i64_input_key``.
    Not honoured, each warns once when given (:data:`NOT_HONOURED` says what happens
    instead): more than one device in ``vvgpu`` in a single process, and the CUDA- and
    MLPerf-specific switches
    ``enable_tf32_compute``, ``use_algorithm_search``, ``use_cuda_graph``, ``device_layout``,
    ``use_holistic_cuda_graph``, ``use_overlapped_pipeline``, ``all_reduce_algo``,
    ``grouped_all_reduce``, ``num_iterations_statistics``, ``is_dlrm``.
    """

    model_name: str = ""
    seed: int = 0
    lr_policy: LrPolicy_t = LrPolicy_t.fixed
    lr: float = 0.001
    warmup_steps: int = 1
    decay_start: int = 0
    decay_steps: int = 1
    decay_power: float = 2.0
    end_lr: float = 0.0
    max_eval_batches: int = 100
    batchsize_eval: int = 2048
    batchsize: int = 2048
    vvgpu: list = field(default_factory=lambda: [[0]])
    repeat_dataset: bool = True
    use_mixed_precision: bool = False
    enable_tf32_compute: bool = False
    scaler: float = 1.0
    metrics_spec: dict = field(default_factory=dict)
    i64_input_key: bool = False
    use_algorithm_search: bool = True
    use_cuda_graph: bool = True
    device_layout: DeviceLayout = DeviceLayout.LocalFirst
    use_holistic_cuda_graph: bool = False
    use_overlapped_pipeline: bool = False
    all_reduce_algo: AllReduceAlgo = AllReduceAlgo.NCCL
    grouped_all_reduce: bool = False
    num_iterations_statistics: int = 20
    is_dlrm: bool = False

    def to_dict(self) -> dict[str, Any]:
        """The graph JSON's ``"solver"`` object."""
        out = {}
        for key, value in asdict(self).items():
            if isinstance(value, enum.Enum):
                value = value.name
            if key == "metrics_spec":
                value = {getattr(k, "name", str(k)): float(v) for k, v in self.metrics_spec.items()}
            out[key] = value
        return out


def solver_default(name: str) -> Any:
    """The default of solver setting ``name`` (a fresh copy of a list or dict)."""
    spec = Solver.__dataclass_fields__[name]
    return spec.default_factory() if spec.default is MISSING else spec.default


def like_solver(name: str) -> Any:
    """A dataclass field whose default is the solver setting ``name``'s, for the other
    parameter objects that carry a solver setting (HugeCTR's ``SolverParser``)."""
    spec = Solver.__dataclass_fields__[name]
    if spec.default is MISSING:
        return field(default_factory=spec.default_factory)
    return field(default=spec.default)


#: HugeCTR's older JSON spellings of solver settings (its ``SolverParser(file)``), read by
#: :func:`_old_spellings` into the settings they give.
OLD_SPELLINGS = ("mixed_precision", "input_key_type", "gpu", "eval_metrics", "algorithm_search",
                 "cuda_graph", "max_eval_samples")  # fmt: skip


def _old_spellings(clause: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if "mixed_precision" in clause:  # the loss scale; mixed precision on
        out.update(use_mixed_precision=True, scaler=float(clause["mixed_precision"]))
    if "input_key_type" in clause:
        kind = clause["input_key_type"]
        if kind not in ("I64", "I32"):
            raise ConfigError(f"solver clause: input_key_type is {kind!r}; give I64 or I32")
        out["i64_input_key"] = kind == "I64"
    if "gpu" in clause:
        gpus = clause["gpu"]
        out["vvgpu"] = gpus if gpus and isinstance(gpus[0], list) else [list(gpus)]
    if "eval_metrics" in clause:
        from tierserve.trainer.metrics import MetricsType

        spec = {}
        for metric in clause["eval_metrics"]:
            name, _, value = str(metric).partition(":")
            if name not in MetricsType.__members__:
                raise ConfigError(f"solver clause: eval_metrics names {name!r}; known: "
                                  f"{sorted(MetricsType.__members__)}")
            spec[MetricsType[name]] = float(value) if value else (
                1.0 if name == "AUC" else 0.0)  # fmt: skip
        out["metrics_spec"] = spec
    for old, new in (("algorithm_search", "use_algorithm_search"),
                     ("cuda_graph", "use_cuda_graph")):  # fmt: skip
        if old in clause:
            out[new] = bool(clause[old])
    if "max_eval_samples" in clause:
        if "max_eval_batches" in clause:
            raise ConfigError("solver clause: give max_eval_batches or max_eval_samples, "
                              "not both")
        batch = int(clause.get("batchsize_eval", solver_default("batchsize_eval")))
        out["max_eval_batches"] = int(clause["max_eval_samples"]) // batch
    return out


#: The older JSON's keys for HugeCTR's own training loop (``huge_ctr --train``); a script
#: drives the loop here, so they warn once when a clause gives them.
LOOP_KEYS = ("display", "max_iter", "num_epochs", "snapshot", "snapshot_prefix",
             "eval_interval", "dense_model_file", "sparse_model_file", "dense_opt_states_file",
             "sparse_opt_states_file", "export_predictions_prefix")  # fmt: skip


def _from_json(name: str, value: Any) -> Any:
    """A setting as :meth:`Solver.to_dict` writes it, back in :class:`Solver`'s types."""
    kind = typing.get_type_hints(Solver)[name]
    if isinstance(kind, type) and issubclass(kind, enum.Enum) and isinstance(value, str):
        if value not in kind.__members__:
            raise ConfigError(f"solver clause: {name} is {value!r}; known: "
                              f"{list(kind.__members__)}")
        return kind[value]
    if name == "metrics_spec" and isinstance(value, dict):
        from tierserve.trainer.metrics import MetricsType

        return {MetricsType[k] if isinstance(k, str) else k: float(v) for k, v in value.items()}
    return value


def solver_from_clause(clause: dict[str, Any] | None, **given: Any) -> Solver:
    """The :class:`Solver` of a graph JSON's ``"solver"`` clause, ``given`` settings over it
    (validated by :func:`CreateSolver`): the keys :meth:`Solver.to_dict` writes, and HugeCTR's
    older spellings (``mixed_precision``, ``input_key_type``, ``gpu``, ``eval_metrics``,
    ``algorithm_search``, ``cuda_graph``, ``max_eval_samples``).  The older JSON's keys of its
    own training loop (:data:`LOOP_KEYS`) warn once; any other key is refused."""
    clause = dict(clause or {})
    names = Solver.__dataclass_fields__
    settings = {k: _from_json(k, v) for k, v in clause.items() if k in names}
    # Model.graph_to_json writes every setting: a default says nothing (and must not warn as
    # a switch that was given)
    settings = {k: v for k, v in settings.items() if v != solver_default(k)}
    settings.update(_old_spellings(clause))
    loop = sorted(k for k in clause if k in LOOP_KEYS)
    unknown = sorted(set(clause) - set(names) - set(OLD_SPELLINGS) - set(LOOP_KEYS))
    if unknown:
        raise ConfigError(f"solver clause has unknown keys {unknown}")
    if loop:
        from tierserve.core.compat import warn_once

        warn_once(f"solver clause {', '.join(loop)}", "the script's own loop decides "
                  "iterations, display, evaluation, snapshots and files", stacklevel=3)
    settings.update(given)
    return CreateSolver(**settings)


#: Solver switches that have no effect here, and what happens instead (warned once when given).
NOT_HONOURED = {
    "enable_tf32_compute": "matrix products run in float32 (numpy/cupy default precision)",
    "use_algorithm_search": "no cuBLAS algorithm search; numpy/cupy pick the GEMM kernels",
    "use_cuda_graph": "no CUDA graphs; each layer runs as its own numpy/cupy calls (same values)",
    "device_layout": "one device, so no device map",
    "use_holistic_cuda_graph": "no CUDA graphs (MLPerf option)",
    "use_overlapped_pipeline": "the bottom MLP and the embeddings run one after the other",
    "all_reduce_algo": "one device, so no all-reduce",
    "grouped_all_reduce": "one device, so no all-reduce",
    "num_iterations_statistics": "no hybrid embedding statistics (MLPerf option)",
}


def _warn_not_honoured(kwargs: dict[str, Any], solver: Solver) -> None:
    from tierserve.core.compat import warn_once

    for name, instead in NOT_HONOURED.items():
        if name in kwargs:
            warn_once(f"CreateSolver.{name}", instead, stacklevel=4)
    devices = [d for node in solver.vvgpu for d in (node if isinstance(node, list) else [node])]
    from tierserve.trainer.distributed.comm import launched_size

    if len(devices) > 1 and launched_size() == 1:  # under mpiexec each rank is one device
        warn_once("CreateSolver.vvgpu", f"training runs on one device, the first of "
                  f"vvgpu ({devices[0]}), not on {len(devices)}; the batch is not split",
                  stacklevel=4)


def CreateSolver(**kwargs: Any) -> Solver:  # noqa: N802 - HugeCTR's name
    """HugeCTR's ``CreateSolver``: every argument is keyword-only, defaults are HugeCTR's.

    ``metrics_spec`` defaults to ``{MetricsType.AUC: 1.0}``; an AUC value below 1 stops
    ``Model.fit`` once evaluation reaches it.
    """
    names = Solver.__dataclass_fields__
    unknown = sorted(set(kwargs) - set(names))
    if unknown:
        raise ConfigError(f"CreateSolver got unknown arguments {unknown}")
    solver = Solver(**kwargs)
    if solver.batchsize < 1 or solver.batchsize_eval < 1:
        raise ConfigError(
            f"batchsize and batchsize_eval must be positive, got {solver.batchsize}, "
            f"{solver.batchsize_eval}"
        )
    if solver.max_eval_batches < 1:
        raise ConfigError(f"max_eval_batches must be positive, got {solver.max_eval_batches}")
    if solver.lr <= 0:
        raise ConfigError(f"lr must be positive, got {solver.lr}")
    if getattr(solver.lr_policy, "name", solver.lr_policy) != LrPolicy_t.fixed.name:
        raise ConfigError(f"lr_policy must be LrPolicy_t.fixed (HugeCTR's one policy; the "
                          f"schedule is lr, warmup_steps, decay_*), got {solver.lr_policy!r}")
    solver.lr_policy = LrPolicy_t.fixed
    if solver.use_mixed_precision and float(solver.scaler) not in _SCALERS:
        raise ConfigError(f"scaler must be one of {_SCALERS[1:]} with mixed precision")
    if "metrics_spec" not in kwargs or not solver.metrics_spec:
        from tierserve.trainer.metrics import MetricsType

        solver.metrics_spec = {MetricsType.AUC: 1.0}
    if solver.warmup_steps < 0 or solver.decay_start < 0 or solver.decay_steps < 1:
        raise ConfigError("warmup_steps and decay_start must be >= 0, decay_steps >= 1")
    _warn_not_honoured(kwargs, solver)
    if solver.is_dlrm:
        from tierserve.core.compat import warn_once

        warn_once("CreateSolver.is_dlrm", "HugeCTR's MLPerf optimisations are not used here",
                  stacklevel=3)
    return solver
