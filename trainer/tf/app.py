"""``tf.app.run(main)``: call ``main(argv)`` with the command line and exit with its return
value (TensorFlow 1's entry point, without absl's flag parsing)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any


def run(main: Callable[[list[str]], Any] | None = None, argv: list[str] | None = None) -> None:
    """``sys.exit(main(argv))``, ``argv`` defaulting to ``sys.argv``; ``main`` defaults to
    the ``__main__`` module's ``main``."""
    if main is None:
        main = sys.modules["__main__"].main
    sys.exit(main(list(sys.argv if argv is None else argv)))


__all__ = ["run"]
