"""The files of a HugeCTR :class:`~.model.Model`: saving every table with its optimizer
state, the dense weights and their optimizer state (docs/formats.md, Files and messages 1-2),
and loading them back, from local paths or a ``DataSourceParams`` source."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tierserve.core.errors import ConfigError
from tierserve.model import manifest
from tierserve.model.dense_file import (
    NONTRAINABLE_SUFFIX,
    dense_model_name,
    dense_optimizer_name,
    read_dense_file,
    write_dense_file,
)
from tierserve.model.device import to_numpy, to_xp
from tierserve.ps.sparse_file import sparse_model_name, sparse_optimizer_name
from tierserve.trainer.data.source import local_copy

from . import adapters

if TYPE_CHECKING:
    from .model import Model


def save_params_to_files(model: Model, prefix: str, iter: int = 0) -> list[str]:  # noqa: A002
    """Write every table (``<prefix><i>_sparse_<iter>.model``) with its optimizer state,
    the dense weights (``<prefix>_dense_<iter>.model`` and ``.nontrainable``) and the
    dense optimizer state (``<prefix>_opt_dense_<iter>.model``); returns their paths."""
    model._require_compiled("save_params_to_files")
    parent = Path(prefix).parent
    parent.mkdir(parents=True, exist_ok=True)
    written = []
    if model._etc is not None:  # the full tables, to the etc's sparse_models paths
        written = model._etc.save()
    for i, table in enumerate(model.tables if model._etc is None else ()):
        adapters.save_table(table, sparse_model_name(prefix, i, iter),
                            sparse_optimizer_name(prefix, i, iter))
        written.append(sparse_model_name(prefix, i, iter))
    flat = [to_numpy(p) for ps in model.params for p in ps]
    dense_path = dense_model_name(prefix, iter)
    if model._dist is None or model._dist.writes_files:  # ranks hold the same dense model
        write_dense_file(dense_path, flat)
        write_dense_file(dense_path + NONTRAINABLE_SUFFIX,
                         [to_numpy(s) for ss in model.states for s in ss])
        write_dense_file(dense_optimizer_name(prefix, iter), _dense_opt_arrays(model))
        # What a loader checks that the dense file is the one saved with these tables
        # and graph.
        manifest.record([*written, dense_path, dense_path + NONTRAINABLE_SUFFIX])
    if model._dist is not None:
        model._dist.barrier("save_params_to_files")
    opt_files = [] if model._etc is not None else [
        sparse_optimizer_name(prefix, i, iter) for i in range(len(model.tables))]
    return [*written, *opt_files,
            dense_path, dense_path + NONTRAINABLE_SUFFIX, dense_optimizer_name(prefix, iter)]


def _dense_opt_arrays(model: Model) -> list[np.ndarray]:
    # One block per state name, each the concatenation over all parameters in file order
    # (HugeCTR keeps one buffer per optimizer state).
    out = []
    for name in model.optimizer.state_names:
        for per_layer in model.opt_states:
            for st in per_layer:
                out.append(to_numpy(st[name]))
    return out


def load_dense_weights(model: Model, dense_model_file: str, data_source_params: Any = None) -> None:
    """``Model.load_dense_weights`` (see there)."""
    model._require_compiled("load_dense_weights")
    remote = os.fspath(dense_model_file)
    dense_model_file, tmp = local_copy(data_source_params, remote, "load_dense_weights")
    if tmp is not None:  # the .nontrainable state beside it comes along when present
        with contextlib.suppress(ConfigError):
            data_source_params.fetch(remote + NONTRAINABLE_SUFFIX, tmp.name)
    shapes = model.network.flat_param_shapes()
    arrays = read_dense_file(dense_model_file, shapes)
    for dst, src in zip((p for ps in model.params for p in ps), arrays):
        dst[...] = to_xp(model.xp, src, np.float32)
    sshapes = model.network.flat_state_shapes()
    nt = os.fspath(dense_model_file) + NONTRAINABLE_SUFFIX
    if sshapes and os.path.exists(nt):
        for dst, src in zip((s for ss in model.states for s in ss),
                            read_dense_file(nt, sshapes, "non-trainable dense file")):
            dst[...] = to_xp(model.xp, src, np.float32)


def load_dense_optimizer_states(model: Model, dense_opt_states_file: str,
                                data_source_params: Any = None) -> None:
    """``Model.load_dense_optimizer_states`` (see there)."""
    model._require_compiled("load_dense_optimizer_states")
    dense_opt_states_file, _tmp = local_copy(data_source_params, dense_opt_states_file,
                                             "load_dense_optimizer_states")
    shapes = [tuple(p.shape) for _ in model.optimizer.state_names
              for ps in model.params for p in ps]
    arrays = read_dense_file(dense_opt_states_file, shapes, "dense optimizer state file")
    k = 0
    for name in model.optimizer.state_names:
        for per_layer in model.opt_states:
            for st in per_layer:
                st[name][...] = to_xp(model.xp, arrays[k], np.float32)
                k += 1


def _tables_by(model: Model, files: Any, what: str) -> list[tuple[Any, str]]:
    if isinstance(files, (str, os.PathLike)):
        files = [files]
    if isinstance(files, dict):
        names = [s.name for s in model.embedding_specs]
        unknown = [n for n in files if n not in names]
        if unknown:
            raise ConfigError(f"{what}: no embedding named {unknown[0]!r} "
                              f"(embeddings: {names})")
        return [(model.tables[names.index(n)], os.fspath(f)) for n, f in files.items()]
    files = list(files)
    if len(files) != len(model.tables):
        raise ConfigError(f"{what}: {len(files)} files for {len(model.tables)} embedding "
                          "tables (pass a dict to load some of them)")
    return [(t, os.fspath(f)) for t, f in zip(model.tables, files)]


def load_sparse_weights(model: Model, sparse_embedding_files: Any,
                        data_source_params: Any = None) -> None:
    """``Model.load_sparse_weights`` (see there)."""
    model._require_compiled("load_sparse_weights")
    for table, path in _tables_by(model, sparse_embedding_files, "load_sparse_weights"):
        path, _tmp = local_copy(data_source_params, path, "load_sparse_weights")
        adapters.load_table(table, path)


def load_sparse_optimizer_states(model: Model, sparse_opt_states_files: Any,
                                 data_source_params: Any = None) -> None:
    """``Model.load_sparse_optimizer_states`` (see there)."""
    model._require_compiled("load_sparse_optimizer_states")
    for table, path in _tables_by(model, sparse_opt_states_files,
                                       "load_sparse_optimizer_states"):
        path, _tmp = local_copy(data_source_params, path, "load_sparse_optimizer_states")
        adapters.load_table_optimizer(table, path)
