"""The ``tierserve`` command line.

Each subcommand lives in its own module and registers itself with :func:`main`'s parser;
nothing is parsed at import time.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from tierserve.server.version import version


def build_parser() -> argparse.ArgumentParser:
    """The parser with every subcommand attached."""
    parser = argparse.ArgumentParser(
        prog="tierserve",
        description=(
            "Serve CTR and recommendation models whose embedding tables live in tiers: "
            "an embedding cache, a volatile store (hash map or Redis Cluster) and RocksDB."
        ),
    )
    parser.add_argument("--version", action="version", version=f"tierserve {version()}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    from . import (
        batch_inference,
        convert,
        demo,
        doctor,
        publish,
        serve,
        triton_install,
        triton_repo,
    )

    demo.register(commands)
    convert.register(commands)
    serve.register(commands)
    batch_inference.register(commands)
    publish.register(commands)
    doctor.register(commands)
    triton_repo.register(commands)
    triton_install.register(commands)
    from tierserve.trainer.elastic import entry as train_entry

    train_entry.register(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``tierserve`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    from tierserve.core.errors import TierserveError

    try:
        return int(args.run(args) or 0)
    except TierserveError as exc:
        print(f"tierserve {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
