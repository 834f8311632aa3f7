"""Export an Estimator's model into a tierserve model repository, and the serving-input
pieces (``tf.estimator.export``'s names).

``export_saved_model(export_dir_base, serving_input_receiver_fn)`` writes version ``n`` (the
next number) of model ``<name>`` as ``export_dir_base/<name>/<n>/``:

- ``<name>.json``: the graph the ``model_fn`` built in PREDICT mode, as the trainer's graph
  JSON (Data, one ``DistributedSlotSparseEmbeddingHash`` per embedding table, the dense
  layers), ending in a ``MeanSquaredErrorLoss`` over the served tensor, whose prediction is
  that tensor unchanged;
- ``<name>_dense_<step>.model`` (+ ``.nontrainable``) and ``<name><i>_sparse_<step>.model/``
  (the rows training created; an id never trained reads the table's default 0, as
  ``Estimator.predict`` reads it);
- ``serving_input.spec``: how raw features become the request (JSON; see
  :func:`encode_request`);

and adds or replaces the model's entry in ``export_dir_base/ps.json``, so
``tierserve serve --model-repository export_dir_base`` serves it with no conversion.

The request (KServe v2): ``DES`` FP32 ``[B, dense_width]``, the model's numeric, bucketized
(one-hot) and indicator (multi-hot) columns side by side in the spec's order; ``CATCOLUMN``
INT64 ``[B, slots]``, one id per slot (an embedding or linear column's id plus its slot's
offset), tables in order; or, when a row has no id or several, the keys flattened with
``ROWINDEX`` INT32 (per table, ``B * slots + 1`` row pointers; at most 16 ids per column of
an example).  ``OUTPUT0`` FP32
``[B, width]``: the served tensor (a binary classifier's probability, a regressor's
prediction, a multi-class classifier's probabilities).  :func:`encode_request` computes the
inputs from raw features with the exported spec.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tierserve.core.compat import warn_once
from tierserve.core.errors import ConfigError, InvalidInputError
from tierserve.model import manifest
from tierserve.model.dense_file import NONTRAINABLE_SUFFIX, write_dense_file
from tierserve.model.graph_json import save_graph_json
from tierserve.model.version_folder import new_version, version_numbers, write_ps_entry
from tierserve.ps.update_replay import STAMP
from tierserve.trainer.graph.tensors import DENSE, LABEL, Tensor

from .layer_types import EXPORT_LOSS
from .spec import ModeKeys

SPEC_FILE = "serving_input.spec"
#: The most ids a request may give one column of one example (the server's per-row limit).
MAX_IDS_PER_SLOT = 16


# -- serving input ---------------------------------------------------------------------------


@dataclass
class Placeholder:
    """A serving input: dtype and shape (``None`` for the batch dimension)."""

    dtype: Any
    shape: tuple | None = None
    name: str | None = None
    sparse: bool = False

    def sample(self) -> np.ndarray:
        kind = np.dtype(_np_dtype(self.dtype)).kind
        shape = [1] + [int(d or 1) for d in (self.shape or (None,))[1:]]
        if kind in "USO":
            return np.full(shape, "", dtype=object)
        return np.zeros(shape, dtype=_np_dtype(self.dtype))


def _np_dtype(dtype: Any) -> Any:
    dtype = getattr(dtype, "as_numpy_dtype", dtype)
    if dtype in (str, "string", "str", bytes):
        return np.str_
    return dtype


def placeholder(dtype: Any, shape: Any = None, name: str | None = None) -> Placeholder:
    """``tf.placeholder``: a dense serving input."""
    return Placeholder(dtype, tuple(shape) if shape is not None else None, name)


def sparse_placeholder(dtype: Any, shape: Any = None, name: str | None = None) -> Placeholder:
    """``tf.sparse_placeholder``: a serving input with any number of values per example."""
    return Placeholder(dtype, tuple(shape) if shape is not None else None, name, sparse=True)


class ServingInputReceiver:
    """What a serving input function returns: the ``features`` the model reads and the
    ``receiver_tensors`` a request gives (here both name raw features)."""

    def __init__(self, features: Any, receiver_tensors: Any,
                 receiver_tensors_alternatives: Any = None) -> None:
        if not isinstance(features, dict):
            features = {"feature": features}
        if not isinstance(receiver_tensors, dict):
            receiver_tensors = {"input": receiver_tensors}
        self.features = dict(features)
        self.receiver_tensors = dict(receiver_tensors)
        self.receiver_tensors_alternatives = receiver_tensors_alternatives


def build_raw_serving_input_receiver_fn(features: dict, default_batch_size: int | None = None
                                        ) -> Callable[[], ServingInputReceiver]:
    """A serving input function taking ``features`` (placeholders or example arrays) raw."""
    def fn() -> ServingInputReceiver:
        placeholders = {k: v if isinstance(v, Placeholder) else placeholder(
            np.asarray(v).dtype, (None, *np.asarray(v).shape[1:]), k)
            for k, v in features.items()}
        return ServingInputReceiver(placeholders, placeholders)

    return fn


def build_parsing_serving_input_receiver_fn(feature_spec: dict,
                                            default_batch_size: int | None = None
                                            ) -> Callable[[], ServingInputReceiver]:
    """A serving input function for the features of ``feature_spec``
    (``feature_column.make_parse_example_spec``): each one a raw serving input."""
    def fn() -> ServingInputReceiver:
        placeholders = {k: placeholder(v if v is not None else np.float32, (None,), k)
                        for k, v in feature_spec.items()}
        return ServingInputReceiver(placeholders, {"examples": placeholders})

    return fn


class PredictOutput:
    """The tensor (or the first of a dict's tensors) a served model returns."""

    def __init__(self, outputs: Any) -> None:
        self.outputs = outputs

    def tensor(self) -> Any:
        if isinstance(self.outputs, dict):
            return next(iter(self.outputs.values()))
        return self.outputs


class ClassificationOutput(PredictOutput):
    def __init__(self, scores: Any = None, classes: Any = None) -> None:
        if scores is None:
            raise ConfigError("ClassificationOutput: scores are needed (classes alone cannot "
                              "be served)")
        super().__init__(scores)


class RegressionOutput(PredictOutput):
    def __init__(self, value: Any) -> None:
        super().__init__(value)


# -- exporting -------------------------------------------------------------------------------


def _served_tensor(spec: Any) -> Tensor:
    outs = spec.export_outputs or {}
    if outs:
        out = outs.get("serving_default") or next(iter(outs.values()))
        t = out.tensor() if isinstance(out, PredictOutput) else out
    else:
        preds = spec.predictions
        if isinstance(preds, Tensor):
            t = preds
        else:
            for key in ("logistic", "probabilities", "predictions"):
                if key in preds and isinstance(preds[key], Tensor):
                    t = preds[key]
                    break
            else:
                tensors = [v for v in preds.values() if isinstance(v, Tensor)]
                if len(tensors) != 1:
                    raise ConfigError(
                        "export: the model_fn's predictions hold several tensors "
                        f"({', '.join(preds)}); name the one to serve with export_outputs="
                        "{'serving_default': PredictOutput(tensor)}")
                t = tensors[0]
    if not isinstance(t, Tensor):
        raise ConfigError(f"export: the served output must be a graph tensor, got {t!r}")
    return t


def _model_name(estimator: Any, model_name: str | None) -> str:
    name = model_name or os.path.basename(os.path.normpath(estimator.model_dir)) or "model"
    name = re.sub(r"[^A-Za-z0-9_-]", "_", name)[:100] or "model"
    return name


def _receiver_samples(serving_input_receiver_fn: Callable) -> tuple[Any, dict]:
    receiver = serving_input_receiver_fn()
    if not isinstance(receiver, ServingInputReceiver):
        raise ConfigError("serving_input_receiver_fn must return a ServingInputReceiver, got "
                          f"{type(receiver).__name__}")
    samples = {k: v.sample() if isinstance(v, Placeholder) else np.asarray(v)[:1]
               for k, v in receiver.features.items()}
    return receiver, samples


def _receiver_error(exc: InvalidInputError) -> ConfigError:
    return ConfigError("export: " + str(exc).replace(
        "which the input_fn does not provide", "which the serving input receiver does "
        "not give"))


def _check_served_graph(graph, receiver, what: str) -> None:
    """Refuse a PREDICT graph tierserve could not serve from this receiver's features."""
    missing = sorted(graph.used_features - set(receiver.features))
    if missing:
        raise ConfigError(f"{what}: the model reads features {missing}, which the serving "
                          f"input receiver does not give ({', '.join(sorted(receiver.features))})")
    if graph.weighted:
        raise ConfigError(
            f"{what}: weighted categorical column {graph.weighted[0].column.name!r} cannot be "
            "served (requests carry no per-id weights); export a model without it")
    if not graph.groups:
        raise ConfigError(f"{what}: the model has no embedding table (no categorical column); "
                          "tierserve serves models with at least one: add an embedding or "
                          "indicator column of a categorical feature, or train without an "
                          "exporter")


def check_servable(estimator: Any, serving_input_receiver_fn: Callable) -> None:
    """Refuse, before training, a model whose export tierserve could not serve (no embedding
    table, a weighted column, a feature the receiver does not give): the model_fn is called
    once in PREDICT mode on the receiver's samples; no variable is made."""
    receiver, samples = _receiver_samples(serving_input_receiver_fn)
    try:
        graph, _, _ = estimator._build_graph(ModeKeys.PREDICT, samples, None)
    except InvalidInputError as exc:
        raise _receiver_error(exc) from None
    _check_served_graph(graph, receiver, "export (checked before training)")


def export_model(estimator: Any, export_dir_base: str | os.PathLike,
                 serving_input_receiver_fn: Callable, checkpoint_path: str | None = None,
                 model_name: str | None = None, assets_extra: Any = None,
                 max_batch_size: int = 1024, current: bool = False) -> bytes:
    """See the module docstring; returns the new version folder (bytes path).

    ``current``: export the variables as they are in memory (mid-training: the online hook,
    :mod:`.online`), not the newest checkpoint; the version is then stamped with the time
    its rows were read (``tierserve.created``, :mod:`tierserve.ps.update_replay`).
    """
    if assets_extra:
        raise ConfigError("export_saved_model: assets_extra is not supported")
    if not current:
        estimator._restore(checkpoint_path)
    receiver, samples = _receiver_samples(serving_input_receiver_fn)
    try:
        prog = estimator._program(ModeKeys.PREDICT, samples, None)
    except InvalidInputError as exc:
        raise _receiver_error(exc) from None
    graph, spec = prog.graph, prog.spec
    _check_served_graph(graph, receiver, "export")
    out = _served_tensor(spec)
    width = out.width
    for piece in graph.dense_pieces:
        col = getattr(piece.column, "source_column", piece.column)
        if getattr(col, "normalizer_fn", None) is not None:
            warn_once(f"normalizer_fn of {col.name!r}", "the served model takes the "
                      "normalised values in DES: apply the function before sending "
                      "(encode_request(..., normalizers=...))")
    name = _model_name(estimator, model_name)
    base = Path(export_dir_base)
    model_root = base / name
    with new_version(model_root) as (version, staging):
        if current:  # by the clock that stamps the update messages, before the rows are read
            (staging / STAMP).write_text(f"{int(time.time() * 1000)}\n")
        graph_path, dense_path, sparse_paths = _write_version(
            staging, name, estimator, prog, graph, out, width, max_batch_size
        )
    target = model_root / str(version)
    _write_ps_json(base, name, version, graph, graph_path.name, dense_path.name,
                   [p.name for p in sparse_paths], width, max_batch_size)
    return os.fsencode(str(target))


def _write_version(staging: Path, name: str, estimator, prog, graph, out, width: int,
                   max_batch_size: int) -> tuple[Path, Path, list[Path]]:
    """The graph, dense file, sparse folders and serving spec of an export, in ``staging``."""
    step = estimator._store.global_step
    layers = [_data_layer(graph, width)]
    for group in graph.groups:
        layers.append({
            "name": group.table, "type": "DistributedSlotSparseEmbeddingHash",
            "bottom": f"{group.table}_keys", "top": group.table,
            "sparse_embedding_hparam": {
                "workspace_size_per_gpu_in_mb": prog.store.tables[group.table]
                .workspace_size_per_gpu_in_mb,
                "embedding_vec_size": group.dim, "combiner": group.combiner}})
    for layer in graph.layers:
        layer = dict(layer)
        if layer["type"] in EXPORT_LOSS:
            layer["type"] = EXPORT_LOSS[layer["type"]]
            layer["bottom"] = layer["bottom"][:2]
            layer.pop("reduction", None)
        layers.append(layer)
    layers.append({"name": "served_output", "type": "MeanSquaredErrorLoss",
                   "bottom": [out.name, LABEL], "top": "served_output_loss"})
    graph_path = staging / f"{name}.json"
    save_graph_json(graph_path, {"solver": {"max_eval_batches": 1, "batchsize_eval":
                                            max_batch_size},
                                 "optimizer": {}, "layers": layers})
    dense_path = staging / f"{name}_dense_{step}.model"
    write_dense_file(dense_path, [p for ps in prog.params for p in ps])
    write_dense_file(str(dense_path) + NONTRAINABLE_SUFFIX,
                     [s for ss in prog.states for s in ss])
    sparse_paths = []
    for i, group in enumerate(graph.groups):
        folder = staging / f"{name}{i}_sparse_{step}.model"
        prog.store.tables[group.table].save(folder)
        sparse_paths.append(folder)
    spec_path = staging / SPEC_FILE
    spec_path.write_text(json.dumps(_serving_spec(graph, out), indent=1) + "\n")
    manifest.record([graph_path, dense_path, Path(str(dense_path) + NONTRAINABLE_SUFFIX),
                     *sparse_paths, spec_path])
    return graph_path, dense_path, sparse_paths


def _data_layer(graph, label_dim: int) -> dict:
    return {
        "name": "data", "type": "Data",
        "label": {"top": LABEL, "label_dim": int(label_dim)},
        "dense": {"top": DENSE, "dense_dim": int(graph.dense_width)},
        "sparse": [{"top": f"{g.table}_keys", "type": "DistributedSlot",
                    "max_feature_num_per_sample": MAX_IDS_PER_SLOT * g.slot_num,
                    "nnz_per_slot": 1,
                    "is_fixed_length": False, "slot_num": g.slot_num} for g in graph.groups],
    }


def _serving_spec(graph, out: Tensor) -> dict:
    return {
        "format": 1,
        "DES": [{"offset": p.offset, "width": p.width, "column": p.column.config()}
                for p in graph.dense_pieces],
        "dense_width": graph.dense_width,
        "CATCOLUMN": [{"table": g.table, "combiner": g.combiner, "dim": g.dim,
                       "slots": [{"offset": off, "column": c.config()}
                                 for off, c in zip(g.offsets, g.columns)]}
                      for g in graph.groups],
        "OUTPUT0": {"tensor": out.name, "width": out.width},
    }


def _write_ps_json(base: Path, name: str, version: int, graph, graph_file: str,
                   dense_file: str, sparse_files: list[str], label_dim: int,
                   max_batch_size: int) -> None:
    write_ps_entry(base, {
        "model": name,
        "sparse_files": [f"{name}/{version}/{s}" for s in sparse_files],
        "dense_file": f"{name}/{version}/{dense_file}",
        "network_file": f"{name}/{version}/{graph_file}",
        "max_batch_size": int(max_batch_size),
        "default_value_for_each_table": [0.0] * len(sparse_files),
        "maxnum_des_feature_per_sample": int(graph.dense_width),
        "maxnum_catfeature_query_per_table_per_sample": [MAX_IDS_PER_SLOT * g.slot_num
                                                         for g in graph.groups],
        "embedding_vecsize_per_table": [g.dim for g in graph.groups],
        "embedding_table_names": [g.table for g in graph.groups],
        "gpucache": False,
        "label_dim": int(label_dim),
        "slot_num": sum(g.slot_num for g in graph.groups),
    })


# -- requests from raw features ----------------------------------------------------------------


def column_from_config(cfg: dict, normalizers: dict | None = None) -> Any:
    """Rebuild a feature column from its exported config."""
    from .. import feature_column as fc

    kind = cfg["type"]
    if kind == "numeric":
        fn = None
        if cfg.get("normalizer_fn"):
            fn = (normalizers or {}).get(cfg["key"])
            if fn is None:
                raise ConfigError(
                    f"numeric column {cfg['key']!r} was normalised by {cfg['normalizer_fn']} "
                    f"in training; pass normalizers={{{cfg['key']!r}: function}}")
        return fc.numeric_column(cfg["key"], tuple(cfg["shape"]), cfg.get("default_value"),
                                 normalizer_fn=fn)
    if kind == "bucketized":
        return fc.bucketized_column(column_from_config(cfg["source"], normalizers),
                                    cfg["boundaries"])
    if kind == "identity":
        return fc.categorical_column_with_identity(cfg["key"], cfg["num_buckets"],
                                                   cfg.get("default_value"))
    if kind == "vocabulary":
        return fc.categorical_column_with_vocabulary_list(
            cfg["key"], cfg["vocabulary"], default_value=cfg["default_value"],
            num_oov_buckets=cfg["num_oov_buckets"])
    if kind == "hash_bucket":
        return fc.categorical_column_with_hash_bucket(cfg["key"], cfg["hash_bucket_size"])
    if kind == "crossed":
        keys = [k if isinstance(k, str) else column_from_config(k, normalizers)
                for k in cfg["keys"]]
        return fc.crossed_column(keys, cfg["hash_bucket_size"], cfg.get("hash_key") or None)
    if kind == "indicator":
        return fc.indicator_column(column_from_config(cfg["categorical"], normalizers))
    raise ConfigError(f"serving spec: unknown column type {kind!r}")


def encode_request(version_dir: str | os.PathLike, features: dict,
                   normalizers: dict | None = None) -> dict[str, np.ndarray]:
    """The KServe v2 inputs (``DES``, ``CATCOLUMN`` and, when needed, ``ROWINDEX``) of raw
    ``features`` for the model exported in ``version_dir``."""
    from tierserve.trainer.graph.tensors import SparseGroup

    from .program import batch_size_of, group_keys

    spec = json.loads((Path(version_dir) / SPEC_FILE).read_text())
    b = batch_size_of(features, None)
    des = np.zeros((b, spec["dense_width"]), np.float32)
    for piece in spec["DES"]:
        col = column_from_config(piece["column"], normalizers)
        des[:, piece["offset"]:piece["offset"] + piece["width"]] = col.dense(features)
    sparse = []
    for table in spec["CATCOLUMN"]:
        cols = [column_from_config(s["column"], normalizers) for s in table["slots"]]
        group = SparseGroup(table=table["table"], columns=cols,
                            offsets=[s["offset"] for s in table["slots"]], dim=table["dim"],
                            combiner=table["combiner"], optimizer_scope="")
        sparse.append(group_keys(group, features, b))
    one_hot = all(np.array_equal(s.row_offsets, np.arange(len(s.row_offsets)))
                  for s in sparse)  # exactly one key in every row of every table
    if one_hot:
        cat = np.concatenate([s.keys.reshape(b, s.slot_num) for s in sparse], axis=1)
        return {"DES": des, "CATCOLUMN": cat.astype(np.int64)}
    return {"DES": des, "CATCOLUMN": np.concatenate([s.keys for s in sparse]).astype(np.int64),
            "ROWINDEX": np.concatenate([s.row_offsets for s in sparse]).astype(np.int32)}


# -- exporters for EvalSpec ------------------------------------------------------------------


class Exporter:
    """Exports after an evaluation (``EvalSpec(exporters=...)``)."""

    def __init__(self, name: str, serving_input_receiver_fn: Callable,
                 exports_to_keep: int | None = 5) -> None:
        if not re.fullmatch(r"[A-Za-z0-9_-]+", str(name)):
            raise ConfigError(f"exporter name {name!r}: letters, digits, _ and - only")
        self.name = str(name)
        self.serving_input_receiver_fn = serving_input_receiver_fn
        self.exports_to_keep = exports_to_keep

    def _export(self, estimator, export_path: str) -> bytes:
        out = export_model(estimator, export_path, self.serving_input_receiver_fn,
                           model_name=self.name)
        if self.exports_to_keep:
            root = Path(export_path) / self.name
            versions = version_numbers(root)
            for v in versions[: -self.exports_to_keep]:
                shutil.rmtree(root / str(v), ignore_errors=True)
        return out

    def export(self, estimator, export_path, checkpoint_path, eval_result,
               is_the_final_export):
        raise NotImplementedError


class LatestExporter(Exporter):
    """Exports after every evaluation, keeping the newest ``exports_to_keep`` versions."""

    def export(self, estimator, export_path, checkpoint_path, eval_result,
               is_the_final_export):
        return self._export(estimator, export_path)


def _loss_smaller(best_eval_result: dict, current_eval_result: dict) -> bool:
    return current_eval_result["loss"] < best_eval_result["loss"]


class BestExporter(Exporter):
    """Exports when an evaluation beats the best so far (``compare_fn(best, current)``;
    default: a smaller ``loss``)."""

    def __init__(self, name: str = "best_exporter", serving_input_receiver_fn: Callable = None,
                 event_file_pattern: str | None = None, compare_fn: Callable = _loss_smaller,
                 assets_extra: Any = None, as_text: bool = False, exports_to_keep: int = 5
                 ) -> None:
        if serving_input_receiver_fn is None:
            raise ConfigError("BestExporter: serving_input_receiver_fn is needed")
        super().__init__(name, serving_input_receiver_fn, exports_to_keep)
        self.compare_fn = compare_fn
        self.best: dict | None = None

    def export(self, estimator, export_path, checkpoint_path, eval_result,
               is_the_final_export):
        if self.best is None or self.compare_fn(self.best, eval_result):
            self.best = dict(eval_result)
            return self._export(estimator, export_path)
        return None


class FinalExporter(Exporter):
    """Exports once, after the final evaluation."""

    def export(self, estimator, export_path, checkpoint_path, eval_result,
               is_the_final_export):
        return self._export(estimator, export_path) if is_the_final_export else None


__all__ = [
    "BestExporter", "ClassificationOutput", "Exporter", "FinalExporter", "LatestExporter",
    "Placeholder", "PredictOutput", "RegressionOutput", "ServingInputReceiver",
    "build_parsing_serving_input_receiver_fn", "build_raw_serving_input_receiver_fn",
    "column_from_config", "encode_request", "export_model", "placeholder",
    "sparse_placeholder",
]
