"""What an update consumer asks the brokers about its topics besides their messages.

An :class:`UpdateConsumer <tierserve.ps.kafka_apply.UpdateConsumer>` keeps one
:class:`TopicAdmin` (a confluent-kafka ``AdminClient`` on the same brokers) for two questions:

- **Was a topic deleted and created again?**  A recreated topic has a new *topic id*, and
  its partitions start again at offset 0 and leader epoch 0.  librdkafka keeps the highest
  leader epoch it saw per partition and ignores metadata with a lower one as stale, so after
  a broker restart (which raises the epochs) a consumer never fetches from the recreated
  partitions: no error, no lag, nothing applied.  :meth:`TopicAdmin.recreated` compares each
  topic's id with the one it saw first; the consumer then starts a new client (a new
  metadata cache) and reads those topics from their start.
- **Where do its topics end?**  :meth:`TopicAdmin.end_offsets` lists the topics that match
  a subscription and the end offset (high watermark) of each of their partitions: what a
  restarted server must have read before it says it is ready.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable

log = logging.getLogger(__name__)

Key = tuple[str, int]  # (topic, partition)


class TopicAdmin:
    """Topic ids and end offsets of the topics on brokers ``settings["bootstrap.servers"]``
    (``settings``: a consumer's, of which the connection and logging ones are used)."""

    _KEPT = ("bootstrap.servers", "logger", "error_cb", "security.protocol", "sasl.mechanisms",
             "sasl.username", "sasl.password", "ssl.ca.location")  # fmt: skip

    def __init__(self, settings: dict) -> None:
        from confluent_kafka.admin import AdminClient

        self._admin = AdminClient({k: v for k, v in settings.items() if k in self._KEPT})
        self._ids: dict[str, str] = {}  # topic -> the id seen first (or after a recreate)

    def matching(self, pattern: str, timeout: float) -> list[str]:
        """The topics whose names match ``pattern`` (a subscription regex) now."""
        names = self._admin.list_topics(timeout=timeout).topics
        regex = re.compile(pattern)
        return sorted(t for t in names if regex.match(t))

    def end_offsets(self, pattern: str, timeout: float) -> dict[Key, int]:
        """``{(topic, partition): end offset}`` of every partition of the topics that match
        ``pattern`` and hold messages; raises ``KafkaException`` when no broker answers."""
        from confluent_kafka import TopicPartition
        from confluent_kafka.admin import OffsetSpec

        metadata = self._admin.list_topics(timeout=timeout)
        regex = re.compile(pattern)
        parts = [
            TopicPartition(name, p)
            for name, topic in metadata.topics.items()
            if regex.match(name) and topic.error is None
            for p in topic.partitions
        ]
        if not parts:
            return {}
        low, high = (self._offsets(parts, spec, timeout)
                     for spec in (OffsetSpec.earliest(), OffsetSpec.latest()))  # fmt: skip
        return {key: end for key, end in high.items() if end > low[key]}

    def _offsets(self, parts: list, spec, timeout: float) -> dict[Key, int]:
        futures = self._admin.list_offsets({tp: spec for tp in parts}, request_timeout=timeout)
        return {(tp.topic, tp.partition): f.result(timeout).offset for tp, f in futures.items()}

    def recreated(self, topics: Iterable[str], timeout: float) -> dict[str, tuple[str, str]]:
        """``{topic: (old id, new id)}`` for each of ``topics`` whose id changed since it
        was first seen here.  A topic that is gone (deleted, not yet created again) keeps
        its old id; one the brokers do not answer for is left for the next call."""
        from confluent_kafka import KafkaException, TopicCollection

        topics = sorted(set(topics))
        if not topics:
            return {}
        futures = self._admin.describe_topics(TopicCollection(topics), request_timeout=timeout)
        changed = {}
        for topic, future in futures.items():
            try:
                now = str(future.result(timeout).topic_id)
            except KafkaException as exc:  # gone, or not answered: ask again next time
                log.debug("describing topic %s: %s", topic, exc)
                continue
            seen = self._ids.setdefault(topic, now)
            if seen != now:
                changed[topic] = (seen, now)
                self._ids[topic] = now
        return changed
