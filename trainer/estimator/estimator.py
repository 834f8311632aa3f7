"""``Estimator``: train, evaluate, predict and export a ``model_fn``'s model (as
``tf.estimator.Estimator``), on the trainer's layers, optimizers and embedding tables.

``model_fn(features, labels, mode[, params][, config])`` is called once per mode, on the
first batch (its arrays give the raw features' shapes), and builds a graph of the trainer's
layers (:mod:`.graph`); each batch then runs through that graph (:mod:`.program`).

TensorFlow's semantics where they matter: ``train(steps=n)`` adds n steps,
``train(max_steps=n)`` trains up to global step n (nothing when a checkpoint is already there)
and either stops early when the input ends; an ``input_fn`` that returns arrays (not a
dataset) repeats that one batch while training and gives it once to ``evaluate`` and
``predict``; ``evaluate`` and ``predict`` read the newest checkpoint of ``model_dir``.

Under ``mpiexec -n N`` (construct the Estimator on every rank) ``train``, ``evaluate`` and
``train_and_evaluate`` run on the N ranks: :mod:`tierserve.trainer.estimator.distributed`.
"""

from __future__ import annotations

import logging
import os
import re
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from tierserve.core.errors import ConfigError, InvalidInputError
from tierserve.trainer.graph.tensors import (
    LABEL,
    FeatureTensor,
    Graph,
    LabelTensor,
    building,
)

from . import checkpoint as ckpt
from . import loops
from .fetches import _accepts, _as_batch, _sample, check_labels
from .hooks import (
    CheckpointSaverHook,
    SessionRunHook,
)
from .optimizers import TrainOp, group
from .program import Program
from .run_config import RunConfig
from .spec import EstimatorSpec, ModeKeys
from .variables import StructureError, VariableStore

log = logging.getLogger("tierserve.trainer.estimator")


class WarmStartSettings:
    """Initialise variables matching ``vars_to_warm_start`` (a regex) from another model's
    checkpoint (a model_dir or a checkpoint file) when training starts from scratch."""

    def __init__(self, ckpt_to_initialize_from: str | os.PathLike,
                 vars_to_warm_start: str = ".*", var_name_to_vocab_info: Any = None,
                 var_name_to_prev_var_name: dict[str, str] | None = None) -> None:
        if var_name_to_vocab_info:
            raise ConfigError("WarmStartSettings: var_name_to_vocab_info is not supported")
        self.ckpt_to_initialize_from = os.fspath(ckpt_to_initialize_from)
        self.vars_to_warm_start = vars_to_warm_start
        self.var_name_to_prev_var_name = dict(var_name_to_prev_var_name or {})


class _Overridable:
    """A read-only view of attribute ``source`` that an instance may replace by assigning
    (a non-data descriptor): ``Estimator.run_config`` is the config, and DLRover's adaptors
    set their own ``self.run_config`` before calling ``Estimator.__init__``."""

    def __init__(self, source: str) -> None:
        self.source = source

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        return self if obj is None else getattr(obj, self.source)


class Estimator:
    """See the module docstring.  ``model_dir`` None: a temporary directory."""

    def __init__(self, model_fn: Callable | None = None,
                 model_dir: str | os.PathLike | None = None, config: RunConfig | None = None,
                 params: dict | None = None, warm_start_from: Any = None) -> None:
        if model_fn is None and type(self).model_fn is not Estimator.model_fn:
            model_fn = self.model_fn  # a subclass's model_fn method (adaptors)
        if model_fn is None or not callable(model_fn):
            raise ConfigError("Estimator: model_fn must be a function "
                              "model_fn(features, labels, mode[, params][, config])")
        config = config if config is not None else RunConfig()
        if not isinstance(config, RunConfig):
            raise ConfigError(f"Estimator: config must be a RunConfig, got {type(config)}")
        if model_dir is not None and config.model_dir is not None and os.path.abspath(
                os.fspath(model_dir)) != os.path.abspath(config.model_dir):
            raise ConfigError(f"Estimator: model_dir {os.fspath(model_dir)!r} differs from "
                              f"config.model_dir {config.model_dir!r}")
        model_dir = model_dir if model_dir is not None else config.model_dir
        if model_dir is None:
            model_dir = tempfile.mkdtemp(prefix="tierserve-estimator-")
            log.warning("Using temporary folder as model directory: %s", model_dir)
        self._model_dir = os.fspath(model_dir)
        self._config = config.replace(model_dir=self._model_dir)
        self._model_fn_impl = model_fn
        self._params = dict(params or {})
        from tierserve.trainer.estimator.distributed import for_estimator

        # under mpiexec with several ranks: how this rank takes part (None: one process)
        self._dist = for_estimator()
        seed = self._config.tf_random_seed or 0
        self._store = VariableStore(seed) if self._dist is None else self._dist.store(seed)
        # evaluate's metric merge over the ranks (set on the distributed run's copy)
        self._gather_eval: Callable | None = None
        self._programs: dict[Any, Program] = {}
        self._loaded: str | None = None
        self._loaded_signature: dict[str, Any] = {}
        self._warm_start = warm_start_from
        self._warm_started = False
        self._last_saved_step: int | None = None
        self._summary: dict[str, Any] = {}

    # -- properties ------------------------------------------------------------------------

    @property
    def model_dir(self) -> str:
        return self._model_dir

    @property
    def config(self) -> RunConfig:
        return self._config

    run_config = _Overridable("_config")

    @property
    def params(self) -> dict:
        return dict(self._params)

    @property
    def model_fn(self) -> Callable:
        return self._model_fn_impl

    # -- graph building --------------------------------------------------------------------

    def _call_model_fn(self, features, labels, mode) -> EstimatorSpec:
        fn = self._model_fn_impl
        kwargs: dict[str, Any] = {}
        if _accepts(fn, "mode"):
            kwargs["mode"] = mode
        if _accepts(fn, "params"):
            kwargs["params"] = self._params
        elif self._params:
            raise ConfigError("Estimator: params were given but model_fn takes no params")
        if _accepts(fn, "config"):
            kwargs["config"] = self._config
        spec = fn(features, labels, **kwargs)
        if not isinstance(spec, EstimatorSpec):
            raise ConfigError(f"model_fn must return an EstimatorSpec, got {type(spec).__name__}")
        return spec

    def _build_graph(self, mode: str, features: dict, labels: Any) -> tuple[Graph, Any, Any]:
        """``(graph, spec, label_dim)`` of the model_fn called in ``mode`` on ``features``
        (arrays or samples); no variable is made."""
        graph = Graph(mode)
        graph.features = {k: FeatureTensor(k, _sample(v)) for k, v in features.items()}
        label_tensor = None
        label_dim = None
        if labels is not None:
            arr = np.asarray(labels)
            label_dim = int(np.prod(arr.shape[1:])) if arr.ndim > 1 else 1
            graph.shapes[LABEL] = (label_dim,)
            label_tensor = LabelTensor(graph, LABEL, (label_dim,), arr.shape[1:])
            graph.label = label_tensor
        with building(graph):
            spec = self._call_model_fn(graph.features, label_tensor, mode)
        if spec.mode != mode:
            raise ConfigError(f"model_fn returned an EstimatorSpec for mode {spec.mode!r} when "
                              f"called with {mode!r}")
        return graph, spec, label_dim

    def _program(self, mode: str, features: dict, labels: Any) -> Program:
        key = (mode, tuple(sorted(map(str, features))), labels is not None)
        prog = self._programs.get(key)
        if prog is not None:
            return prog
        graph, spec, label_dim = self._build_graph(mode, features, labels)
        train_ops: list[TrainOp] = group(spec.train_op) if mode == ModeKeys.TRAIN else []
        loss = spec.loss if labels is not None else None
        try:
            prog = Program(graph, self._store, train_ops, loss, label_dim)
            if self._loaded is not None:
                self._check_checkpoint_structure(prog, mode)
        except StructureError as exc:
            if "model_dir" in str(exc):
                raise
            raise StructureError(
                f"model_dir {self._model_dir!r} holds checkpoints of a model with a different "
                f"structure ({exc}). Pick a new model_dir (or delete this one) to train the "
                "changed model.") from None
        prog.spec = spec  # type: ignore[attr-defined]
        self._programs[key] = prog
        if not self._warm_started and self._loaded is None and self._warm_start is not None:
            self._apply_warm_start()
        return prog

    def _check_checkpoint_structure(self, prog: Program, mode: str) -> None:
        sig = self._loaded_signature
        saved_dense = sig.get("dense", {})
        for names, arrays in zip(prog.param_names, prog.params):
            for n, a in zip(names, arrays):
                if n not in saved_dense:
                    raise StructureError(f"variable {n} of this model is not in the checkpoint")
                if list(a.shape) != saved_dense[n]:
                    raise StructureError(f"variable {n} has shape {saved_dense[n]} in the "
                                         f"checkpoint, {list(a.shape)} in this model")
        if mode == ModeKeys.TRAIN:
            used = {n for names in prog.param_names for n in names}
            extra = sorted(set(saved_dense) - used)
            if extra:
                raise StructureError(f"the checkpoint has variables this model lacks: "
                                     f"{', '.join(extra[:5])}")
        saved_tables = sig.get("tables", {})
        for group_, _table, _op in prog.tables:
            info = self._store.table_info[group_.table]
            saved = saved_tables.get(group_.table)
            if saved is None or saved["dim"] != info.dim or saved["columns"] != info.columns:
                raise StructureError(f"embedding table {group_.table} ({info.columns}, "
                                     f"dimension {info.dim}) differs from the checkpoint's "
                                     f"{saved}")

    # -- checkpoints -----------------------------------------------------------------------

    def latest_checkpoint(self) -> str | None:
        path = ckpt.latest_checkpoint(self._model_dir)
        return None if path is None else str(path)

    def _restore(self, checkpoint_path: str | os.PathLike | None = None) -> None:
        path = Path(checkpoint_path) if checkpoint_path else ckpt.latest_checkpoint(
            self._model_dir)
        if path is None:
            return
        if self._loaded == str(path) and self._store.global_step == ckpt.step_of(path):
            return
        data = ckpt.load(path)
        import json

        meta = json.loads(bytes(np.asarray(data["meta"], dtype=np.uint8)).decode())
        self._store.load_arrays(data, f"model_dir {self._model_dir!r} (checkpoint "
                                      f"{path.name})")
        self._loaded = str(path)
        self._loaded_signature = meta["signature"]
        for prog in self._programs.values():  # tables were rebuilt: rebind
            prog._bind_tables()

    def _save(self, directory: str | None = None, basename: str = "model.ckpt") -> Path:
        directory = directory or self._model_dir
        if self._dist is not None:  # every rank's rows, written by the chief
            path = self._dist.save(self, directory, basename)
        else:
            path = ckpt.save(directory, self._store.arrays(), self._store.global_step,
                             self._config.keep_checkpoint_max, basename)
        if os.path.abspath(directory) == os.path.abspath(self._model_dir):
            self._loaded = str(path)
            self._loaded_signature = self._store.signature()
            self._last_saved_step = self._store.global_step
        log.info("Saving checkpoints for %d into %s.", self._store.global_step, path)
        return path

    def _apply_warm_start(self) -> None:
        self._warm_started = True
        ws = self._warm_start
        if isinstance(ws, (str, os.PathLike)):
            ws = WarmStartSettings(ws)
        if not isinstance(ws, WarmStartSettings):
            raise ConfigError(f"warm_start_from must be a path or WarmStartSettings, got {ws!r}")
        source = Path(ws.ckpt_to_initialize_from)
        path = ckpt.latest_checkpoint(source) if source.is_dir() else source
        if path is None or not Path(path).exists():
            raise ConfigError(f"warm_start_from: no checkpoint at {source}")
        data = ckpt.load(path)
        pattern = re.compile(ws.vars_to_warm_start)
        rename = {v: k for k, v in ws.var_name_to_prev_var_name.items()}
        warmed = 0
        for key, value in data.items():
            kind, _, name = key.partition("/")
            name = rename.get(name, name)
            pool = {"dense": self._store.dense, "state": self._store.state}.get(kind)
            if pool is None or not pattern.match(name) or name not in pool:
                continue
            if pool[name].shape == value.shape:
                pool[name][...] = value
                warmed += 1
        tables: dict[str, dict[str, np.ndarray]] = {}
        for key, value in data.items():
            if key.startswith("table/"):
                _, tname, rest = key.split("/", 2)
                if not rest.startswith("opt/"):
                    tables.setdefault(tname, {})[rest] = value
        for tname, arrays in tables.items():
            table = self._store.tables.get(tname)
            info = self._store.table_info.get(tname)
            names = [tname, *(info.display if info else [])]
            if table is not None and any(pattern.match(n) for n in names) and arrays[
                    "values"].shape[1:] == (table.dim,):
                self._store._load_table(table, arrays)
                warmed += 1
        log.info("Warm-started %d variables from %s", warmed, path)

    # -- input -----------------------------------------------------------------------------

    def _call_input_fn(self, input_fn: Any, mode: str, input_context: Any = None) -> Any:
        if not callable(input_fn):
            return input_fn
        kwargs: dict[str, Any] = {}
        if input_context is not None:
            kwargs["input_context"] = input_context
        if _accepts(input_fn, "params"):
            kwargs["params"] = self._params
        if _accepts(input_fn, "config"):
            kwargs["config"] = self._config
        if _accepts(input_fn, "mode"):
            kwargs["mode"] = mode
        return input_fn(**kwargs)

    def _batches(self, input_fn: Any, mode: str, repeat_single: bool
                 ) -> Iterator[tuple[dict, Any]]:
        if self._dist is not None:  # this rank's share
            yield from self._dist.batches(self, input_fn, mode, repeat_single)
            return
        from tierserve.trainer.estimator.distributed import InputContext, takes_input_context

        # an input_fn that reads its share (input_context) is the only one in one process
        context = InputContext() if takes_input_context(input_fn) else None
        yield from self._input_batches(self._call_input_fn(input_fn, mode, context),
                                       repeat_single)

    def _input_batches(self, result: Any, repeat_single: bool) -> Iterator[tuple[dict, Any]]:
        """The batches an input_fn's return value stands for."""
        from ..data.iterator import stream_of

        stream = stream_of(result)  # get_next() values: the rest of the iterator's pass
        single = _as_batch(result) if stream is None else None
        if single is not None:
            while True:  # arrays, not a dataset: TensorFlow's constant tensors
                yield single
                if not repeat_single:
                    return
        from .inputs import batches

        for item in batches(result) if stream is None else stream:
            batch = _as_batch(item)
            if batch is None:
                raise InvalidInputError(
                    "each element of the input_fn's dataset must be (features dict, labels) or "
                    f"a features dict; got {type(item).__name__}")
            yield batch

    def _labels_for(self, labels: Any) -> Any:
        if labels is None:
            return None
        return check_labels(self._prepare_labels(labels))[0]

    def _prepare_labels(self, labels: Any) -> Any:
        """Labels as the model's loss takes them (pre-made heads map and check them)."""
        return labels

    # -- train -----------------------------------------------------------------------------

    def train(self, input_fn: Any, hooks: list[SessionRunHook] | None = None,
              steps: int | None = None, max_steps: int | None = None,
              saving_listeners: list | None = None) -> Estimator:
        """Train on ``input_fn``'s batches: ``steps`` more steps, or up to global step
        ``max_steps``, or (neither) until the input ends."""
        loops.train(self, input_fn, hooks, steps, max_steps, saving_listeners)
        return self

    def _saver_hook(self, listeners) -> SessionRunHook:
        c = self._config
        if c.save_checkpoints_steps is None and c.save_checkpoints_secs is None:
            hook = CheckpointSaverHook(self._model_dir, save_secs=10 ** 12,
                                       listeners=listeners)
        elif c.save_checkpoints_steps is not None:
            hook = CheckpointSaverHook(self._model_dir, save_steps=c.save_checkpoints_steps,
                                       listeners=listeners)
        else:
            hook = CheckpointSaverHook(self._model_dir, save_secs=c.save_checkpoints_secs,
                                       listeners=listeners)
        return hook if self._dist is None else self._dist.saver_hook(hook)

    def _writer(self, name: str):
        if not self._config.save_summary_steps or not self._config.is_chief:
            return None
        from ..summary import SummaryWriter

        logdir = self._model_dir if name == "train" else os.path.join(self._model_dir, name)
        writer = self._summary.get(logdir)
        if writer is None:
            writer = self._summary[logdir] = SummaryWriter(logdir)
        return writer

    def _close_writer(self, writer) -> None:
        """Close (so every event is on disk when train or evaluate returns); the next call
        opens a new event file in the same folder, which TensorBoard reads as one run."""
        writer.close()
        self._summary = {k: w for k, w in self._summary.items() if w is not writer}

    def _check_head_labels(self, prog: Program, labels: Any) -> None:
        check = getattr(prog.spec, "label_check", None)
        if check is not None:
            check(labels)

    # -- evaluate --------------------------------------------------------------------------

    def evaluate(self, input_fn: Any, steps: int | None = None,
                 hooks: list[SessionRunHook] | None = None,
                 checkpoint_path: str | None = None, name: str | None = None
                 ) -> dict[str, Any]:
        """Metrics over ``input_fn``'s batches (``steps`` of them at most): ``loss`` (mean of
        the batch losses), ``average_loss`` (per example), ``global_step`` and the model's
        ``eval_metric_ops``."""
        if steps is not None and int(steps) <= 0:
            raise ConfigError(f"evaluate: steps must be positive, got {steps}")
        if self._dist is not None:  # each rank its share, metrics over all of them
            return self._dist.evaluate(self, input_fn, steps, hooks, checkpoint_path, name)
        return loops.evaluate(self, input_fn, steps, hooks, checkpoint_path, name)

    # -- predict ---------------------------------------------------------------------------

    def predict(self, input_fn: Any, predict_keys: str | list[str] | None = None,
                hooks: list[SessionRunHook] | None = None,
                checkpoint_path: str | None = None, yield_single_examples: bool = True
                ) -> Iterator[Any]:
        """Predictions for ``input_fn``'s features: a dict per example (a value when the
        model_fn's predictions is one tensor), only ``predict_keys`` when given.  Under
        mpiexec each rank predicts what its input_fn gives, from the newest checkpoint."""
        if self._dist is not None:
            yield from self._dist.twin(self).predict(input_fn, predict_keys, hooks,
                                                     checkpoint_path, yield_single_examples)
            return
        if isinstance(predict_keys, str):
            predict_keys = [predict_keys]
        yield from loops.predict(self, input_fn, predict_keys, hooks, checkpoint_path,
                                 yield_single_examples)

    # -- variables -------------------------------------------------------------------------

    def get_variable_names(self) -> list[str]:
        """Every variable's name (dense, non-trainable, each column's embedding weights,
        ``global_step``), from the newest checkpoint."""
        if self._dist is not None:
            return self._dist.twin(self).get_variable_names()
        self._restore()
        names = set(self._store.dense) | set(self._store.state) | {"global_step"}
        for info in self._store.table_info.values():
            names.update(info.display)
        return sorted(names)

    def get_variable_value(self, name: str) -> np.ndarray:
        """A variable's value; a column's embedding weights as the full
        ``[num_buckets, dimension]`` matrix (ids never trained: their initial vectors)."""
        if self._dist is not None:  # the whole table, from the newest checkpoint
            return self._dist.twin(self).get_variable_value(name)
        self._restore()
        if name == "global_step":
            return np.asarray(self._store.global_step, dtype=np.int64)
        for pool in (self._store.dense, self._store.state):
            if name in pool:
                return np.array(pool[name])
        for tname, info in self._store.table_info.items():
            if name in info.display:
                return self._column_weights(tname, info, info.display.index(name))
        raise InvalidInputError(f"no variable named {name!r} (see get_variable_names())")

    def _column_weights(self, tname: str, info, slot: int) -> np.ndarray:
        off, n = info.offsets[slot], info.buckets[slot]
        keys = np.arange(off, off + n, dtype=np.int64)
        table = self._store.tables.get(tname)
        if table is None:  # checkpointed, not built in this process yet
            data = self._store._pending[tname]
            stored = np.asarray(data["keys"], dtype=np.int64)
            order = np.argsort(stored)
            pos = np.clip(np.searchsorted(stored[order], keys), 0, max(len(stored) - 1, 0))
            out = np.zeros((n, info.dim), np.float32)
            if len(stored):
                hit = stored[order][pos] == keys
                out[hit] = np.asarray(data["values"])[order[pos[hit]]]
            return out
        from tierserve.model.device import to_numpy

        rows = to_numpy(table._index.lookup(table.xp.asarray(keys)))
        values = to_numpy(table.values)
        out = to_numpy(table.initial_rows(table.xp.asarray(keys)))
        hit = rows >= 0
        out[hit] = values[rows[hit]]
        return out

    # -- HybridBackend ---------------------------------------------------------------------

    def train_and_evaluate(self, train_spec: Any, eval_spec: Any,
                           eval_every_n_iter: int | None = None) -> tuple[dict, list]:
        """HybridBackend's ``Estimator.train_and_evaluate``: train to ``train_spec.max_steps``
        evaluating every ``eval_every_n_iter`` steps (else as ``eval_spec`` throttles)."""
        from .training import train_and_evaluate

        return train_and_evaluate(self, train_spec, eval_spec,
                                  eval_every_n_iter=eval_every_n_iter)

    # -- export ----------------------------------------------------------------------------

    def export_saved_model(self, export_dir_base: str | os.PathLike,
                           serving_input_receiver_fn: Callable, assets_extra: Any = None,
                           as_text: bool = False, checkpoint_path: str | None = None,
                           experimental_mode: str = ModeKeys.PREDICT,
                           model_name: str | None = None) -> bytes:
        """Write the model as a new numbered version of a tierserve model repository
        (``export_dir_base/<model_name>/<n>/`` and ``export_dir_base/ps.json``), which
        ``tierserve serve --model-repository export_dir_base`` serves; returns the version
        folder's path (bytes, as TensorFlow)."""
        from .export import export_model

        if self._dist is not None:  # on the chief, from the newest checkpoint
            return self._dist.export(self, export_dir_base, serving_input_receiver_fn,
                                     assets_extra=assets_extra, as_text=as_text,
                                     checkpoint_path=checkpoint_path,
                                     experimental_mode=experimental_mode, model_name=model_name)
        if as_text or experimental_mode != ModeKeys.PREDICT:
            raise ConfigError("export_saved_model: as_text and experimental_mode are not "
                              "supported (the export is a graph JSON of the PREDICT graph)")
        return export_model(self, export_dir_base, serving_input_receiver_fn,
                            checkpoint_path=checkpoint_path, model_name=model_name,
                            assets_extra=assets_extra)

    export_savedmodel = export_saved_model
