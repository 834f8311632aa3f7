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

#: The settings that say what is served: one of them is required.
SOURCE = ("model_repository", "config")


def register(commands: argparse._SubParsersAction) -> None:
    """``tierserve serve``: one option per server setting (built from
    :class:`~tierserve.server.settings.Settings`, defaults and help included), plus the
    command line's own ``--blas-threads`` and ``--replica-id``."""
    from tierserve.server.settings import Settings

    from .settings_options import add_setting, add_settings

    parser = commands.add_parser(
        "serve",
        help="serve models over HTTP and gRPC (KServe v2 / Triton protocol)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    source = parser.add_mutually_exclusive_group(required=True)
    for name in SOURCE:
        add_setting(source, Settings, name)
    add_settings(parser, Settings, exclude=SOURCE)
    parser.add_argument(
        "--blas-threads", type=int, default=None, metavar="N",
        help="BLAS threads per inference thread (default 1, unless OPENBLAS_NUM_THREADS or "
        "OMP_NUM_THREADS is set): the server already runs requests in parallel",
    )  # fmt: skip
    parser.add_argument(
        "--replica-id",
        default=None,
        metavar="NAME",
        help="this server's name in the Kafka consumer groups of online updates; keep it "
        "stable across restarts to resume where the last run stopped (default: "
        "$TIERSERVE_REPLICA_ID, else host-pid-random, so each process is its own replica)",
    )
    parser.set_defaults(run=run)


def settings_from_args(args: argparse.Namespace):
    """The server settings the arguments describe (a setting not given: its default)."""
    from tierserve.server.settings import Settings

    from .settings_options import settings_values

    return Settings.from_env(**settings_values(args, Settings))


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
        from tierserve.model.blas_threads import get_blas_threads, set_blas_threads

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
        from tierserve.ps.kafka_groups import REPLICA_ENV, check_replica_id

        os.environ[REPLICA_ENV] = check_replica_id(args.replica_id, "--replica-id")
    configure_logging(settings.log_level)
    if settings.host not in ("127.0.0.1", "localhost", "::1") and settings.admin_token is None:
        logging.getLogger("tierserve").warning(
            "binding %s without an admin token: anyone who reaches the port can load and "
            "unload models (set --admin-token or TIERSERVE_ADMIN_TOKEN)",
            settings.host,
        )
    return run_server(settings)
