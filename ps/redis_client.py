"""The redis-py client of a Redis tier: opened from the tier's config, with the connection
settings it gives (timeouts, credentials, TLS) and no retries of redis-py's own (the tier
retries, :mod:`tierserve.ps.redis_tier`)."""

from __future__ import annotations

from typing import Any


def network_errors(redis) -> tuple[type[BaseException], ...]:
    """The exceptions of ``redis`` (the module) that mean a node could not be reached or
    answered for now: retried, counted against the node's breaker."""
    e = redis.exceptions
    return (
        e.ConnectionError,
        e.TimeoutError,
        e.ClusterDownError,
        e.BusyLoadingError,
        e.TryAgainError,
        e.MovedError,
        e.AskError,
        OSError,
    )


def connection_kwargs(config) -> dict[str, Any]:
    """redis-py's connection settings from a Redis tier config (milliseconds to seconds)."""
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    # Retries are the tier's, the same for a cluster's nodes and a standalone server.
    kwargs: dict[str, Any] = {
        "socket_timeout": config.socket_timeout_ms / 1000.0,
        "socket_connect_timeout": config.connect_timeout_ms / 1000.0,
        "retry": Retry(NoBackoff(), 0),
    }
    if config.password:
        kwargs["username"] = config.user_name or None
        kwargs["password"] = config.password
    if config.enable_tls:
        kwargs.update(
            ssl=True,
            ssl_ca_certs=config.tls_ca_certificate,
            ssl_certfile=config.tls_client_certificate,
            ssl_keyfile=config.tls_client_key,
            ssl_check_hostname=False,
        )
    return kwargs


def open_client(redis, config):
    """A ``RedisCluster`` over the seed nodes of a ``redis_cluster`` config's ``address``, or a
    ``Redis`` (pinged) for a standalone ``redis`` one (a URL or ``host:port``)."""
    kwargs = connection_kwargs(config)
    if config.type.value == "redis_cluster":
        from redis.cluster import ClusterNode, RedisCluster

        nodes = []
        for part in config.address.replace(";", ",").split(","):
            host, _, port = part.strip().rpartition(":")
            nodes.append(ClusterNode(host, int(port)))
        return RedisCluster(startup_nodes=nodes, require_full_coverage=False, **kwargs)
    address = config.address
    if "://" in address:
        client = redis.Redis.from_url(address, **kwargs)
    else:
        host, _, port = address.rpartition(":")
        client = redis.Redis(host=host or "127.0.0.1", port=int(port), **kwargs)
    client.ping()
    return client
