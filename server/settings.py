"""Server settings: one pydantic object that the CLI, tests and the app factory share.

Safe by default: it binds to 127.0.0.1, caps request sizes, and protects the repository's
load and unload with a bearer token when ``admin_token`` is set (also read from the
``TIERSERVE_ADMIN_TOKEN`` environment variable by :meth:`Settings.from_env`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from tierserve.ps.config import format_validation_errors
from tierserve.ps.errors import ConfigError

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
    max_keys_per_request: Annotated[int, Field(gt=0)] = 1 << 22
    dynamic_batching: bool = True
    max_batch_delay_ms: Annotated[float, Field(ge=0)] = 1.0
    poll_interval_s: Annotated[float, Field(ge=0)] = Field(
        2.0, description="how often the repository is rescanned for new versions; 0: never"
    )
    worker_threads: Annotated[int, Field(gt=0)] = 4
    malloc_tuning: bool = Field(
        True,
        description="serve() raises glibc's mmap and trim thresholds to 1 GiB (see "
        "server/allocator.py): large batches stop page-faulting their buffers in again",
    )
    log_level: str = "info"

    @model_validator(mode="after")
    def _one_source(self) -> Settings:
        if self.model_repository is not None and self.config is not None:
            raise ValueError("give either model_repository or config, not both")
        return self

    @classmethod
    def build(cls, **values: Any) -> Settings:
        """Validate ``values``; errors name every bad field (:class:`ConfigError`)."""
        try:
            return cls(**values)
        except ValidationError as exc:
            raise ConfigError(format_validation_errors(exc, "server settings")) from None

    @classmethod
    def from_env(cls, **values: Any) -> Settings:
        """Like :meth:`build`, taking ``admin_token`` from ``TIERSERVE_ADMIN_TOKEN`` if unset."""
        if values.get("admin_token") is None and os.environ.get("TIERSERVE_ADMIN_TOKEN"):
            values["admin_token"] = os.environ["TIERSERVE_ADMIN_TOKEN"]
        return cls.build(**values)
