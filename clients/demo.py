"""``tierserve demo``: train a small model on generated data and serve it on 127.0.0.1.

The main job of the README: it generates a synthetic click log with a planted model, trains
a small DLRM with the embedded trainer, writes it into a model repository whose ``ps.json``
uses the in-process hash map and RocksDB tiers, and serves it over HTTP and gRPC.
"""

from __future__ import annotations

import argparse


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "demo",
        help="train a small demo model on generated data and serve it on 127.0.0.1:8000",
        description=__doc__,
    )
    parser.add_argument("--workdir", default=".demo", help="where data, model and RocksDB go")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback)")
    parser.add_argument("--port", type=int, default=8000, help="HTTP port (default 8000)")
    parser.add_argument("--iterations", type=int, default=300, help="training iterations")
    parser.add_argument(
        "--exit-after-check",
        action="store_true",
        help="make one prediction over HTTP, print it and stop (for scripts and CI)",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from tierserve.ps.errors import NotReadyError

    raise NotReadyError(
        "the demo needs the trainer and the server, which are not built yet "
        "(issues 3 and 6); the test command works today"
    )
