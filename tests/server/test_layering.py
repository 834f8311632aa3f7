"""Import boundaries of the server package (docs/architecture.md, Packages and layering).

The runtime that serves a model (``server/runtime``, InferenceModel) is used by the batch CLI
and the Triton model without the HTTP and gRPC front ends, and nothing in the server imports
the clients package, which sits above it.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

FRONT_ENDS = (
    "tierserve.server.app",
    "tierserve.server.workers",
    "tierserve.server.http",
    "tierserve.server.grpc",
    "fastapi",
    "uvicorn",
    "grpc",
)


def _imported_after(statement: str, prefixes: tuple[str, ...]) -> list[str]:
    code = (
        f"import sys\n{statement}\n"
        f"print('\\n'.join(m for m in sys.modules if m.startswith({prefixes!r})))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return out.stdout.split()


def test_the_runtime_imports_no_front_end():
    """Every module of ``server/runtime`` and the InferenceModel, imported together."""
    runtime = (
        "import importlib, pkgutil, tierserve.server.runtime as r, tierserve.server.inference_model\n"
        "for m in pkgutil.iter_modules(r.__path__, r.__name__ + '.'):\n"
        "    importlib.import_module(m.name)"
    )
    assert _imported_after(runtime, FRONT_ENDS) == []


def test_the_server_does_not_import_the_clients():
    """Not even inside a function: the dependency points one way."""
    server = Path(__file__).resolve().parents[2] / "server"
    offenders = []
    for path in sorted(server.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = (
                [a.name for a in node.names] if isinstance(node, ast.Import)
                else [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            )  # fmt: skip
            offenders += [f"{path.name}:{node.lineno}" for n in names if n.startswith("tierserve.clients")]
    assert offenders == []
