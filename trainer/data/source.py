"""``hugectr.data.DataSourceParams`` and ``DataSource``: where training data and model files
live, and moving them to the local file system.

Built on fsspec (the ``datasource`` extra).  With ``use_hdfs=False`` (the default) every path
is a local one; with ``use_hdfs=True`` the ``hdfs_*`` paths are read from
``hdfs://<namenode>:<port>`` through fsspec's HDFS file system (pyarrow with libhdfs must be
installed; without it the first use names what is missing).

``DataSource(params).move_to_local()`` copies each ``hdfs_*`` path that has a ``local_*``
counterpart (files and folders, the list fields pairwise).  ``Model.fit``,
``load_dense_weights``, ``load_dense_optimizer_states``, ``load_sparse_weights`` and
``load_sparse_optimizer_states`` take ``data_source_params``: with ``use_hdfs`` the files are
read from HDFS (copied to a temporary folder first) and ``fit``'s snapshots are copied to
``hdfs_model_home``; without it the paths are local and used as given.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from tierserve.core.errors import ConfigError
from tierserve.ps.params import ParamsModel

_PAIRS = (
    ("hdfs_train_source", "local_train_source"),
    ("hdfs_train_filelist", "local_train_filelist"),
    ("hdfs_eval_source", "local_eval_source"),
    ("hdfs_eval_filelist", "local_eval_filelist"),
    ("hdfs_dense_model", "local_dense_model"),
    ("hdfs_dense_opt_states", "local_dense_opt_states"),
    ("hdfs_sparse_model", "local_sparse_model"),
    ("hdfs_sparse_opt_states", "local_sparse_opt_states"),
    ("hdfs_model_home", "local_model_home"),
)


def _fsspec():
    try:
        import fsspec
    except ImportError:
        raise ConfigError(
            "DataSource needs fsspec: pip install 'tierserve[datasource]'"
        ) from None
    return fsspec


class DataSourceParams(ParamsModel):
    """HugeCTR's ``DataSourceParams``: the file system and the remote and local paths."""

    use_hdfs: bool = False
    namenode: str = "localhost"
    port: int = 9000
    hdfs_train_source: str = ""
    hdfs_train_filelist: str = ""
    hdfs_eval_source: str = ""
    hdfs_eval_filelist: str = ""
    hdfs_dense_model: str = ""
    hdfs_dense_opt_states: str = ""
    hdfs_sparse_model: list[str] = []
    hdfs_sparse_opt_states: list[str] = []
    hdfs_model_home: str = ""
    local_train_source: str = ""
    local_train_filelist: str = ""
    local_eval_source: str = ""
    local_eval_filelist: str = ""
    local_dense_model: str = ""
    local_dense_opt_states: str = ""
    local_sparse_model: list[str] = []
    local_sparse_opt_states: list[str] = []
    local_model_home: str = ""

    def filesystem(self):
        """The fsspec file system of the ``hdfs_*`` paths (local unless ``use_hdfs``)."""
        fsspec = _fsspec()
        if not self.use_hdfs:
            return fsspec.filesystem("file")
        try:
            return fsspec.filesystem("hdfs", host=self.namenode, port=self.port)
        except Exception as exc:  # pyarrow or libhdfs missing, namenode unreachable
            raise ConfigError(
                f"DataSourceParams.use_hdfs: cannot reach HDFS at {self.namenode}:{self.port} "
                f"through fsspec ({type(exc).__name__}: {exc}); HDFS needs pyarrow with libhdfs"
            ) from None

    def fetch(self, path: str, workdir: str) -> str:
        """A local path holding ``path``: itself without ``use_hdfs``, else a copy under
        ``workdir``."""
        if not self.use_hdfs:
            return path
        local = os.path.join(workdir, Path(path).name)
        _copy(self.filesystem(), path, local)
        return local

    def upload(self, local_paths: list[str]) -> None:
        """Copy files or folders written locally to ``hdfs_model_home`` (with ``use_hdfs``)."""
        if not self.use_hdfs:
            return
        if not self.hdfs_model_home:
            raise ConfigError("DataSourceParams.use_hdfs needs hdfs_model_home to save models")
        fs = self.filesystem()
        for path in local_paths:
            remote = f"{self.hdfs_model_home.rstrip('/')}/{Path(path).name}"
            fs.put(path, remote, recursive=os.path.isdir(path))


def _copy(fs, remote: str, local: str) -> None:
    if not fs.exists(remote):
        raise ConfigError(f"DataSource: {remote} does not exist")
    Path(local).parent.mkdir(parents=True, exist_ok=True)
    fs.get(remote, local, recursive=fs.isdir(remote))


class DataSource:
    """HugeCTR's ``DataSource(data_source_params)``."""

    def __init__(self, data_source_params: DataSourceParams) -> None:
        if not isinstance(data_source_params, DataSourceParams):
            raise ConfigError("DataSource takes a DataSourceParams")
        self.params = data_source_params

    def move_to_local(self) -> list[str]:
        """Copy every ``hdfs_*`` path that has a ``local_*`` path to it; returns the local
        paths written."""
        p = self.params
        fs = p.filesystem()
        written = []
        for remote_name, local_name in _PAIRS:
            remote, local = getattr(p, remote_name), getattr(p, local_name)
            if isinstance(remote, list):
                if len(remote) != len(local):
                    raise ConfigError(
                        f"DataSourceParams: {remote_name} has {len(remote)} paths, "
                        f"{local_name} {len(local)}"
                    )
                pairs = list(zip(remote, local))
            else:
                pairs = [(remote, local)] if remote and local else []
            for r, loc in pairs:
                _copy(fs, r, loc)
                written.append(loc)
        return written


def check_data_source(params: Any, what: str) -> DataSourceParams | None:
    """``params`` if it is None or a :class:`DataSourceParams`, else :class:`ConfigError`."""
    if params is not None and not isinstance(params, DataSourceParams):
        raise ConfigError(f"{what}: data_source_params must be a hugectr.data.DataSourceParams")
    return params


def local_copy(params: Any, path: str, what: str) -> tuple[str, Any]:
    """``(local path, temporary folder or None)`` for a model file ``path`` that
    ``data_source_params`` places (see the module docstring)."""
    if check_data_source(params, what) is None or not params.use_hdfs:
        return path, None
    tmp = tempfile.TemporaryDirectory(prefix="tierserve-hdfs-")
    return params.fetch(path, tmp.name), tmp
