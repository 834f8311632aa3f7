"""Online learning with the Estimator API: :class:`UpdatePublisherHook` keeps a served model
current while ``Estimator.train`` runs, as ``Model.fit(update_source=..., publish_interval=N,
repository=DIR, export_interval=M)`` does for the Model API (:mod:`tierserve.trainer.online`).

Sparse rows by Kafka, continuously: every ``publish_steps`` global steps the rows of the
Estimator's embedding tables changed since the last publish go as HPS update messages to
``hps_et.<model>.<table>``, the names :meth:`Estimator.export_saved_model` gives the served
model and its tables.  Dense weights by version: every ``export_steps`` steps the model is
exported as a new version of ``export_dir_base`` (the Estimator's own export, from the
variables in memory).  Both also happen when ``train`` ends.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any

from tierserve.core.errors import BackendUnavailableError, ConfigError

from ..online import UpdatePublisher, send_updates
from .hooks import SessionRunHook

log = logging.getLogger("tierserve.trainer.estimator")


class UpdatePublisherHook(SessionRunHook):
    """Publish the changed embedding rows to Kafka every ``publish_steps`` steps, and export a
    served version into ``export_dir_base`` every ``export_steps`` steps (optional); both
    again at the end of each ``train``.

    ``update_source``: Kafka brokers (``"host:port"``), HugeCTR's ``UpdateSourceParams``, a
    ps.json ``update_source`` dict, an ``UpdateProducer`` or an :class:`UpdatePublisher`.
    ``model_name``: the served model's name, as ``export_saved_model(model_name=...)`` takes
    it (default: the name it gives, the ``model_dir``'s folder name).  Exports need
    ``serving_input_receiver_fn``, as ``export_saved_model`` does.

    Messages are sent by a thread behind a bounded queue (training waits only when it is
    full).  A failed delivery is logged when it is known; the failures of one ``train`` are
    raised (:class:`BackendUnavailableError`) when the next ``train`` with this hook begins,
    or by :meth:`flush`.  :meth:`close` stops the sending thread.
    """

    def __init__(self, update_source: Any, publish_steps: int = 10, *,
                 model_name: str | None = None, export_dir_base: str | os.PathLike | None = None,
                 serving_input_receiver_fn: Callable | None = None,
                 export_steps: int | None = None) -> None:  # fmt: skip
        if update_source is None:
            raise ConfigError("UpdatePublisherHook: update_source must name Kafka brokers")
        if int(publish_steps) < 1:
            raise ConfigError(f"UpdatePublisherHook: publish_steps must be >= 1, got "
                              f"{publish_steps}")  # fmt: skip
        if export_steps is not None and int(export_steps) < 1:
            raise ConfigError(f"UpdatePublisherHook: export_steps must be >= 1, got "
                              f"{export_steps}")  # fmt: skip
        if (export_dir_base is None) != (export_steps is None):
            raise ConfigError("UpdatePublisherHook: give export_dir_base and export_steps "
                              "together (or neither)")  # fmt: skip
        if export_dir_base is not None and serving_input_receiver_fn is None:
            raise ConfigError("UpdatePublisherHook: export_dir_base needs a "
                              "serving_input_receiver_fn (what export_saved_model takes)")  # fmt: skip
        self.publish_steps = int(publish_steps)
        self.export_steps = None if export_steps is None else int(export_steps)
        self.export_dir_base = None if export_dir_base is None else os.fspath(export_dir_base)
        self.serving_input_receiver_fn = serving_input_receiver_fn
        self.model_name = model_name
        self.publisher = (update_source if isinstance(update_source, UpdatePublisher)
                          else UpdatePublisher(update_source))  # fmt: skip
        self.versions: list[str] = []  # the version folders this hook exported
        self._estimator = None
        self._name: str | None = None
        self._published = self._exported = 0  # global steps

    @property
    def name(self) -> str | None:
        """The served model's name (known once training began)."""
        return self._name

    def begin(self) -> None:
        self.publisher.raise_errors()  # what the last train left undelivered

    def after_create_session(self, session: Any, coord: Any) -> None:
        estimator = getattr(session, "_estimator", None)
        if estimator is None:
            raise ConfigError("UpdatePublisherHook works in Estimator.train only")
        from .export import _model_name

        self._estimator = estimator
        self._name = _model_name(estimator, self.model_name)
        self._published = self._exported = session.global_step

    def after_run(self, run_context: Any, run_values: Any) -> None:
        step = run_context.session.global_step
        if step - self._published >= self.publish_steps:
            self._publish(step)
        if self.export_steps is not None and step - self._exported >= self.export_steps:
            self._export(step)

    def end(self, session: Any) -> None:
        step = session.global_step
        if step > self._published:
            self._publish(step)
        try:
            self.publisher.flush()
        except BackendUnavailableError as exc:
            log.error("online updates: %s (raised by the next train)", exc)
            self.publisher.errors.append(str(exc))
        if self.export_steps is not None and step > self._exported:
            self._export(step)

    def _publish(self, step: int) -> None:
        tables = self._estimator._store.tables
        stamp = int(time.time() * 1000)  # before the rows are read: no later change is older
        send_updates(self.publisher, self._name,
                     [(name, *table.incremental()) for name, table in tables.items()],
                     stamp)  # fmt: skip
        self._published = step  # a failure is logged by the publisher when it is known

    def _export(self, step: int) -> None:
        from .export import export_model

        path = export_model(self._estimator, self.export_dir_base,
                            self.serving_input_receiver_fn, model_name=self._name,
                            current=True)  # fmt: skip
        self.versions.append(os.fsdecode(path))
        self._exported = step

    def flush(self, timeout: float = 30.0) -> None:
        """Wait until every publish is delivered; raise the failures not yet raised."""
        self.publisher.flush(timeout)

    def close(self, timeout: float = 30.0) -> None:
        """Flush and stop the sending thread."""
        self.publisher.close(timeout)


__all__ = ["UpdatePublisherHook"]
