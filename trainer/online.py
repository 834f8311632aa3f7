"""Online learning from the trainer's side: a model that keeps training keeps the served one
current (``Model.fit(update_source=..., publish_interval=N, repository=DIR, export_interval=M)``).

Two streams, paired:

- **sparse rows by Kafka, continuously**: every ``publish_interval`` iterations the rows the
  optimizer changed since the last publish (``Model.get_incremental_model``) are sent as HPS
  update messages to ``hps_et.<model>.<table>``, stamped with the time they were taken.  An
  :class:`UpdatePublisher` does the sending on a thread of its own behind a bounded queue, so
  training waits on the broker only when the queue is full.  A delivery that fails is written
  to the training log when it happens and raised by the next ``fit`` (or :meth:`flush`).
- **dense weights by version**: every ``export_interval`` iterations a new version folder
  ``DIR/<model>/<n>/`` is written (graph, dense file, sparse folders, manifest) under a hidden
  name and renamed into place whole; a server polling the repository swaps it in.  A version
  also bounds what a server must replay: consumers skip the updates older than the served
  version's files and read every one since (:mod:`tierserve.ps.update_replay`).

So a served prediction uses the dense weights of the last exported version and the sparse
rows of the last publish; both ends of ``fit`` publish and export what changed, so once it
returns (and the messages are applied and the version loaded) the server predicts what the
trainer does.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from tierserve.core.errors import BackendUnavailableError, ConfigError
from tierserve.model.version_folder import new_version, write_ps_entry
from tierserve.ps.update_replay import STAMP

log = logging.getLogger("tierserve.trainer.online")

#: Publishes waiting for the publisher thread before ``train`` blocks on a full queue.
QUEUE_SIZE = 4
_STOP = object()


def _producer(update_source: Any):
    """An :class:`~tierserve.ps.kafka_producer.UpdateProducer` from ``update_source``: broker
    addresses, HugeCTR's ``UpdateSourceParams``, a ps.json ``update_source`` object or dict,
    or a producer."""
    from tierserve.ps.kafka_producer import UpdateProducer
    from tierserve.ps.kafka_source import KafkaUpdateSourceConfig

    if isinstance(update_source, UpdateProducer):
        return update_source, False
    if isinstance(update_source, str):
        return UpdateProducer(update_source), True
    config = update_source
    if hasattr(config, "to_config"):  # UpdateSourceParams
        config = config.to_config()
    elif isinstance(config, dict):
        config = KafkaUpdateSourceConfig.model_validate(config)
    if not isinstance(config, KafkaUpdateSourceConfig):
        raise ConfigError(
            f"update_source must name Kafka brokers (a 'host:port' string, UpdateSourceParams "
            f"with type kafka_message_queue, or an UpdateProducer); got {update_source!r}"
        )
    return UpdateProducer(config.brokers, config.max_batch_size), True


class UpdatePublisher:
    """Sends a model's changed rows to Kafka on a thread, behind a queue of ``queue_size``.

    ``update_source``: see :func:`_producer`.  :meth:`submit` hands over one publish (returns
    at once unless the queue is full); :meth:`flush` waits until everything submitted is
    delivered and raises what failed; :attr:`errors` lists the failures not yet raised.
    """

    def __init__(self, update_source: Any, queue_size: int = QUEUE_SIZE) -> None:
        if queue_size < 1:
            raise ConfigError(f"queue_size must be at least 1, got {queue_size}")
        self.producer, self._owned = _producer(update_source)
        self.errors: list[str] = []
        self.rows = 0  # rows handed to the producer
        self.messages = 0
        self.waited_s = 0.0  # time training spent blocked on a full queue
        #: time callers of publish_updates spent taking the changed rows and queueing them
        #: (the training thread's share of publishing; waited_s included)
        self.taken_s = 0.0
        self._queue: queue.Queue = queue.Queue(queue_size)
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="tierserve-publish", daemon=True)
        self._thread.start()

    def submit(self, model: str, tables: list[tuple[str, np.ndarray, np.ndarray]],
               timestamp_ms: int | None = None) -> None:  # fmt: skip
        """Queue ``(table, keys, vectors)`` of ``model`` for sending, stamped
        ``timestamp_ms`` (default now: when the rows were taken)."""
        if not self._thread.is_alive():
            raise BackendUnavailableError("the update publisher is closed")
        stamp = int(time.time() * 1000) if timestamp_ms is None else int(timestamp_ms)
        item = (model, [t for t in tables if len(t[1])], stamp)
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            start = time.perf_counter()
            self._queue.put(item)
            self.waited_s += time.perf_counter() - start

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is _STOP:
                    return
                model, tables, stamp = item
                for table, keys, vectors in tables:
                    self.messages += self.producer.publish(model, table, keys, vectors,
                                                           timestamp_ms=stamp)  # fmt: skip
                    self.rows += int(len(keys))
                self.producer.poll(0)
                self._collect()
            except Exception as exc:  # the producer refused: training must hear of it
                self._failed(f"{type(exc).__name__}: {exc}")
            finally:
                self._queue.task_done()

    def _collect(self) -> None:
        for failure in self.producer.take_failures():
            self._failed(failure)

    def _failed(self, text: str) -> None:
        log.error("online updates: publishing failed: %s", text)
        with self._lock:
            self.errors.append(text)

    def raise_errors(self) -> None:
        """Raise the failures not yet raised (and forget them)."""
        with self._lock:
            errors, self.errors = self.errors, []
        if errors:
            more = f" (and {len(errors) - 5} more)" if len(errors) > 5 else ""
            raise BackendUnavailableError(
                f"{len(errors)} online update publishes failed: {'; '.join(errors[:5])}{more}"
            )

    def flush(self, timeout: float = 30.0) -> None:
        """Wait until every submitted update is delivered; raise the failures."""
        self._queue.join()
        try:
            self.producer.flush(timeout)
        except BackendUnavailableError as exc:
            self._failed(str(exc))
        self.raise_errors()

    def close(self, timeout: float = 30.0) -> None:
        """Flush, then stop the thread (and the producer when this publisher made it)."""
        try:
            self.flush(timeout)
        finally:
            self._queue.put(_STOP)
            self._thread.join(timeout)


def publish_updates(model, publisher, model_name: str | None = None) -> int:
    """Send ``model``'s rows changed since the last call to ``publisher`` (an
    :class:`UpdatePublisher` or an ``UpdateProducer``); returns the rows sent."""
    name = model_name or model.solver.model_name
    if not name:
        raise ConfigError("publish_updates: name the served model (model_name, or the "
                          "solver's model_name)")  # fmt: skip
    start = time.perf_counter()
    stamp = int(time.time() * 1000)  # before the rows are read: no later change is older
    tables = [(spec.name, keys, vectors) for spec, (keys, vectors)
              in zip(model.embedding_specs, model.get_incremental_model())]  # fmt: skip
    rows = send_updates(publisher, name, tables, stamp)
    if isinstance(publisher, UpdatePublisher):
        publisher.taken_s += time.perf_counter() - start
    return rows


def send_updates(publisher, model_name: str,
                 tables: list[tuple[str, np.ndarray, np.ndarray]], timestamp_ms: int) -> int:  # fmt: skip
    """Send ``(table, keys, vectors)`` of ``model_name``, taken at ``timestamp_ms``, to
    ``publisher`` (an :class:`UpdatePublisher` or an ``UpdateProducer``); returns the rows."""
    if isinstance(publisher, UpdatePublisher):
        publisher.submit(model_name, tables, timestamp_ms)
    else:
        for table, keys, vectors in tables:
            if len(keys):
                publisher.publish(model_name, table, keys, vectors, timestamp_ms=timestamp_ms)
    return sum(int(len(keys)) for _, keys, _ in tables)


def export_version(model, repository: str | Path, model_name: str, iteration: int) -> Path:
    """Write ``model`` as a new version ``repository/<model_name>/<n>/`` and return it.

    The files go to a hidden folder first, which is renamed into place once whole, so a
    polling server never sees half a version.
    """
    from tierserve.ps.table_tag import check_name

    check_name(model_name, "model name")
    home = Path(repository) / model_name
    dist = getattr(model, "_dist", None)  # under mpiexec: rank 0 writes the one version
    if dist is not None and not dist.writes_files:  # this rank's rows go to rank 0
        return dist.join_export(model, home, model_name, iteration)
    with new_version(home, None if dist is None else dist.version_number(home)) as (
            version, staging):
        # By the clock that stamps the update messages, before the rows are read: what was
        # published before it is in these files (tierserve.ps.update_replay).
        (staging / STAMP).write_text(f"{int(time.time() * 1000)}\n")
        model.graph_to_json(str(staging / f"{model_name}.json"))
        model.save_params_to_files(str(staging / model_name), iteration)
        # ps.json before the folder appears: a server that sees the version has its entry
        write_ps_entry(Path(repository), ps_entry(model_name, version, staging),
                       supportlonglong=bool(model.solver.i64_input_key), keep=TUNED_FIELDS)
    return home / str(version)


#: ps.json model fields a user tunes for serving: kept as the file has them when a later
#: export replaces the model's entry.
TUNED_FIELDS = ("max_batch_size", "default_value_for_each_table", "gpucache", "gpucacheper",
                "hit_rate_threshold", "deployed_device_list", "cache_refresh_percentage_per_iteration",
                "refresh_interval", "refresh_delay")  # fmt: skip
#: max_batch_size of a new entry: the most rows one request may carry.
SERVING_MAX_BATCH_SIZE = 1024


def ps_entry(model_name: str, version: int, folder: Path) -> dict:
    """The ``ps.json`` entry of the HugeCTR-style model version in ``folder`` (its graph
    JSON, dense file and sparse folders), paths relative to the repository."""
    from tierserve.core.errors import ConfigError
    from tierserve.model.graph_json import load_graph_json
    from tierserve.model.inference_graph import graph_inputs, label_layout

    graph = load_graph_json(folder / f"{model_name}.json")
    data, tables = graph_inputs(graph)
    if not tables:
        raise ConfigError(f"model {model_name!r}: the graph has no embedding table; tierserve "
                          "serves models with at least one")  # fmt: skip
    dense = sorted(p.name for p in folder.glob(f"{model_name}_dense_*.model"))
    sparse = sorted((p.name for p in folder.glob(f"{model_name}*_sparse_*.model")
                     if "_opt_" not in p.name), key=lambda n: int(n[len(model_name):].split("_")[0]))  # fmt: skip
    prefix = f"{model_name}/{version}"
    return {
        "model": model_name,
        "sparse_files": [f"{prefix}/{n}" for n in sparse],
        "dense_file": f"{prefix}/{dense[0]}" if dense else "",
        "network_file": f"{prefix}/{model_name}.json",
        "max_batch_size": SERVING_MAX_BATCH_SIZE,
        "default_value_for_each_table": [0.0] * len(tables),
        "maxnum_des_feature_per_sample": int((data.get("dense") or {}).get("dense_dim", 0)),
        "maxnum_catfeature_query_per_table_per_sample": [max(t.max_nnz, t.slot_num)
                                                         for t in tables],
        "embedding_vecsize_per_table": [t.embedding_vec_size for t in tables],
        "embedding_table_names": [t.name for t in tables],
        "gpucache": False,
        "label_dim": sum(label_layout(data)[1]),
        "slot_num": sum(t.slot_num for t in tables),
    }


class OnlineLoop:
    """What ``fit`` does beside training when asked to publish or export (see the module
    docstring); ``step(it)`` after each iteration, ``close()`` at the end."""

    def __init__(self, model, *, update_source: Any = None, publish_interval: int = 0,
                 repository: str | Path | None = None, export_interval: int = 0,
                 model_name: str | None = None) -> None:  # fmt: skip
        self.model = model
        self.name = model_name or model.solver.model_name
        if (update_source is not None or repository is not None) and not self.name:
            raise ConfigError(
                "fit: online updates and exported versions need the served "
                "model's name (model_name=, or CreateSolver(model_name=...))"
            )
        if update_source is not None and publish_interval < 1:
            raise ConfigError(f"fit: update_source needs publish_interval >= 1, got "
                              f"{publish_interval}")  # fmt: skip
        if publish_interval and update_source is None:
            raise ConfigError("fit: publish_interval needs an update_source (Kafka brokers)")
        if repository is not None and export_interval < 1:
            raise ConfigError(f"fit: repository needs export_interval >= 1, got "
                              f"{export_interval}")  # fmt: skip
        if export_interval and repository is None:
            raise ConfigError("fit: export_interval needs a repository folder")
        if repository is not None and not getattr(model, "embedding_specs", True):
            raise ConfigError(  # before training, not at the first export
                "fit: repository: the model has no embedding table, and tierserve serves "
                "models with at least one; add a SparseEmbedding or train without repository="
            )
        self.publish_interval = int(publish_interval)
        self.export_interval = int(export_interval)
        self.repository = None if repository is None else Path(repository)
        self.publisher: UpdatePublisher | None = None
        if update_source is not None:
            self.publisher = _publisher_of(model, update_source)
            self.publisher.raise_errors()  # what the last fit left undelivered
        self.versions: list[Path] = []
        self._published = self._exported = self._shown = 0

    def step(self, it: int) -> None:
        if self.publisher is not None and it % self.publish_interval == 0:
            self._publish(it)
        if self.repository is not None and it % self.export_interval == 0:
            self._export(it)

    def _publish(self, it: int) -> None:
        publish_updates(self.model, self.publisher, self.name)
        self._published = it
        errors = self.publisher.errors
        for error in errors[self._shown :]:  # each failure once, when it is known
            print(f"[tierserve] iter {it}: online update publishing failed: {error}", flush=True)
        self._shown = len(errors)

    def _export(self, it: int) -> None:
        self.versions.append(export_version(self.model, self.repository, self.name, it))
        self._exported = it

    def close(self, it: int) -> None:
        """Publish and export what changed since the last time, and wait for delivery."""
        if self.publisher is not None:
            if it > self._published:
                self._publish(it)
            try:
                self.publisher.flush()
            except BackendUnavailableError as exc:
                print(f"[tierserve] online update publishing failed: {exc}", flush=True)
                self.publisher.errors.append(str(exc))  # raised by the next fit
        if self.repository is not None and it > self._exported:
            self._export(it)


def _publisher_of(model, update_source) -> UpdatePublisher:
    """The model's publisher for ``update_source``: kept between fit calls (one producer,
    and the failures one fit leaves are raised by the next)."""
    current = getattr(model, "_update_publisher", None)
    if current is not None and current[0] == update_source:
        return current[1]
    if current is not None:
        current[1].close()
    publisher = UpdatePublisher(update_source)
    model._update_publisher = (update_source, publisher)
    return publisher
