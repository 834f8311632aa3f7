"""What an update consumer reports: its counters (:class:`ConsumerStats`) and its state for
health checks and metrics (:class:`ConsumerStatus`)."""

from __future__ import annotations

from dataclasses import dataclass

#: Bounds (seconds) of the update freshness histogram: message timestamp to applied.
FRESHNESS_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
)  # fmt: skip


@dataclass
class ConsumerStats:
    """What a consumer did so far."""

    messages: int = 0  # applied
    keys: int = 0  # applied
    malformed: int = 0  # bad value: skipped
    rejected: int = 0  # unknown table, wrong dim: skipped
    stale: int = 0  # older than the served version's files (update_replay): skipped
    retries: int = 0  # tier unreachable: retried after the backoff
    errors: int = 0  # Kafka errors reported by the client, unexpected failures (skipped)


@dataclass(frozen=True)
class ConsumerStatus:
    """Whether a consumer reads updates, for health checks and metrics."""

    level: str
    role: str  # "apply" (writes the tier) or "invalidate" (tells this process's caches)
    group: str
    alive: bool  # its loop runs (false while it waits to restart, and once it stopped)
    restarts: int  # times its loop failed and was restarted
    last_error: str | None  # the last failure of its loop, if any
    #: ``(topic, partition, messages behind the partition's end)`` per assigned partition
    lag: tuple[tuple[str, int, int], ...] = ()
    #: message timestamp to applied and visible, in seconds (``LatencyHistogram.cumulative``
    #: as ``{"count", "sum", "buckets"}``); None for a consumer that applies nothing
    freshness: dict | None = None
    #: partitions whose model is not loaded yet: paused, read once it is
    waiting: int = 0
    kafka_down: bool = False  # no broker answers (an outage: see tierserve.ps.kafka_log)
    #: it read what its topics held when it started (tierserve.ps.kafka_catchup): the server
    #: is not ready until then; ``not_ready`` says why not
    caught_up: bool = True
    not_ready: str | None = None
