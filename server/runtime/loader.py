"""Builds the servable of a model version from its folder and the repository's ``ps.json``.

One :class:`~tierserve.ps.hierarchy.HierarchicalParameterServer`, made from ``ps.json``'s
tiers on the first load, holds the tables of every model; loading a version *stages* its
sparse folders there (nothing served changes), and the repository then commits the version
(:meth:`Servable.commit`) or discards it (:meth:`Servable.discard`).  Each version reads its own
tables, so a request never mixes one version's dense network with another's embeddings.  When
``ps.json`` names a Kafka ``update_source``, consumers apply online updates to its tiers
(:mod:`tierserve.ps.kafka_updates`) until the loader closes.

A version folder holds the files its ``ps.json`` entry names (matched by file name, so the
entry may point into any version) or, failing that, the files found by their patterns:
``*.json`` (graph), ``<prefix>_dense_<iter>.model`` and ``<prefix><i>_sparse_<iter>.model/``.
With a graph it serves as a ranking model (``DES``, ``CATCOLUMN``, ``ROWINDEX``); without one
as an embedding-lookup model (``KEYS``, ``NUMKEYS``).

A version is *complete* when every file its manifest lists is there with its recorded size
and every file its ``ps.json`` entry names (graph, dense file, sparse folders) is found; an
incomplete one is refused (:class:`~tierserve.core.errors.IncompleteModelError`) before anything
is loaded, so a version whose graph is still being copied never serves as an embedding store.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import threading
from pathlib import Path

from tierserve.core.errors import CorruptModelFileError, IncompleteModelError
from tierserve.model import manifest
from tierserve.model.dense_file import NONTRAINABLE_SUFFIX
from tierserve.ps.config import ModelConfig, PSConfig

from ..inference_model import InferenceModel
from .repository import Loader
from .servables import EmbeddingLookupServable, RankingServable, Servable, warm_up

log = logging.getLogger("tierserve.server.runtime.loader")

_SPARSE = re.compile(r"^(?!.*_opt_)(.*?)(\d+)_sparse_(\d+)\.model$")
_DENSE = re.compile(r"^(?!.*_opt_).*_dense_\d+\.model$")


def _pick(folder: Path, named: str, pattern: re.Pattern, what: str) -> Path | None:
    if named:
        candidate = folder / Path(named).name
        if candidate.exists():
            return candidate
    found = sorted(p for p in folder.iterdir() if pattern.match(p.name))
    if len(found) > 1:
        raise CorruptModelFileError(
            f"{folder}: several {what} files ({', '.join(p.name for p in found)}); keep one"
        )
    return found[0] if found else None


def version_files(entry: ModelConfig, folder: Path) -> ModelConfig:
    """``entry`` with its files taken from version ``folder``."""
    if not folder.is_dir():
        raise CorruptModelFileError(f"version folder {folder} does not exist")
    manifest.check_complete(folder)
    sparse = [folder / Path(f).name for f in entry.sparse_files]
    if not all(p.is_dir() for p in sparse):
        found = [p for p in folder.iterdir() if p.is_dir() and _SPARSE.match(p.name)]
        found.sort(key=lambda p: int(_SPARSE.match(p.name).group(2)))
        if len(found) != len(entry.sparse_files):
            error = IncompleteModelError if len(found) < len(entry.sparse_files) else (
                CorruptModelFileError
            )
            raise error(
                f"version folder {folder} is "
                f"{'incomplete' if error is IncompleteModelError else 'inconsistent'}: ps.json "
                f"lists {len(entry.sparse_files)} sparse model folders "
                f"({', '.join(Path(f).name for f in entry.sparse_files)}); the folder has "
                f"{len(found)}"
            )
        sparse = found
    dense = _pick(folder, entry.dense_file, _DENSE, "dense model")
    graphs = [p for p in folder.glob("*.json")]
    network = (
        _pick(folder, entry.network_file, re.compile(r".*\.json$"), "graph JSON")
        if (entry.network_file or graphs)
        else None
    )
    for named, found, what in ((entry.network_file, network, "graph JSON"),
                               (entry.dense_file, dense, "dense model file")):  # fmt: skip
        if named and found is None:
            raise IncompleteModelError(
                f"version folder {folder} is incomplete: ps.json names the {what} "
                f"{Path(named).name} and the folder has none"
            )
    used = [p.name for p in (*sparse, dense, network) if p is not None]
    if dense is not None:
        used.append(dense.name + NONTRAINABLE_SUFFIX)
    manifest.verify(folder, used)  # a right-sized dense file of another run is caught here
    data = entry.model_dump()
    data.update(
        sparse_files=[str(p) for p in sparse],
        dense_file=str(dense) if dense else "",
        network_file=str(network) if network else "",
    )
    return ModelConfig.model_validate(data)


class _TableSource:
    """One staged version's tables, by table index."""

    def __init__(self, ps, version) -> None:
        self.ps, self.version = ps, version
        self.table_names = list(version.tables)

    def lookup(self, table: int, keys):
        return self.ps.lookup(self.version, self.table_names[table], keys)


class RepositoryLoader(Loader):
    """The default loader of the server: see the module docstring.

    ``use_gpu_embedding_cache`` overrides every model's ``gpucache`` (``None``: as ps.json
    says).  The cache lives on the GPU when cupy sees one, else in host memory.
    """

    def __init__(self, use_gpu_embedding_cache: bool | None = None) -> None:
        self.parameter_server = None
        self.update_consumers: list = []  # Kafka online updates (ps.json update_source)
        self.use_gpu_embedding_cache = use_gpu_embedding_cache
        self._lock = threading.Lock()
        #: the models of the repository's ps.json: the consumers read their topics only
        #: (replaced, never changed in place: the consumers' threads read it)
        self._expected: frozenset[str] = frozenset()

    def _ps(self, ps_config: PSConfig):
        with self._lock:
            if self.parameter_server is None:
                from tierserve.ps.hierarchy import HierarchicalParameterServer
                from tierserve.ps.kafka_updates import start_update_consumers

                tiers = ps_config.model_copy(update={"models": []})
                self.parameter_server = HierarchicalParameterServer(tiers)
                self.update_consumers = start_update_consumers(
                    self.parameter_server, ps_config.update_source,
                    expects=lambda: self._expected,
                )
            return self.parameter_server

    def __call__(
        self, name: str, version: str, folder: Path | None, ps_config: PSConfig
    ) -> Servable:
        """Stage version ``version`` of ``name``; the repository commits or discards it."""
        entry = ps_config.model(name)
        config = version_files(entry, folder) if folder is not None else entry
        self._expected = self._expected | {m.model for m in ps_config.models}
        ps = self._ps(ps_config)
        servable = self._servable(name, version, config, ps, ps_config)
        try:
            servable.warm_up()  # before it serves: its first request is as fast as the rest
        except BaseException:
            servable.discard()
            servable.close()
            raise
        return servable

    def _servable(self, name: str, version: str, config, ps, ps_config: PSConfig) -> Servable:
        if not config.network_file:
            staged = ps.stage_model(config)
            return StoreServable(name, version, ps, staged)
        if not config.dense_file:
            raise CorruptModelFileError(f"model {name!r} version {version}: no dense model file")
        model = InferenceModel.from_config(
            config,
            ps,
            i64_input_key=ps_config.supportlonglong,
            use_gpu_embedding_cache=self.use_gpu_embedding_cache,
        )
        if model.table_names != list(config.embedding_table_names):
            log.warning(
                "model %s: ps.json names tables %s, the graph %s; the graph's names are used",
                name, config.embedding_table_names, model.table_names,
            )  # fmt: skip
        return ModelServable(name, version, model)

    def tier_stats(self) -> dict:
        if self.parameter_server is None:
            return {}
        stats = {level: st.snapshot() for level, st in self.parameter_server.tier_stats().items()}
        for consumer in self.update_consumers:
            if consumer.level in stats:
                level = stats[consumer.level]
                if consumer.role == "apply":
                    level["updates"] = dataclasses.asdict(consumer.stats)
                status = dataclasses.asdict(consumer.status())
                level.setdefault("consumers", []).append(status)
        return stats

    def consumer_status(self) -> list:
        """The :class:`~tierserve.ps.kafka_consumer.ConsumerStatus` of each Kafka consumer."""
        return [consumer.status() for consumer in self.update_consumers]

    def healthy(self) -> bool:
        """False while a Kafka consumer does not run (it failed and waits to restart, or
        stopped), or has not yet read its topics up to where they ended when it started
        (the replay after a restart): the server then reports not ready, as its embeddings
        may be stale."""
        return self.not_ready_reason() is None

    def not_ready_reason(self) -> str | None:
        """Why :meth:`healthy` is false (None when it is true)."""
        for status in self.consumer_status():
            consumer = f"the Kafka {status.role} consumer of the {status.level} tier"
            if not status.alive:
                return f"{consumer} does not run (last error: {status.last_error})"
            if not status.caught_up:
                return f"{consumer} is not caught up: {status.not_ready}"
        return None

    def close(self) -> None:
        for consumer in self.update_consumers:
            consumer.close()
        self.update_consumers = []
        if self.parameter_server is not None:
            self.parameter_server.close()
            self.parameter_server = None


class ModelServable(RankingServable):
    """A ranking servable over an :class:`InferenceModel` (with its statistics)."""

    def __init__(self, name: str, version: str, model: InferenceModel) -> None:
        super().__init__(name, version, model, closer=model.close)

    def warm_up(self) -> None:
        warm_up(self)

    def commit(self) -> None:
        self.model.commit()

    def discard(self) -> None:
        self.model.discard()

    def stats(self) -> dict:
        return self.model.stats()


class StoreServable(EmbeddingLookupServable):
    """The embedding-lookup model over one staged version of a model's tables."""

    def __init__(self, name: str, version: str, ps, staged) -> None:
        config = staged.config
        super().__init__(
            name,
            version,
            _TableSource(ps, staged),
            config.embedding_table_names,
            config.embedding_vecsize_per_table,
            # the model's own key limit: max_batch_size samples of its hotness
            max_keys=config.max_batch_size
            * (sum(config.maxnum_catfeature_query_per_table_per_sample) or config.slot_num or 1),
            i64_keys=ps.config.supportlonglong,
        )
        self.ps, self.staged = ps, staged

    def warm_up(self) -> None:
        warm_up(self)

    def commit(self) -> None:
        self.ps.commit_model(self.staged)

    def discard(self) -> None:
        self.ps.drop_model(self.staged)
