"""``tierserve triton-install``: a CPU tritonserver (2.51) with the Python backend, for
serving ``tierserve triton-repo``'s repositories without Docker.

The server comes from the ``nvidia-pytriton`` wheel (PyPI), which carries tritonserver, its
libraries and a Python-backend stub per Python version.  Into ``--dir`` (default
``~/.cache/tierserve/pytriton``):

- ``wheel/``: the wheel, installed with ``pip install --no-deps --target`` (never into the
  virtual environment: the wheel pins numpy<2);
- ``backends/python/``: the backend (``libtriton_python.so``, ``triton_python_backend_utils.py``
  and the stub for this Python), with the numpy the stub was built for (numpy<2) and a numba
  and llvmlite built for that numpy (tierserve's hash tables are numba kernels);
- ``bin/tritonserver``: a script that runs the server with its libraries on
  ``LD_LIBRARY_PATH``, numba's cache in ``numba-cache/``, ``--backend-directory`` set, and
  no virtual environment on ``PATH``: the stub's embedded Python finds its prefix through
  the ``python3`` there, and an activated venv's packages (numpy 2) would come first.

The stub embeds the system's ``libpython3.X`` (Debian: ``apt-get install libpython3.11``)
and does not see the virtual environment: the ``model.py`` files ``triton-repo`` writes add
its site-packages themselves.  Installing is skipped when ``--dir`` already holds this
version (a marker file says which).
"""

from __future__ import annotations

import argparse
import ctypes.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

from tierserve.core.errors import ConfigError

PYTRITON_VERSION = "0.7.0"  # tritonserver 2.51
#: What the stub needs beside it: numba 0.61 supports numpy 1.24-2.1 and Python 3.10-3.13.
STUB_PACKAGES = ("numpy<2", "async-timeout", "numba==0.61.2", "llvmlite==0.44.0")
MARKER = ".installed"

WRAPPER = """#!/bin/sh
# Written by `tierserve triton-install`: tritonserver with its libraries and the Python backend.
HOME_DIR="$(cd "$(dirname "$0")/.." && pwd)"
# The stub's embedded Python finds its prefix through the python3 on PATH: a virtual
# environment's bin there (an activated venv) puts that environment's packages, numpy 2
# among them, ahead of the numpy 1 the stub was built for. Leave such folders out.
clean=""
IFS=:
for dir in $PATH; do
    [ -f "$dir/../pyvenv.cfg" ] || clean="${clean:+$clean:}$dir"
done
unset IFS
PATH="$clean"
export PATH
unset VIRTUAL_ENV PYTHONHOME
export LD_LIBRARY_PATH="$HOME_DIR/wheel/nvidia_pytriton.libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export NUMBA_CACHE_DIR="${NUMBA_CACHE_DIR:-$HOME_DIR/numba-cache}"
exec "$HOME_DIR/wheel/pytriton/tritonserver/bin/tritonserver" \
    --backend-directory "$HOME_DIR/backends" "$@"
"""


def stub_environment(env: dict[str, str]) -> dict[str, str]:
    """``env`` as the stub should see it (what ``bin/tritonserver`` does): no virtual
    environment's folder on PATH, no VIRTUAL_ENV or PYTHONHOME (see ``WRAPPER``)."""
    out = {k: v for k, v in env.items() if k not in ("VIRTUAL_ENV", "PYTHONHOME")}
    folders = out.get("PATH", "").split(os.pathsep)
    out["PATH"] = os.pathsep.join(
        d for d in folders if d and not (Path(d).parent / "pyvenv.cfg").is_file()
    )
    return out


def default_home() -> Path:
    """``$XDG_CACHE_HOME/tierserve/pytriton`` (``~/.cache/...``)."""
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "tierserve" / "pytriton"


def python_version() -> str:
    """``MAJOR.MINOR``: the stub must embed this Python's version."""
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def wanted_marker(version: str | None = None) -> str:
    return (f"nvidia-pytriton=={PYTRITON_VERSION} python{version or python_version()} "
            f"{' '.join(STUB_PACKAGES)}")  # fmt: skip


def installed(home: Path) -> bool:
    """Whether ``home`` holds this version, complete (its marker is written last)."""
    try:
        return (home / MARKER).read_text().strip() == wanted_marker()
    except OSError:
        return False


def wrapper_path(home: Path) -> Path:
    return home / "bin" / "tritonserver"


def install(home: Path, say=print) -> Path:
    """Install into ``home`` unless it is there already; the path of ``bin/tritonserver``."""
    version = python_version()
    if ctypes.util.find_library(f"python{version}") is None:
        raise ConfigError(
            f"the Python backend's stub embeds libpython{version}, which the dynamic linker "
            f"does not find: install it (Debian: apt-get install libpython{version})"
        )
    if installed(home):
        write_wrapper(home)
        return wrapper_path(home)
    say(f"installing tritonserver from nvidia-pytriton {PYTRITON_VERSION} into {home} "
        "(a few hundred MB, once)")  # fmt: skip
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    _pip_target(home / "wheel", [f"nvidia-pytriton=={PYTRITON_VERSION}"], version)
    server = home / "wheel" / "pytriton" / "tritonserver"
    stub = server / "python_backend_stubs" / version / "triton_python_backend_stub"
    if not stub.exists():
        raise ConfigError(f"nvidia-pytriton {PYTRITON_VERSION} has no Python-backend stub for "
                          f"Python {version}")  # fmt: skip
    backend = home / "backends" / "python"
    backend.mkdir(parents=True)
    for name in ("libtriton_python.so", "triton_python_backend_utils.py"):
        shutil.copy2(server / "backends" / "python" / name, backend)
    shutil.copy2(stub, backend)
    say(f"installing {' '.join(STUB_PACKAGES)} beside the stub")
    _pip_target(backend, STUB_PACKAGES, version)
    write_wrapper(home)
    (home / MARKER).write_text(wanted_marker(version) + "\n")
    return wrapper_path(home)


def write_wrapper(home: Path) -> None:
    path = wrapper_path(home)
    text = WRAPPER
    if path.exists() and path.read_text() == text:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)


def _pip_target(target: Path, requirements, version: str) -> None:
    argv = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check",
            "--progress-bar", "off", "--no-deps", "--only-binary=:all:", "--python-version",
            version, "--target", str(target), *requirements]  # fmt: skip
    result = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if result.returncode != 0:
        tail = "\n".join(result.stdout.splitlines()[-20:])
        raise ConfigError(f"`{' '.join(argv)}` failed ({result.returncode}):\n{tail}")


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "triton-install",
        help="install a CPU tritonserver with the Python backend (from the nvidia-pytriton "
        "wheel) to serve triton-repo's repositories",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--dir", default=None, metavar="DIR",
                        help="where to install (default ~/.cache/tierserve/pytriton)")  # fmt: skip
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    home = Path(args.dir).resolve() if args.dir else default_home()
    server = install(home, say=lambda text: print(text, flush=True))
    print(f"tritonserver: {server}  (run it with --model-repository DIR)")
    return 0
