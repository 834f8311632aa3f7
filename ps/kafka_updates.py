"""Online embedding updates over Apache Kafka (docs/formats.md: the update message;
docs/online-learning.md).

A producer (:class:`~tierserve.ps.kafka_producer.UpdateProducer`, the trainer, ``tierserve
publish``) publishes updates, one topic per table tag ``hps_et.<model>.<table>``.  Every
serving replica reads them with the consumers :func:`start_update_consumers` starts for its
parameter server, from its ``ps.json`` ``update_source``:

- one :class:`~tierserve.ps.kafka_apply.UpdateConsumer` per tier level that takes updates
  (not read-only, with ``update_filters``), which applies them to that tier;
- with a tier shared by the replicas (Redis), also an
  :class:`~tierserve.ps.kafka_invalidate.InvalidationConsumer`, which drops the updated keys
  from this replica's caches once the applying group wrote them.

Both run the loop of :mod:`tierserve.ps.kafka_consumer`; who reads what (replica identity,
group names, the subscription) is :mod:`tierserve.ps.kafka_groups`; the client settings are
:mod:`tierserve.ps.kafka_source`'s.  confluent-kafka is the client (extra ``kafka``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from .kafka_apply import UpdateConsumer
from .kafka_consumer import ConsumerLoop
from .kafka_invalidate import InvalidationConsumer
from .kafka_source import KafkaUpdateSourceConfig

log = logging.getLogger(__name__)


def start_update_consumers(ps, source, replica: str | None = None, *,
                           expects: Callable[[], Iterable[str]] | None = None,
                           ) -> list[ConsumerLoop]:
    """The running consumers of a parameter server whose ``ps.json`` ``update_source`` is
    ``source``: one :class:`UpdateConsumer` per tier level that takes updates, plus an
    :class:`InvalidationConsumer` for each of those levels whose tier is shared.  None when
    ``source`` is not a Kafka one.  ``expects()``: the models the server serves (default: those of ``ps.config``); the
    consumers read only their topics (:mod:`tierserve.ps.kafka_subscription`)."""
    if not isinstance(source, KafkaUpdateSourceConfig):
        return []
    consumers: list[ConsumerLoop] = []
    try:
        for level, tier in ps.tiers.items():
            if tier.read_only or not ps.update_filters(level):
                continue
            consumers.append(UpdateConsumer(ps, source, level, replica, expects=expects).start())
            if tier.shared:
                consumers.append(
                    InvalidationConsumer(ps, source, level, replica, expects=expects).start()
                )
    except BaseException:
        for consumer in consumers:
            consumer.close()
        raise
    for consumer in consumers:
        log.info("kafka updates: %s %s tier reads %s as group %s", type(consumer).__name__,
                 consumer.level, consumer.pattern, consumer.group)  # fmt: skip
    return consumers
