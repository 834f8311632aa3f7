"""The ``ps.json`` settings of the Redis volatile tiers: :class:`RedisClusterConfig`
(``redis_cluster``, HugeCTR's) and :class:`RedisConfig` (standalone ``redis``, ours), with
the fields both share (:class:`RedisTierConfig`).  The tier itself is
:class:`tierserve.ps.redis_tier.RedisTier`."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from tierserve.core.compat import warn_once

from .config_base import (
    DatabaseType_t,
    NonNegativeInt,
    PositiveInt,
    VolatileConfig,
    default_num_partitions,
    quiet,
)


class RedisTierConfig(VolatileConfig):
    """Settings of both Redis tiers.

    HugeCTR's fields, plus ours for failing servers (HugeCTR has none):

    - ``socket_timeout_ms`` (5000): how long one call to a node may wait for its reply.
    - ``connect_timeout_ms`` (1000): how long opening a connection to a node may take.
    - ``max_retries`` (0): how many times a call that failed on the network (refused, reset,
      timed out) is repeated on the same node, after 10, 20, 40 ... ms (at most 1 s), before
      the node counts as failed (equal jitter: each wait is between half and all of it).  A frozen node costs a call up to
      ``(1 + max_retries) * socket_timeout_ms``.
    - ``failure_threshold`` (3): after this many failed calls in a row a node is skipped: its
      keys read as not found (the next tier or the default vector answers, counted in
      ``tierserve_tier_skipped``) without being asked for.
    - ``failure_backoff_ms`` (1000) / ``max_failure_backoff_ms`` (10000): how long a node is
      skipped; the back-off doubles with every probe that fails again, up to the maximum.
      After the back-off one call probes the node while the others still skip it; skipped
      writes raise a retryable error at once, as writes to an unreachable node do.
    - ``refill_interval_ms`` (1000): how often each served table's partitions are checked for
      a node that came back empty (restarted without persistence); such partitions are
      refilled in the background from the persistent tier, or from the model files, as at
      startup.  Only with ``initialize_after_startup``; 0 turns the check off.
    """

    user_name: str = "default"
    password: str = ""
    num_partitions: PositiveInt = Field(default_factory=default_num_partitions)
    enable_tls: bool = False
    tls_ca_certificate: str = "cacertbundle.crt"
    tls_client_certificate: str = "client_cert.pem"
    tls_client_key: str = "client_key.key"
    tls_server_name_identification: str = "redis.localhost"
    socket_timeout_ms: PositiveInt = 5000
    connect_timeout_ms: PositiveInt = 1000
    max_retries: Annotated[int, Field(ge=0, le=100)] = 0
    failure_threshold: PositiveInt = 3
    failure_backoff_ms: PositiveInt = 1000
    max_failure_backoff_ms: PositiveInt = 10000
    refill_interval_ms: NonNegativeInt = 1000

    @model_validator(mode="after")
    def _sni(self, info: ValidationInfo) -> RedisTierConfig:
        if quiet(info):
            return self
        if self.enable_tls and self.tls_server_name_identification != "redis.localhost":
            warn_once("tls_server_name_identification", "redis-py sends each node's host name "
                      "as the TLS server name; the setting is not used", stacklevel=2)
        return self

    @model_validator(mode="after")
    def _backoff_range(self) -> RedisTierConfig:
        if self.max_failure_backoff_ms < self.failure_backoff_ms:
            raise ValueError(
                f"max_failure_backoff_ms ({self.max_failure_backoff_ms}) must be at least "
                f"failure_backoff_ms ({self.failure_backoff_ms})"
            )
        return self


class RedisClusterConfig(RedisTierConfig):
    """An existing Redis Cluster; ``address`` lists seed nodes ``host:port[,host:port...]``.

    ``topology_refresh_ms`` (500): while calls to a node fail, are skipped or are redirected
    (``MOVED``), the slot map is read again in the background at most this often, so a
    replica the cluster promoted in place of a dead master is used within this time.
    """

    type: Literal[DatabaseType_t.redis_cluster] = DatabaseType_t.redis_cluster
    address: str = "127.0.0.1:7000"
    topology_refresh_ms: PositiveInt = 500

    @field_validator("address")
    @classmethod
    def _addresses(cls, value: str) -> str:
        for node in re.split(r"[;,]", value):
            host, sep, port = node.strip().rpartition(":")
            if not sep or not host or not port.isdigit():
                raise ValueError(f"{node!r} is not host:port")
        return value


class RedisConfig(RedisTierConfig):
    """A standalone Redis server: ``address`` is a ``redis://`` URL or ``host:port``."""

    type: Literal[DatabaseType_t.redis] = DatabaseType_t.redis
    address: str = "127.0.0.1:6379"
