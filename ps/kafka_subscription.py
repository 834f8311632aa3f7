"""Which topics an update consumer subscribes to, and when that changes.

A consumer reads the topics of the models this server serves (``expects()``: the models of
its ``ps.json``, and those committed in its parameter server; the repository loader's set
grows when a version is loaded from a ``ps.json`` that names more models) that its level's ``update_filters`` match, and no
other: a server on brokers shared with other deployments never fetches their updates (a
new replica reads its own models' topics from their start, HugeCTR's semantics, and would
otherwise read and skip every other model's backlog first).  :class:`ServedTopics` holds
that set and its subscription pattern (:func:`~tierserve.ps.kafka_groups.subscription`);
the consumer's loop calls :meth:`ServedTopics.refresh` between batches and subscribes again
when the pattern changed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from .kafka_groups import served_models, subscription


class ServedTopics:
    """The served models a level's ``filters`` match, as ``expects()`` names them now, and
    the subscription pattern of their topics (None: no model to read)."""

    def __init__(self, filters: list[str], expects: Callable[[], Iterable[str]]) -> None:
        self.filters = list(filters)
        self._expects = expects
        self._seen = frozenset(expects())
        self.models = frozenset(served_models(self.filters, self._seen))
        self.pattern = subscription(self.filters, self.models)

    def refresh(self) -> tuple[frozenset[str], frozenset[str]] | None:
        """Read ``expects()`` again: ``(added, removed)`` served models when the subscription
        changed, else None."""
        expected = frozenset(self._expects())
        if expected == self._seen:
            return None
        self._seen = expected
        models = frozenset(served_models(self.filters, expected))
        if models == self.models:
            return None
        added, removed = models - self.models, self.models - models
        self.models = models
        self.pattern = subscription(self.filters, models)
        return added, removed

    def pattern_of(self, models: Iterable[str]) -> str | None:
        """The subscription pattern of ``models`` alone (those the filters match)."""
        return subscription(self.filters, models)
