"""Server settings: one pydantic object that the CLI, tests and the app factory share.

Safe by default: it binds to 127.0.0.1, caps request sizes, and protects the repository's
load and unload with a bearer token when ``admin_token`` is set (also read from the
``TIERSERVE_ADMIN_TOKEN`` environment variable by :meth:`Settings.from_env`).
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from tierserve.core.errors import ConfigError
from tierserve.ps.config import format_validation_errors

Port = Annotated[int, Field(ge=0, le=65535)]


class Settings(BaseModel):
    """Everything the server needs to start; see the field descriptions."""

    model_config = ConfigDict(extra="forbid")

    model_repository: Path | None = Field(
        None, description="folder of <model>/<version>/ folders plus ps.json"
    )
    config: Path | None = Field(None, description="a ps.json whose models are served as version 1")
    host: str = Field("127.0.0.1", description="address to bind; 0.0.0.0 exposes the server")
    http_port: Port = 8000
    grpc_port: Port | None = Field(8001, description="None: no gRPC server")
    admin_token: str | None = Field(
        None, description="bearer token required by repository load and unload"
    )
    max_request_bytes: Annotated[int, Field(gt=0)] = 64 * 1024 * 1024
    max_keys_per_request: Annotated[int, Field(gt=0)] | None = Field(
        None,
        description="most keys one infer request may carry; None: each model's own, "
        "max_batch_size x the sum of its maxnum_catfeature_query_per_table_per_sample",
    )
    max_keys_per_row: Annotated[int, Field(gt=0)] | None = Field(
        None,
        description="most keys one row may give one table (multi-hot requests with ROWINDEX); "
        "None: each table's maxnum_catfeature_query_per_table_per_sample",
    )
    allow_nonfinite_inputs: bool = Field(
        False,
        description="accept NaN and infinite floats (and JSON numbers beyond FP32) in inputs; "
        "by default they are refused with a 400 naming the input",
    )
    header_timeout_s: Annotated[float, Field(gt=0)] = Field(
        10.0,
        description="an HTTP connection whose request headers are not all in within this many "
        "seconds of its first byte (or of opening) is closed",
    )
    body_timeout_s: Annotated[float, Field(gt=0)] = Field(
        60.0,
        description="an HTTP request whose body is not all in within this many seconds of its "
        "headers is closed",
    )
    keep_alive_timeout_s: Annotated[float, Field(gt=0)] = Field(
        5.0, description="an HTTP connection idle this many seconds between requests is closed"
    )
    max_header_bytes: Annotated[int, Field(ge=1024)] = Field(
        64 * 1024,
        description="most bytes an HTTP request's request line and headers may take (and "
        "gRPC's header list); over it: 414 when the URL alone is too long, else 431",
    )
    max_header_count: Annotated[int, Field(gt=0)] = Field(
        100, description="most header lines one HTTP request may have; over it: 431"
    )
    max_inflight_bytes: Annotated[int, Field(gt=0)] = Field(
        512 * 1024 * 1024,
        description="most request bytes one worker process holds at once, over HTTP and gRPC "
        "together (bodies being read and requests not yet answered); a request that does not "
        "fit waits up to admission_timeout_s, then gets 503 / RESOURCE_EXHAUSTED",
    )
    max_inflight_calls: Annotated[int, Field(gt=0)] = Field(
        1024,
        description="most requests one worker process holds at once, over HTTP and gRPC "
        "together; more wait up to admission_timeout_s, then get 503 / RESOURCE_EXHAUSTED",
    )
    max_connection_bytes: Annotated[int, Field(gt=0)] = Field(
        128 * 1024 * 1024,
        description="most request bytes one gRPC connection holds at once, over all its "
        "streams (an HTTP/1.1 connection holds one request: max_request_bytes)",
    )
    admission_timeout_s: Annotated[float, Field(gt=0)] = Field(
        5.0,
        description="how long a request waits for room under max_inflight_bytes, "
        "max_inflight_calls or max_connection_bytes before it is refused",
    )
    grpc_idle_timeout_s: Annotated[float, Field(gt=0)] = Field(
        60.0,
        description="a gRPC connection without a call for this many seconds is closed (GOAWAY); "
        "one that has not sent the HTTP/2 preface within header_timeout_s is dropped",
    )
    max_connections: Annotated[int, Field(gt=0)] = Field(
        4096,
        description="most open connections of each transport (HTTP, gRPC) in one worker "
        "process; more are closed at once (HTTP answers 503 first)",
    )
    descriptor_reserve: Annotated[int, Field(ge=0)] = Field(
        64,
        description="file descriptors kept free for health, model loads and the repository "
        "poller: gRPC refuses new connections once fewer than this many are free, HTTP once "
        "fewer than half of them are",
    )
    event_loop: Literal["auto", "asyncio", "uvloop"] = Field(
        "auto",
        description="the event loop HTTP and gRPC share; auto: uvloop when installed (about "
        "15% less CPU per request), else asyncio",
    )
    grpc_transport: Literal["auto", "native", "python"] = Field(
        "auto",
        description="what carries gRPC: native, HTTP/2 and gRPC framing in Rust threads "
        "(the tierserve-native package) with calls handed to the event loop in batches; "
        "python, grpc.aio; auto: native when installed",
    )
    dynamic_batching: bool = True
    max_batch_delay_ms: Annotated[float, Field(ge=0)] = 1.0
    poll_interval_s: Annotated[float, Field(ge=0)] = Field(
        2.0, description="how often the repository is rescanned for new versions; 0: never"
    )
    threads: Annotated[int, Field(gt=0)] = Field(
        4, description="inference threads of each worker process"
    )
    workers: Annotated[int, Field(gt=0)] | None = Field(
        None,
        description="worker processes serving the same ports (SO_REUSEPORT); None: one per "
        "core, at most max_workers, and one when the tiers cannot be shared (see "
        "server/workers.py)",
    )
    max_workers: Annotated[int, Field(gt=0)] = Field(
        8, description="the most worker processes the default (one per core) starts"
    )
    pin_workers: bool = Field(
        True,
        description="run each worker process on its own share of the cores (CPU affinity; "
        "see server/workers.py); False leaves placement to the scheduler",
    )
    shutdown_grace_s: Annotated[float, Field(ge=0)] = Field(
        30.0,
        description="on SIGTERM, how long requests in flight may take to finish before the "
        "workers are killed",
    )
    malloc_tuning: bool = Field(
        True,
        description="serve() raises glibc's mmap and trim thresholds to 1 GiB (see "
        "server/allocator.py): large batches stop page-faulting their buffers in again",
    )
    log_level: str = "info"

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, values: Any) -> Any:
        if isinstance(values, dict) and "worker_threads" in values:
            warnings.warn(
                "the server setting worker_threads is now threads (workers counts worker "
                "processes); worker_threads goes in the next release",
                DeprecationWarning,
                stacklevel=4,
            )
            values = dict(values)
            threads = values.pop("worker_threads")
            values.setdefault("threads", threads)
        return values

    @model_validator(mode="after")
    def _one_source(self) -> Settings:
        if self.model_repository is not None and self.config is not None:
            raise ValueError("give either model_repository or config, not both")
        return self

    @model_validator(mode="after")
    def _room_for_a_request(self) -> Settings:
        for name in ("max_inflight_bytes", "max_connection_bytes"):
            if getattr(self, name) < self.max_request_bytes:
                raise ValueError(
                    f"{name} ({getattr(self, name)}) is below max_request_bytes "
                    f"({self.max_request_bytes}): a request of the largest size allowed would "
                    f"never find room; raise {name} or lower max_request_bytes"
                )
        return self

    @field_validator("admin_token")
    @classmethod
    def _token_not_empty(cls, token: str | None) -> str | None:
        if token is not None and not token.strip():
            raise ValueError("is empty: an empty token would protect nothing; give one or none")
        return token

    @classmethod
    def build(cls, **values: Any) -> Settings:
        """Validate ``values``; errors name every bad field (:class:`ConfigError`)."""
        try:
            return cls(**values)
        except ValidationError as exc:
            raise ConfigError(format_validation_errors(exc, "server settings")) from None

    @classmethod
    def from_env(cls, **values: Any) -> Settings:
        """Like :meth:`build`, taking ``admin_token`` from ``TIERSERVE_ADMIN_TOKEN`` if unset
        (set but empty is refused, as an empty ``admin_token`` is)."""
        if values.get("admin_token") is None and "TIERSERVE_ADMIN_TOKEN" in os.environ:
            values["admin_token"] = os.environ["TIERSERVE_ADMIN_TOKEN"]
        return cls.build(**values)
