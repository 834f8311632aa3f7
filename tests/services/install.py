"""Installing what the services need, at most once, and the cache that keeps it.

Debian packages are installed with apt-get only when their command is missing. Everything
downloaded otherwise (Kafka jars, the tritonserver wheel) lives under ``cache_root()``, outside
the repository, and is guarded by a file lock so that two test sessions on one machine do not
install into the same folder at once. Each install prints one short line (see ``announce``), so
a CI log shows what happened.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path


class InstallError(RuntimeError):
    """An install step failed; the message holds the command and the tail of its output."""


def _print_to_stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


_announcer: Callable[[str], None] = _print_to_stderr


def set_announcer(announcer: Callable[[str], None]) -> None:
    """Route ``announce`` messages elsewhere (conftest sends them past pytest's capture)."""
    global _announcer
    _announcer = announcer


def announce(message: str) -> None:
    """Print one line about an install or a service, prefixed so it is easy to find in a log."""
    _announcer(f"[tierserve services] {message}")


def cache_root() -> Path:
    """The folder that keeps downloads between runs: $TIERSERVE_TEST_CACHE, else ~/.cache/tierserve."""
    configured = os.environ.get("TIERSERVE_TEST_CACHE")
    if configured:
        root = Path(configured)
    else:
        xdg = os.environ.get("XDG_CACHE_HOME")
        root = (Path(xdg) if xdg else Path.home() / ".cache") / "tierserve"
    root.mkdir(parents=True, exist_ok=True)
    return root


@contextlib.contextmanager
def install_lock(name: str) -> Iterator[None]:
    """Hold an exclusive lock named ``name`` under the cache root (blocks until it is free)."""
    lock_path = cache_root() / f".{name}.lock"
    with open(lock_path, "a") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock_file, fcntl.LOCK_UN)


def run_checked(
    argv: Sequence[str],
    what: str,
    timeout: float,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> str:
    """Run ``argv`` to completion and return its output; raise InstallError when it fails."""
    try:
        result = subprocess.run(
            list(argv),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            timeout=timeout,
            env=env,
            cwd=cwd,
        )
    except subprocess.TimeoutExpired as exc:
        output = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else ""
        raise InstallError(
            f"{what}: `{' '.join(argv)}` took longer than {timeout:.0f}s\n{_tail(output)}"
        ) from None
    if result.returncode != 0:
        raise InstallError(
            f"{what}: `{' '.join(argv)}` exited with {result.returncode}\n{_tail(result.stdout)}"
        )
    return result.stdout


def _tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.splitlines()[-lines:])


_apt_updated = False


def apt_install(packages: Sequence[str]) -> None:
    """Install Debian packages with apt-get (runs `apt-get update` once per process first)."""
    global _apt_updated
    if os.geteuid() != 0:
        raise InstallError(
            f"need Debian packages {' '.join(packages)}, and only root can install them: "
            f"run `sudo apt-get install -y {' '.join(packages)}`"
        )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    with install_lock("apt"):
        announce(f"installing Debian packages: {' '.join(packages)}")
        if not _apt_updated:
            run_checked(["apt-get", "update"], "apt-get update", timeout=600, env=env)
            _apt_updated = True
        run_checked(
            ["apt-get", "install", "-y", "--no-install-recommends", *packages],
            f"installing {' '.join(packages)}",
            timeout=1200,
            env=env,
        )


def ensure_command(command: str, apt_package: str) -> str:
    """Return the path of ``command``, installing ``apt_package`` first when it is missing."""
    path = shutil.which(command)
    if path is None:
        apt_install([apt_package])
        path = shutil.which(command)
        if path is None:
            raise InstallError(f"installed {apt_package}, yet `{command}` is still not on PATH")
    return path


def read_marker(path: Path) -> str | None:
    """The text of an install marker file, or None when there is none."""
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        return None


def write_marker(path: Path, text: str) -> None:
    """Write an install marker; written last, it says the install beside it is complete."""
    path.write_text(text + "\n")
