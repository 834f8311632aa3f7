"""librdkafka's own logging and errors through Python logging, quiet during an outage.

Left alone, librdkafka writes lines such as ``%3|...|FAIL|rdkafka#consumer-4| ... Connection
refused`` to stderr, several a second for as long as a broker is down.  A :class:`KafkaLog`
is given to a client as its ``logger`` and ``error_cb`` (:meth:`KafkaLog.client_config`):

- librdkafka's debug and informational lines go to the ``tierserve.kafka.rdkafka`` logger at
  DEBUG; its warnings and errors at WARNING, at most one line per facility (``FAIL``,
  ``REQTMOUT``, ...) per :data:`LOG_INTERVAL_S`, with the count of lines left out since;
- a broker that cannot be reached (connection refused, all brokers down, name resolution,
  timeouts) for :data:`OUTAGE_AFTER_S` is an *outage* (one failed connection between
  successes, as while a broker starts, is not): tierserve logs it once when it starts and once
  when the client reaches a broker again (:meth:`KafkaLog.recovered`, which the client's owner
  calls when it sees the broker answer), with how long it lasted.
"""

from __future__ import annotations

import logging
import threading
import time

log = logging.getLogger("tierserve.kafka")
rdkafka_log = logging.getLogger("tierserve.kafka.rdkafka")

#: The least time between two lines of one librdkafka facility at WARNING or above.
LOG_INTERVAL_S = 30.0
#: How long connection errors must go on before they are an outage.
OUTAGE_AFTER_S = 1.0
#: Connection errors further apart than this are not one failure going on.
_ERRORS_APART_S = 5.0
#: librdkafka error names that mean "no broker can be reached right now".
_OUTAGE_ERRORS = {
    "_TRANSPORT", "_ALL_BROKERS_DOWN", "_RESOLVE", "_TIMED_OUT", "_MSG_TIMED_OUT",
    "_AUTHENTICATION", "_SSL", "NETWORK_EXCEPTION", "REQUEST_TIMED_OUT",
}  # fmt: skip


class KafkaLog:
    """The log and error callbacks of one Kafka client named ``name`` in log lines; see the
    module docstring.  ``down`` is true from an outage's first error until :meth:`recovered`."""

    def __init__(self, name: str, interval_s: float = LOG_INTERVAL_S) -> None:
        self.name = name
        self.interval_s = interval_s
        self.down_since: float | None = None  # time.monotonic() of the outage's first error
        self._failing_since: float | None = None  # first of the connection errors going on
        self._last_failure = 0.0
        self.outages = 0
        self.last_error: str | None = None
        self._last: dict[str, float] = {}  # facility -> time of its last line
        self._left_out: dict[str, int] = {}
        self._lock = threading.Lock()

    @property
    def down(self) -> bool:
        return self.down_since is not None

    def client_config(self) -> dict:
        """The settings that route a confluent-kafka client's logs and errors here."""
        return {"logger": self, "error_cb": self.error}

    def _allowed(self, key: str) -> int | None:
        """None when a line of ``key`` was written within the interval (it is counted);
        else the number of lines of ``key`` left out since the last one."""
        now = time.monotonic()
        with self._lock:
            last = self._last.get(key)
            if last is not None and now - last < self.interval_s:
                self._left_out[key] = self._left_out.get(key, 0) + 1
                return None
            self._last[key] = now
            return self._left_out.pop(key, 0)

    def log(self, level: int, msg: str, *args) -> None:
        """What confluent-kafka calls for each librdkafka log line (``logger.log``)."""
        if level < logging.WARNING:
            rdkafka_log.debug(msg, *args)
            return
        facility = str(args[0]) if args else ""
        left_out = self._allowed(f"log:{facility}")
        if left_out is None:
            return
        suffix = f" ({left_out} similar lines left out)" if left_out else ""
        rdkafka_log.warning(f"{self.name}: {msg}{suffix}", *args)

    def error(self, error) -> None:
        """librdkafka's ``error_cb``: an outage starts, or another error (rate-limited)."""
        text = str(error)
        self.last_error = text
        name = error.name() if hasattr(error, "name") else ""
        if name in _OUTAGE_ERRORS:
            self._failure(text)
            return
        left_out = self._allowed(f"error:{name}")
        if left_out is not None:
            suffix = f" ({left_out} similar errors left out)" if left_out else ""
            log.warning("%s: Kafka error: %s%s", self.name, text, suffix)

    def _failure(self, reason: str) -> None:
        """A connection error: an outage once they have gone on for OUTAGE_AFTER_S."""
        now = time.monotonic()
        with self._lock:
            if self._failing_since is None or now - self._last_failure > _ERRORS_APART_S:
                self._failing_since = now
            self._last_failure = now
            if self.down_since is not None or now - self._failing_since < OUTAGE_AFTER_S:
                return
        self.outage(reason, since=self._failing_since)

    def outage(self, reason: str, since: float | None = None) -> None:
        """Note that no broker answers (since ``since``, a ``time.monotonic()``; default
        now); logged once per outage."""
        with self._lock:
            first = self.down_since is None
            if first:
                self.down_since = time.monotonic() if since is None else since
                self.outages += 1
        if first:
            log.warning("%s: Kafka brokers unreachable (%s); retrying in the background, "
                        "this is logged again when they answer", self.name, reason)  # fmt: skip

    def recovered(self) -> None:
        """Note that a broker answered; ends (and logs the end of) an outage."""
        with self._lock:
            since, self.down_since = self.down_since, None
            self._failing_since = None
        if since is not None:
            log.warning("%s: Kafka brokers reachable again after %.1f s", self.name,
                        time.monotonic() - since)  # fmt: skip
