"""``tierserve serve``: serve models over KServe v2 REST (HTTP) and gRPC.

Give a model repository, a folder of ``<model>/<version>/`` folders (graph JSON, dense file,
sparse folders) with a ``ps.json`` beside them for the storage tiers and each model's
settings; the highest version of each model serves, and new versions are picked up while
running.  Or give one ``ps.json`` whose models are served as version 1.

Examples:
  tierserve serve --model-repository models/
  tierserve serve --config models/ps.json --http-port 8080 --grpc-port 8081
  TIERSERVE_ADMIN_TOKEN=secret tierserve serve --model-repository models/ --host 0.0.0.0

Then: curl localhost:8000/v2/health/ready ; curl localhost:8000/v2/models/<model>
"""

from __future__ import annotations

import argparse
import logging
import os
import sys


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "serve",
        help="serve models over HTTP and gRPC (KServe v2 / Triton protocol)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--model-repository", metavar="DIR", help="model repository folder")
    source.add_argument(
        "--config", metavar="PS_JSON", help="a ps.json; its models serve as version 1"
    )
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to bind (default 127.0.0.1; 0.0.0.0 exposes the server)",
    )
    parser.add_argument("--http-port", type=int, default=8000, help="HTTP port (default 8000)")
    parser.add_argument("--grpc-port", type=int, default=8001, help="gRPC port (default 8001)")
    parser.add_argument("--no-grpc", action="store_true", help="serve HTTP only")
    parser.add_argument(
        "--admin-token",
        default=None,
        help="bearer token that repository load/unload require (default: $TIERSERVE_ADMIN_TOKEN;"
        " none: anyone who can reach the port may load and unload)",
    )
    parser.add_argument(
        "--max-request-mb",
        type=float,
        default=64.0,
        help="largest request body accepted, in MiB (default 64)",
    )
    parser.add_argument(
        "--max-keys-per-request",
        type=int,
        default=None,
        metavar="N",
        help="most keys one infer request may carry (default: each model's max_batch_size x "
        "the sum of its maxnum_catfeature_query_per_table_per_sample)",
    )
    parser.add_argument(
        "--max-keys-per-row",
        type=int,
        default=None,
        metavar="N",
        help="most keys one row may give one table in a multi-hot (ROWINDEX) request "
        "(default: the table's maxnum_catfeature_query_per_table_per_sample)",
    )
    parser.add_argument(
        "--allow-nonfinite-inputs",
        action="store_true",
        help="accept NaN and infinite floats in inputs (refused with a 400 by default); JSON "
        "answers then carry null where an output is NaN or infinite",
    )
    parser.add_argument(
        "--header-timeout",
        type=float,
        default=10.0,
        metavar="S",
        help="close an HTTP connection whose request headers take longer than this (default 10)",
    )
    parser.add_argument(
        "--body-timeout",
        type=float,
        default=60.0,
        metavar="S",
        help="close an HTTP connection whose request body takes longer than this after its "
        "headers (default 60)",
    )
    parser.add_argument(
        "--max-header-bytes", type=int, default=64 * 1024, metavar="N",
        help="most bytes of an HTTP request line and headers (and of gRPC headers); over it "
        "the request gets 414 (URL) or 431 (default 65536)",
    )  # fmt: skip
    parser.add_argument(
        "--max-header-count", type=int, default=100, metavar="N",
        help="most header lines of an HTTP request; over it: 431 (default 100)",
    )  # fmt: skip
    parser.add_argument(
        "--max-inflight-mb", type=float, default=512.0, metavar="MB",
        help="most MiB of requests one worker holds at once, HTTP and gRPC together; more "
        "wait for room, then get 503 / RESOURCE_EXHAUSTED (default 512)",
    )  # fmt: skip
    parser.add_argument(
        "--max-inflight-calls", type=int, default=1024, metavar="N",
        help="most requests one worker holds at once, HTTP and gRPC together (default 1024)",
    )  # fmt: skip
    parser.add_argument(
        "--max-connection-mb", type=float, default=128.0, metavar="MB",
        help="most MiB of requests one gRPC connection holds at once (default 128)",
    )  # fmt: skip
    parser.add_argument(
        "--admission-timeout", type=float, default=5.0, metavar="S",
        help="how long a request waits for room under the limits above before it is refused "
        "(default 5)",
    )  # fmt: skip
    parser.add_argument(
        "--grpc-idle-timeout", type=float, default=60.0, metavar="S",
        help="close a gRPC connection without a call for this long (default 60)",
    )  # fmt: skip
    parser.add_argument(
        "--max-connections", type=int, default=4096, metavar="N",
        help="most open connections per transport (HTTP, gRPC) and worker (default 4096)",
    )  # fmt: skip
    parser.add_argument(
        "--descriptor-reserve", type=int, default=64, metavar="N",
        help="file descriptors kept free for health, loads and the repository poller: new "
        "connections are refused first (default 64)",
    )  # fmt: skip
    parser.add_argument(
        "--no-dynamic-batching",
        action="store_true",
        help="run every request on its own instead of merging concurrent ones",
    )
    parser.add_argument(
        "--max-batch-delay-ms",
        type=float,
        default=1.0,
        help="how long a batch may wait for more requests under load (default 1)",
    )
    parser.add_argument(
        "--poll-interval",
        type=float,
        default=2.0,
        help="seconds between repository scans for new versions (0: never)",
    )
    parser.add_argument(
        "--workers", type=int, default=None, metavar="N",
        help="worker processes, all serving the same ports (default: one per core, at most "
        "--max-workers; one when ps.json's tiers cannot be shared: a writable RocksDB, Redis); "
        "inference threads per worker are --threads",
    )  # fmt: skip
    parser.add_argument(
        "--max-workers", type=int, default=8, metavar="N",
        help="the most worker processes the default starts (default 8)",
    )  # fmt: skip
    parser.add_argument(
        "--no-pin-workers", action="store_true",
        help="leave worker processes to the scheduler (by default each runs on its own share "
        "of the cores: one core each with one worker per core)",
    )  # fmt: skip
    parser.add_argument(
        "--threads", type=int, default=4, help="inference threads per worker (default 4)"
    )
    parser.add_argument(
        "--shutdown-grace", type=float, default=30.0, metavar="S",
        help="on SIGTERM, seconds requests in flight get to finish before workers are killed "
        "(default 30)",
    )  # fmt: skip
    parser.add_argument(
        "--keep-alive-timeout", type=float, default=5.0, metavar="S",
        help="close an HTTP connection idle this long between requests (default 5)",
    )  # fmt: skip
    parser.add_argument(
        "--event-loop", choices=["auto", "asyncio", "uvloop"], default="auto",
        help="event loop of HTTP and gRPC (default auto: uvloop when installed)",
    )  # fmt: skip
    parser.add_argument(
        "--grpc-transport", choices=["auto", "native", "python"], default="auto",
        help="what carries gRPC: native (Rust HTTP/2, the tierserve-native package), python "
        "(grpc.aio); default auto: native when installed",
    )  # fmt: skip
    parser.add_argument(
        "--blas-threads", type=int, default=None,
        help="BLAS threads per inference thread (default 1, unless OPENBLAS_NUM_THREADS or "
        "OMP_NUM_THREADS is set): the server already runs requests in parallel",
    )  # fmt: skip
    parser.add_argument(
        "--no-malloc-tuning",
        action="store_true",
        help="keep glibc malloc's default mmap and trim thresholds (by default both are raised "
        "to 1 GiB: large batches run faster, and freed memory stays with the process)",
    )
    parser.add_argument(
        "--replica-id",
        default=None,
        help="this server's name in the Kafka consumer groups of online updates; keep it "
        "stable across restarts to resume where the last run stopped (default: "
        "$TIERSERVE_REPLICA_ID, else host-pid-random, so each process is its own replica)",
    )
    parser.add_argument(
        "--log-level", default="info", choices=["debug", "info", "warning", "error"],
        help="the least severe log lines shown, of tierserve and uvicorn alike (default info)",
    )  # fmt: skip
    parser.set_defaults(run=run)


def settings_from_args(args: argparse.Namespace):
    """The server settings the arguments describe."""
    from tierserve.server.settings import Settings

    return Settings.from_env(
        model_repository=args.model_repository,
        config=args.config,
        host=args.host,
        http_port=args.http_port,
        grpc_port=None if args.no_grpc else args.grpc_port,
        admin_token=args.admin_token,
        max_request_bytes=int(args.max_request_mb * 1024 * 1024),
        max_keys_per_request=args.max_keys_per_request,
        max_keys_per_row=args.max_keys_per_row,
        allow_nonfinite_inputs=args.allow_nonfinite_inputs,
        header_timeout_s=args.header_timeout,
        body_timeout_s=args.body_timeout,
        max_header_bytes=args.max_header_bytes,
        max_header_count=args.max_header_count,
        max_inflight_bytes=int(args.max_inflight_mb * 1024 * 1024),
        max_inflight_calls=args.max_inflight_calls,
        max_connection_bytes=int(args.max_connection_mb * 1024 * 1024),
        admission_timeout_s=args.admission_timeout,
        grpc_idle_timeout_s=args.grpc_idle_timeout,
        max_connections=args.max_connections,
        descriptor_reserve=args.descriptor_reserve,
        dynamic_batching=not args.no_dynamic_batching,
        max_batch_delay_ms=args.max_batch_delay_ms,
        poll_interval_s=args.poll_interval,
        threads=args.threads,
        workers=args.workers,
        max_workers=args.max_workers,
        pin_workers=not args.no_pin_workers,
        shutdown_grace_s=args.shutdown_grace,
        keep_alive_timeout_s=args.keep_alive_timeout,
        event_loop=args.event_loop,
        grpc_transport=args.grpc_transport,
        malloc_tuning=not args.no_malloc_tuning,
        log_level=args.log_level,
    )


def limit_blas_threads(threads: int | None) -> None:
    """Give numpy's BLAS ``threads`` threads (None: 1, unless OPENBLAS_NUM_THREADS,
    OMP_NUM_THREADS or MKL_NUM_THREADS is set), in this process and in the worker processes
    it starts; :class:`ConfigError` naming ``--blas-threads`` when it cannot be applied."""
    from tierserve.core.errors import ConfigError

    names = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
    if threads is not None and threads < 1:
        raise ConfigError(f"--blas-threads {threads}: give at least 1")
    asked = threads is not None
    if threads is None:
        if any(n in os.environ for n in names):
            return
        threads = 1
    for name in names:  # read by numpy when first imported (here or in a worker process)
        os.environ[name] = str(threads)
    if "numpy" in sys.modules:
        # Another command's module loaded numpy as the command line was built, so its BLAS
        # already read the environment: set the count at run time.
        from tierserve.trainer.blas_threads import get_blas_threads, set_blas_threads

        if (not set_blas_threads(threads) or get_blas_threads() != threads) and asked:
            raise ConfigError(
                f"--blas-threads {threads}: numpy was loaded first and its BLAS did not take "
                f"a new thread count at run time (it runs {get_blas_threads()}); set "
                f"OPENBLAS_NUM_THREADS/OMP_NUM_THREADS/MKL_NUM_THREADS={threads} instead"
            )


def run(args: argparse.Namespace) -> int:
    limit_blas_threads(args.blas_threads)
    from tierserve.server.logs import configure_logging
    from tierserve.server.workers import run_server

    settings = settings_from_args(args)
    if args.replica_id is not None:
        from tierserve.ps.kafka_updates import REPLICA_ENV, check_replica_id

        os.environ[REPLICA_ENV] = check_replica_id(args.replica_id, "--replica-id")
    configure_logging(args.log_level)
    if settings.host not in ("127.0.0.1", "localhost", "::1") and settings.admin_token is None:
        logging.getLogger("tierserve").warning(
            "binding %s without an admin token: anyone who reaches the port can load and "
            "unload models (set --admin-token or TIERSERVE_ADMIN_TOKEN)",
            settings.host,
        )
    return run_server(settings)
