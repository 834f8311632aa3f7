"""Server settings: one pydantic object that the CLI, tests and the app factory share.

Safe by default: it binds to 127.0.0.1, caps request sizes, and protects the repository's
load and unload with a bearer token when ``admin_token`` is set (also read from the
``TIERSERVE_ADMIN_TOKEN`` environment variable by :meth:`Settings.from_env`).

Each field is declared once, here: its type, default and description are also its
``tierserve serve`` option (``tierserve.clients.settings_options`` builds the parser from
them), so adding a setting is adding a field.  A :class:`Cli` marker in a field's
annotations says how the option reads where the rule (``--`` + the name with ``_`` as ``-``,
less a trailing ``_s``) is not enough.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
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
from tierserve.ps.config_base import format_validation_errors
from tierserve.server.logs import LogLevel


@dataclass(frozen=True)
class Cli:
    """How a setting reads as a command-line option, where the rule is not enough.

    ``flag``: the option (default ``--`` + the field name with ``_`` as ``-``, less a
    trailing ``_s``); ``metavar``: the value's unit or kind (default from the name's unit
    suffix or the type); ``scale``: the setting is the option's value times this (the byte
    settings are given in MiB); ``none_flag`` / ``none_help``: a second option that sets
    the setting to None; ``env``: an environment variable :meth:`Settings.from_env` reads
    when the setting is not given.
    """

    flag: str | None = None
    metavar: str | None = None
    scale: int = 1
    none_flag: str | None = None
    none_help: str | None = None
    env: str | None = None


MiB = 1024 * 1024
Port = Annotated[int, Field(ge=0, le=65535), Cli(metavar="PORT")]


class Settings(BaseModel):
    """Everything the server needs to start; see the field descriptions."""

    model_config = ConfigDict(extra="forbid")

    model_repository: Annotated[Path | None, Cli(metavar="DIR")] = Field(
        None, description="model repository: a folder of <model>/<version>/ folders plus ps.json"
    )
    config: Annotated[Path | None, Cli(metavar="PS_JSON")] = Field(
        None, description="a ps.json whose models are served as version 1"
    )
    host: str = Field("127.0.0.1", description="address to bind; 0.0.0.0 exposes the server")
    http_port: Port = Field(8000, description="HTTP port")
    grpc_port: Annotated[Port | None, Cli(none_flag="--no-grpc", none_help="serve HTTP only")] = (
        Field(8001, description="gRPC port; None (--no-grpc): no gRPC server")
    )
    admin_token: Annotated[str | None, Cli(metavar="TOKEN", env="TIERSERVE_ADMIN_TOKEN")] = Field(
        None,
        description="bearer token required by repository load and unload; none: anyone who "
        "can reach the port may load and unload",
    )
    max_request_bytes: Annotated[int, Field(gt=0), Cli(flag="--max-request-mb", scale=MiB)] = Field(
        64 * MiB,
        description="largest request body or gRPC message accepted (413 / "
        "RESOURCE_EXHAUSTED), compressed or inflated",
    )
    max_keys_per_request: Annotated[int, Field(gt=0)] | None = Field(
        None,
        description="most keys one infer request may carry; unset: each model's own, "
        "max_batch_size x the sum of its maxnum_catfeature_query_per_table_per_sample",
    )
    max_keys_per_row: Annotated[int, Field(gt=0)] | None = Field(
        None,
        description="most keys one row may give one table (multi-hot requests with ROWINDEX); "
        "unset: each table's maxnum_catfeature_query_per_table_per_sample",
    )
    allow_nonfinite_inputs: bool = Field(
        False,
        description="accept NaN and infinite floats (and JSON numbers beyond FP32) in inputs, "
        "and answer null in JSON where an output is NaN or infinite; off: they are refused "
        "with a 400 naming the input",
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
    max_inflight_bytes: Annotated[int, Field(gt=0), Cli(flag="--max-inflight-mb", scale=MiB)] = (
        Field(
            512 * MiB,
            description="most request bytes one worker process holds at once, over HTTP and gRPC "
            "together (bodies being read and requests not yet answered); a request that does not "
            "fit waits up to admission_timeout_s, then gets 503 / RESOURCE_EXHAUSTED",
        )
    )
    max_inflight_calls: Annotated[int, Field(gt=0)] = Field(
        1024,
        description="most requests one worker process holds at once, over HTTP and gRPC "
        "together; more wait up to admission_timeout_s, then get 503 / RESOURCE_EXHAUSTED",
    )
    max_connection_bytes: Annotated[
        int, Field(gt=0), Cli(flag="--max-connection-mb", scale=MiB)
    ] = Field(
        128 * MiB,
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
    http_transport: Literal["auto", "native", "python"] = Field(
        "auto",
        description="what carries HTTP: native, HTTP/1.1 in Rust threads (the tierserve-native "
        "package, on hyper) with infer requests parsed and decoded there and every request handed to "
        "the event loop in batches; python, uvicorn; auto: native when installed",
    )
    dynamic_batching: bool = Field(
        True,
        description="merge concurrent requests to one model into one batch; off: every "
        "request runs on its own",
    )
    max_batch_delay_ms: Annotated[float, Field(ge=0)] = Field(
        1.0,
        description="how long a batch may wait for more requests under load (a lone request "
        "on an idle server never waits)",
    )
    poll_interval_s: Annotated[float, Field(ge=0)] = Field(
        2.0, description="how often the repository is rescanned for new versions; 0: never"
    )
    threads: Annotated[int, Field(gt=0)] = Field(
        4, description="inference threads of each worker process"
    )
    workers: Annotated[int, Field(gt=0)] | None = Field(
        None,
        description="worker processes serving the same ports (SO_REUSEPORT), each running "
        "`threads` inference threads; unset: one per core, at most max_workers, and one when "
        "ps.json's tiers cannot be shared (a writable RocksDB, Redis; see server/workers.py)",
    )
    max_workers: Annotated[int, Field(gt=0)] = Field(
        8, description="the most worker processes the default (one per core) starts"
    )
    pin_workers: bool = Field(
        True,
        description="run each worker process on its own share of the cores (CPU affinity; "
        "see server/workers.py); off leaves placement to the scheduler",
    )
    shutdown_grace_s: Annotated[float, Field(ge=0)] = Field(
        30.0,
        description="on SIGTERM, how long requests in flight may take to finish before the "
        "workers are killed",
    )
    malloc_tuning: bool = Field(
        True,
        description="raise glibc malloc's mmap and trim thresholds to 1 GiB (see "
        "server/runtime/allocator.py): large batches stop page-faulting their buffers in again, "
        "and freed memory stays with the process",
    )
    transparent_hugepages: bool = Field(
        False,
        description="leave transparent huge pages on for the server's process; off by "
        "default (PR_SET_THP_DISABLE, see server/runtime/allocator.py): the kernel's "
        "khugepaged, scanning the process at the lowest priority on a busy machine, froze it "
        "for seconds",
    )
    log_level: LogLevel = Field(
        "info", description="the least severe log lines shown, of tierserve and uvicorn alike"
    )

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
        """Like :meth:`build`, taking each setting with an environment variable
        (:attr:`Cli.env`; ``admin_token`` from ``TIERSERVE_ADMIN_TOKEN``) from it if unset
        (set but empty is refused, as an empty ``admin_token`` is)."""
        for name in cls.model_fields:
            env = cli_of(cls, name).env
            if env and values.get(name) is None and env in os.environ:
                values[name] = os.environ[env]
        return cls.build(**values)


def cli_of(model: type[BaseModel], name: str) -> Cli:
    """The :class:`Cli` marker of field ``name`` of ``model`` (markers nested in its
    annotation, e.g. ``Port | None``, included; the outermost wins), or a blank one."""
    import typing

    field = model.model_fields[name]
    found: list[Cli] = [m for m in field.metadata if isinstance(m, Cli)]
    todo = [field.annotation]
    while todo:
        tp = todo.pop()
        if typing.get_origin(tp) is Annotated:
            found += [m for m in tp.__metadata__ if isinstance(m, Cli)]
        todo += [a for a in typing.get_args(tp) if not isinstance(a, (str, int, float))]
    merged: dict[str, Any] = {}
    for marker in reversed(found):  # inner first, so outer markers override
        merged.update({k: v for k, v in vars(marker).items() if v != getattr(Cli(), k)})
    return Cli(**merged)


def event_loop(settings: Settings) -> str:
    """The event loop for ``settings.event_loop`` (uvicorn's ``loop`` setting; grpc.aio and
    the native transports run on the same loop);
    ``uvloop`` when it is not installed is a :class:`ConfigError` naming the setting."""
    if settings.event_loop == "asyncio":
        return "asyncio"
    try:
        import uvloop  # noqa: F401
    except ImportError:
        if settings.event_loop == "uvloop":
            raise ConfigError(
                "event_loop uvloop: uvloop is not installed (pip install uvloop)"
            ) from None
        return "asyncio"
    return "uvloop"
