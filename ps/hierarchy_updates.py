"""The write path of :class:`~tierserve.ps.hierarchy.HierarchicalParameterServer`: inserts
and online updates (to the committed version and every staged one, in the tiers whose
``update_filters`` match), admission of new ids (``min_update_count``), evictions, and the
update listeners (embedding caches) told of each write."""

from __future__ import annotations

import logging
import re
import threading

import numpy as np

from tierserve.core.errors import InvalidInputError

from .id_admission import UpdateAdmission
from .served_model import ServedModel, TableSpec
from .table_tag import parse_table_tag
from .tier import Tier

log = logging.getLogger("tierserve.ps.hierarchy")


class UpdatePath:
    """Writes, admission, evictions and update listeners (a part of
    :class:`~tierserve.ps.hierarchy.HierarchicalParameterServer`, which sets the state
    below and provides the lookup path's ``_acquire`` and ``_keys``)."""

    tiers: dict[str, Tier]
    _filters: dict[str, list[re.Pattern]]
    _staged: dict[str, list[ServedModel]]
    _listeners: list
    _listener_lock: threading.Lock
    _load_lock: threading.Lock
    _admission: dict[tuple, UpdateAdmission]

    def update_filters(self, level: str) -> list[str]:
        """The ``update_filters`` regular expressions of tier level ``volatile``/``persistent``."""
        return [f.pattern for f in self._filters[level]]

    def accepts_updates(self, level: str, model: str) -> bool:
        """Whether tier ``level`` takes online updates of ``model`` (its filters match)."""
        tier = self.tiers.get(level)
        if tier is None or tier.read_only:
            return False
        return any(f.fullmatch(model) for f in self._filters[level])

    def insert(
        self, model: str | ServedModel, table: str, keys, embeddings, *, level: str | None = None
    ) -> None:
        """Write embeddings into the served version of ``model``'s ``table``.

        ``level`` limits the write to one tier (``"volatile"`` or ``"persistent"``); by
        default every tier whose ``update_filters`` match the model name is written.  The
        committed version and every staged one are written.  A tier that cannot be reached
        raises :class:`BackendUnavailableError` (retryable).
        """
        m = self._acquire(model)
        staged = [s for s in self._staged.get(m.name, ()) if s.acquire()]
        try:
            specs = list({v.table(table).storage: v.table(table) for v in (m, *staged)}.values())
            keys = self._keys(keys)
            rows = _encode_for(specs, keys, embeddings, f"update of {m.name}.{table}")
            levels = [level] if level is not None else list(self.tiers)
            written = []
            for lv in levels:
                if lv not in self._filters:
                    raise InvalidInputError(f"level must be volatile or persistent, got {lv!r}")
                if self.accepts_updates(lv, m.name):
                    for spec in specs:
                        self.tiers[lv].insert(spec.storage, keys, rows[spec.codec.dtype])
                    written.append(lv)
        finally:
            for v in (m, *staged):
                v.release()
        model = m.name
        if written:
            # Listeners get the new vectors only when lookup is sure to return them (every
            # tier written); otherwise they must drop the rows and read them again.
            # They get what a lookup returns: the stored rows, decoded.
            full = set(written) == set(self.tiers)
            stored = specs[0].codec.decode(rows[specs[0].codec.dtype]) if full else None
            self._notify(model, table, keys, stored)

    update = insert

    def apply_update(self, tag: str, keys, embeddings, *, level: str | None = None) -> None:
        """:meth:`insert` addressed by table tag ``hps_et.<model>.<table>`` (a Kafka topic).

        With the table's ``min_update_count`` above 1, updates of ids that no tier written
        here stores yet are held back until the id has that many
        (:mod:`tierserve.ps.id_admission`); the tiers count admitted and held-back keys.
        """
        model, table = parse_table_tag(tag)
        admitted = self._admit(model, table, keys, embeddings, level)
        if admitted is None:
            self.insert(model, table, keys, embeddings, level=level)
            return
        rule, keys, stored, admit, stats = admitted
        if admit.any():
            self.insert(model, table, keys[admit], np.asarray(embeddings)[admit], level=level)
        rule.record(keys, ~admit)
        for st in stats:
            st.admitted += int(np.count_nonzero(admit & ~stored))
            st.held_back += int(np.count_nonzero(~admit))

    def _admit(self, model: str, table: str, keys, embeddings, level: str | None):
        """``(rule, keys, stored, admitted, tier stats)`` for a table with an admission rule (its
        ids stored in no tier this update writes count as new); None for one without."""
        m = self._acquire(model)
        try:
            spec = m.table(table)
            count = m.config.min_update_count[list(m.tables).index(table)]
            if count <= 1:
                return None
            keys = self._keys(keys)
            emb = np.asarray(embeddings)
            if emb.ndim != 2 or emb.shape[0] != keys.size:
                return None  # insert refuses it
            levels = [level] if level is not None else list(self.tiers)
            tiers = [self.tiers[lv] for lv in levels
                     if lv in self.tiers and self.accepts_updates(lv, m.name)]  # fmt: skip
            if not tiers:
                return None
            stored = np.zeros(keys.size, dtype=bool)
            for tier in tiers:
                stored |= tier.contains(spec.storage, keys)
            with self._load_lock:
                rule = self._admission.get((spec.storage, tuple(levels)))
                if rule is None:
                    rule = UpdateAdmission(count, m.config.admission_sketch_width)
                    self._admission[(spec.storage, tuple(levels))] = rule
        finally:
            m.release()
        return rule, keys, stored, rule.admit(keys, stored), [t.stats for t in tiers]

    def add_update_listener(self, listener) -> None:
        """Call ``listener(model, table, keys, embeddings)`` after each insert or evict.

        It runs after the tiers were written and before ``insert``/``evict`` returns, holding
        no lock of this server; ``embeddings`` is ``None`` when the listener must drop the
        keys rather than take new vectors (evictions, partial writes).  Embedding caches use
        it so that no lookup after an update returns the old vector.
        """
        with self._listener_lock:
            self._listeners = [*self._listeners, listener]

    def remove_update_listener(self, listener) -> None:
        """Stop calling ``listener``."""
        with self._listener_lock:
            self._listeners = [fn for fn in self._listeners if fn != listener]

    def _notify(self, model: str, table: str, keys: np.ndarray, embeddings) -> None:
        for listener in self._listeners:
            try:
                listener(model, table, keys, embeddings)
            except Exception:
                log.exception("update listener %r failed for %s/%s", listener, model, table)

    def notify_update(self, tag: str, keys, embeddings=None) -> None:
        """Tell the update listeners that ``keys`` of table ``tag`` (``hps_et.<model>.<table>``)
        changed in a shared tier that another replica wrote; no tier is written here.
        ``embeddings`` as for :meth:`add_update_listener` (``None``: drop the keys)."""
        model, table = parse_table_tag(tag)
        self._notify(model, table, np.asarray(keys, np.int64).reshape(-1), embeddings)

    def evict(self, model: str | ServedModel, table: str, keys) -> None:
        """Remove ``keys`` from every writable tier (they then read as defaults)."""
        m = self._acquire(model)
        try:
            spec = m.table(table)
            keys = self._keys(keys)
            for tier in self.tiers.values():
                if not tier.read_only:
                    tier.evict(spec.storage, keys)
        finally:
            m.release()
        model = m.name
        self._notify(model, table, keys, None)


def _encode_for(specs: list[TableSpec], keys: np.ndarray, embeddings, what: str) -> dict:
    """The stored rows of ``embeddings`` for each layout among ``specs`` (by dtype); a value
    a layout cannot hold is refused before anything is written."""
    emb = np.asarray(embeddings)
    if emb.ndim != 2 or emb.shape[0] != keys.size:
        raise InvalidInputError(
            f"embeddings for {what} must have shape [{keys.size}, {specs[0].dim}], "
            f"got {list(emb.shape)}"
        )
    return {s.codec.dtype: s.codec.encode(emb, what) for s in specs}
