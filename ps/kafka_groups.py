"""Who reads which updates: replica identity, consumer group names and the subscription.

- A consumer subscribes to ``^hps_et\\.(<model>|...)\\.<table>$``: the topics of the models
  this server serves (its ``ps.json``'s) that its level's ``update_filters`` (regular
  expressions on model names) match, and no other, so that the updates of other models on
  the same brokers are never fetched: :func:`subscription`.
- Its group is ``hps.<level>`` for a tier shared by every replica (Redis: one replica
  applies each update), ``hps.<level>.<host>`` for the shared-memory map (one process per
  host), else ``hps.<level>.<replica>`` (every replica applies every update): :func:`group_id`.
- The replica id is ``$TIERSERVE_REPLICA_ID`` when set (``tierserve serve --replica-id``
  sets it), else unique per process (host name, process id and a random part), so two
  servers on one host never split the updates of their in-process tiers between them:
  :func:`replica_id`.
"""

from __future__ import annotations

import os
import re
import secrets
import socket
from collections.abc import Iterable

from tierserve.core.errors import ConfigError

from .table_tag import TAG_PREFIX

_NAME_CHARS = "[A-Za-z0-9_-]"  # of a table name (table_tag.NAME_PATTERN)
_SPECIAL = re.compile(r"[\]\[.^$*+?(){}|\\]")  # regex metacharacters (POSIX ERE and Python)
#: The environment variable that names this replica in consumer groups (see replica_id).
REPLICA_ENV = "TIERSERVE_REPLICA_ID"
_REPLICA_PATTERN = re.compile(r"[A-Za-z0-9._-]{1,200}")
_process_replica: str | None = None


def subscription(filters: list[str], models: Iterable[str] | None = None) -> str | None:
    """The topic regex of a level whose ``update_filters`` are ``filters``, for the topics of
    ``models`` (model names) that a filter matches whole; None when none does (nothing to
    read).  ``models=None``: the topics of every model a filter matches.

    librdkafka's regex engine knows neither ``(?:`` nor ``{m,n}``: plain groups only, and the
    model names escaped (a valid name has no special character; one that had is matched
    literally, never as a pattern)."""
    if models is None:
        alternatives = "|".join(f"({f})" for f in filters)
    else:
        names = served_models(filters, models)
        if not names:
            return None
        alternatives = "|".join(_SPECIAL.sub(r"\\\g<0>", name) for name in names)
    return rf"^{TAG_PREFIX}\.({alternatives})\.{_NAME_CHARS}+$"


def served_models(filters: list[str], models: Iterable[str]) -> list[str]:
    """The names among ``models`` that one of ``filters`` matches whole, sorted."""
    compiled = [re.compile(f) for f in filters]
    return sorted({m for m in models if any(f.fullmatch(m) for f in compiled)})


def replica_id() -> str:
    """This process's name in the consumer groups of unshared tiers and of cache invalidation.

    ``$TIERSERVE_REPLICA_ID`` when set (letters, digits, ``.``, ``_``, ``-``); else
    ``<host>-<pid>-<random>``, made once per process, so that two servers on one host are
    two replicas.
    """
    global _process_replica
    configured = os.environ.get(REPLICA_ENV)
    if configured is not None:
        return check_replica_id(configured, REPLICA_ENV)
    if _process_replica is None:
        host = re.sub(r"[^A-Za-z0-9._-]", "_", socket.gethostname()) or "host"
        _process_replica = f"{host}-{os.getpid()}-{secrets.token_hex(3)}"
    return _process_replica


def check_replica_id(value: str, source: str) -> str:
    """``value`` if it can name a replica; else a :class:`ConfigError` naming ``source``."""
    if not _REPLICA_PATTERN.fullmatch(value):
        raise ConfigError(
            f"{source}={value!r}: a replica id is 1 to 200 letters, digits, '.', '_' or '-'"
        )
    return value


def group_id(level: str, shared: bool | str, replica: str | None = None) -> str:
    """``hps.<level>``, plus ``.<replica>`` (default :func:`replica_id`) when the level's tier
    is not ``shared`` between replicas, or ``.<host>`` when it is shared by the processes of
    one host only (``shared == "host"``: multi_process_hash_map)."""
    if shared == "host":
        return f"hps.{level}.{re.sub(r'[^A-Za-z0-9._-]', '_', socket.gethostname()) or 'host'}"
    if shared:
        return f"hps.{level}"
    return f"hps.{level}.{replica or replica_id()}"
