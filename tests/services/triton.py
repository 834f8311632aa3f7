"""tritonserver (2.51, CPU) from the PyPI wheel ``nvidia-pytriton``, with the Python backend,
installed as ``tierserve triton-install`` installs it (``tierserve.clients.triton_install``)
into the test cache.

The wheel goes into ``<cache>/pytriton/wheel`` with ``pip install --no-deps --target``, never
into the virtual environment (it pins numpy<2). Next to it, ``<cache>/pytriton/backends`` is the
folder given to ``--backend-directory``: ``python/`` holds ``libtriton_python.so``,
``triton_python_backend_utils.py`` and the ``triton_python_backend_stub`` built for this
interpreter's Python version.

The stub embeds the system's libpython (Debian's ``libpython3.11``): it ignores PYTHONPATH, but
finds its prefix through the ``python3`` on PATH, so a virtual environment's ``bin`` there would
put that environment's site-packages (numpy 2) first; ``TritonInstall.environment()`` leaves
such folders off PATH, as ``bin/tritonserver`` does. Two things follow:

- ``triton_python_backend_utils`` imports numpy before any model code runs, so ``backends/python``
  also holds its own ``numpy<2`` (the stub was built against numpy 1: with numpy 2,
  ``Tensor.as_numpy()`` reads zeros and ``pb_utils.Tensor(name, array)`` sends no data) and
  ``async-timeout`` (redis-py needs it on Python < 3.11.3, and Debian's is 3.11.2), and a
  ``numba`` + ``llvmlite`` built for numpy 1 (tierserve's hash tables are numba kernels; the
  virtual environment's numba is built for numpy 2 and would not import next to numpy 1);
- a model's ``model.py`` adds the virtual environment's site-packages itself, from a
  config.pbtxt parameter written by ``site_packages_parameter()``::

      import json, site

      class TritonPythonModel:
          def initialize(self, args):
              config = json.loads(args["model_config"])
              site.addsitedir(config["parameters"]["site_packages"]["string_value"])

  ``site.addsitedir`` (rather than ``sys.path.append``) also runs the ``.pth`` files there, which
  is how an editable install of tierserve becomes importable. The backend's own numpy comes
  first on ``sys.path``, so model code runs on numpy 1.26.
"""

from __future__ import annotations

import ctypes.util
import os
import sys
import sysconfig
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tierserve.clients import triton_install
from tierserve.clients.triton_install import PYTRITON_VERSION, STUB_PACKAGES  # noqa: F401

from .install import (
    InstallError,
    announce,
    apt_install,
    cache_root,
    install_lock,
)
from .ports import HOST, free_ports
from .process import ServiceProcess

SITE_PACKAGES_PARAMETER = "site_packages"
START_TIMEOUT = 120.0


@dataclass(frozen=True)
class TritonInstall:
    """Where an installed tritonserver lives."""

    home: Path  # <cache>/pytriton

    @property
    def wheel(self) -> Path:
        return self.home / "wheel"

    @property
    def binary(self) -> Path:
        return self.wheel / "pytriton" / "tritonserver" / "bin" / "tritonserver"

    @property
    def libs(self) -> Path:
        """The shared libraries the wheel bundles; tritonserver needs them on LD_LIBRARY_PATH."""
        return self.wheel / "nvidia_pytriton.libs"

    @property
    def backend_directory(self) -> Path:
        """The folder for ``--backend-directory``; ``python/`` inside it is the Python backend."""
        return self.home / "backends"

    def environment(self) -> dict[str, str]:
        """The environment tritonserver runs with: ours plus the wheel's libraries.

        The backend's numba (another version than the virtual environment's) keeps its
        compiled kernels in a folder of its own: sharing ``__pycache__`` with the other numba
        would make each recompile and overwrite the other's cache on every start.
        """
        env = triton_install.stub_environment(dict(os.environ))  # no venv on PATH
        paths = [str(self.libs), *filter(None, [env.get("LD_LIBRARY_PATH")])]
        env["LD_LIBRARY_PATH"] = os.pathsep.join(paths)
        env.setdefault("NUMBA_CACHE_DIR", str(self.home / "numba-cache"))
        return env


def python_version() -> str:
    """``MAJOR.MINOR`` of this interpreter: the stub must embed the same Python."""
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def ensure_tritonserver() -> TritonInstall:
    """Install libpython when missing, and tritonserver with its backend folder when missing
    (``tierserve triton-install``'s steps, under the test cache's lock)."""
    version = python_version()
    ensure_libpython(version)
    install = TritonInstall(home=cache_root() / "pytriton")
    if triton_install.installed(install.home):
        return install
    with install_lock("pytriton"):
        if not triton_install.installed(install.home):
            triton_install.install(install.home, say=announce)
    return install


def ensure_libpython(version: str) -> None:
    """Install Debian's libpython for ``version`` when the dynamic linker cannot find it."""
    if ctypes.util.find_library(f"python{version}") is None:
        apt_install([f"libpython{version}"])
        if ctypes.util.find_library(f"python{version}") is None:
            raise InstallError(f"installed libpython{version}, yet the linker does not find it")


def site_packages() -> str:
    """This interpreter's site-packages (the virtual environment's, under pytest)."""
    return sysconfig.get_paths()["purelib"]


def site_packages_parameter() -> str:
    """A config.pbtxt ``parameters`` entry naming ``site_packages()`` for model.py to add."""
    return (
        f'parameters: {{ key: "{SITE_PACKAGES_PARAMETER}" '
        f'value: {{ string_value: "{site_packages()}" }} }}'
    )


class TritonServer:
    """One tritonserver on 127.0.0.1 serving ``model_repository``.

    ``model_control_mode`` is "none" (load every model at startup, fail when one fails) or
    "explicit" (load only ``load_models``; more through the repository API). ``http_url`` and
    ``grpc_url`` are ``127.0.0.1:PORT``, as tritonclient takes them.
    """

    def __init__(
        self,
        install: TritonInstall,
        model_repository: Path,
        log_path: Path,
        *,
        model_control_mode: str = "none",
        load_models: Sequence[str] = (),
        extra_args: Sequence[str] = (),
        cwd: Path | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        if model_control_mode not in ("none", "explicit", "poll"):
            raise ValueError(f"model_control_mode must be none, explicit or poll, not {model_control_mode!r}")
        self.install = install
        self.model_repository = Path(model_repository)
        self.http_port, self.grpc_port, self.metrics_port = free_ports(3)
        argv = [
            str(install.binary),
            "--model-repository", str(self.model_repository),
            "--backend-directory", str(install.backend_directory),
            "--model-control-mode", model_control_mode,
            *[f"--load-model={name}" for name in load_models],
            "--http-address", HOST,
            "--http-port", str(self.http_port),
            "--grpc-address", HOST,
            "--grpc-port", str(self.grpc_port),
            "--metrics-address", HOST,
            "--metrics-port", str(self.metrics_port),
            "--exit-timeout-secs", "5",
            *extra_args,
        ]  # fmt: skip
        # The stub puts its working directory first on sys.path: keep it away from the
        # repository (``cwd`` chooses another on purpose).
        self.process = ServiceProcess(
            "tritonserver", argv, log_path, env=env or install.environment(),
            cwd=cwd or log_path.parent,
        )  # fmt: skip

    @property
    def http_url(self) -> str:
        return f"{HOST}:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"{HOST}:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{HOST}:{self.metrics_port}/metrics"

    @property
    def log_path(self) -> Path:
        return self.process.log_path

    def _ready(self) -> bool:
        url = f"http://{self.http_url}/v2/health/ready"
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200

    def start(self, timeout: float = START_TIMEOUT) -> float:
        """Start the server and wait until /v2/health/ready says 200; return the seconds taken."""
        started = time.monotonic()
        self.process.start()
        try:
            self.process.wait_until(self._ready, "ready (/v2/health/ready)", timeout, interval=0.1)
        except BaseException:
            self.process.kill()
            raise
        return time.monotonic() - started

    def stop(self) -> None:
        """Shut down (SIGTERM; in-flight requests get ``--exit-timeout-secs`` 5 s)."""
        self.process.stop(timeout=20)

    def kill(self) -> None:
        """SIGKILL the server and its Python stubs."""
        self.process.kill()

    @property
    def running(self) -> bool:
        return self.process.running
