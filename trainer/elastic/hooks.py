"""DLRover's training hooks (``dlrover.python.elastic_agent.tensorflow.hooks``):
``ElasticDataShardReportHook`` reports each trained batch to a sharding client, so a shard
is done once trained on; ``ReportModelInfoHook`` reports the model's size and step rate,
which DLRover's master plans resources from; with no master here it logs them."""

from __future__ import annotations

import logging
import time
from typing import Any

from ..estimator.hooks import SessionRunHook
from .sharding import ShardingClient

log = logging.getLogger("tierserve.trainer.elastic")


class ElasticDataShardReportHook(SessionRunHook):
    """After each training step, ``sharding_client.report_batch_done()``."""

    def __init__(self, sharding_client: ShardingClient) -> None:
        self._client = sharding_client

    def begin(self) -> None:
        self._client.report_on_fetch = False  # done when trained on, not when read

    def after_run(self, run_context: Any, run_values: Any) -> None:
        self._client.report_batch_done()


class ReportModelInfoHook(SessionRunHook):
    """Logs the model's variables (count and values) when training starts and the steps
    per second when it ends: what DLRover's hook sends its master."""

    def after_create_session(self, session: Any, coord: Any) -> None:
        self._start, self._first = time.monotonic(), getattr(session, "global_step", 0)
        estimator = getattr(session, "_estimator", None)
        if estimator is not None:
            store = estimator._store
            values = sum(int(a.size) for a in store.dense.values())
            log.info("model info: %d dense variables (%d values), %d embedding tables",
                     len(store.dense), values, len(store.tables))

    def end(self, session: Any) -> None:
        steps = getattr(session, "global_step", 0) - getattr(self, "_first", 0)
        seconds = time.monotonic() - getattr(self, "_start", time.monotonic())
        log.info("model info: %d steps in %.1f s (%.1f steps/s)", steps, seconds,
                 steps / max(seconds, 1e-9))


__all__ = ["ElasticDataShardReportHook", "ReportModelInfoHook"]
