"""A service process: started in its own process group, output to a log file, always stopped."""

from __future__ import annotations

import atexit
import contextlib
import os
import shlex
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path


class ServiceError(RuntimeError):
    """A service did not start or did not become ready; the message ends with its log's tail."""


def log_tail(log_path: Path, lines: int = 60) -> str:
    """The last ``lines`` lines of a log file ('' when there is none)."""
    try:
        with open(log_path, "rb") as log:
            log.seek(0, os.SEEK_END)
            log.seek(max(0, log.tell() - 64 * 1024))
            text = log.read().decode(errors="replace")
    except FileNotFoundError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


# Processes started and not yet stopped; stopped at interpreter exit should a fixture's
# teardown never run (for example when pytest itself is interrupted twice).
_running: set[ServiceProcess] = set()


class ServiceProcess:
    """One process in its own process group, stdout and stderr appended to ``log_path``.

    ``stop`` and ``kill`` signal the whole group, so children of the service (tritonserver's
    Python stubs, for instance) go too. Both may be called any number of times.
    """

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.name = name
        self.argv = [str(arg) for arg in argv]
        self.log_path = log_path
        self.env = env
        self.cwd = cwd
        self.popen: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start the process (not waiting for anything)."""
        if self.running:
            raise ServiceError(f"{self.name} is already running (pid {self.popen.pid})")
        with open(self.log_path, "ab") as log:
            log.write(f"\n--- {time.strftime('%H:%M:%S')} {shlex.join(self.argv)}\n".encode())
            log.flush()
            self.popen = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=self.cwd,
                start_new_session=True,
            )
        _running.add(self)

    @property
    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    @property
    def returncode(self) -> int | None:
        return None if self.popen is None else self.popen.poll()

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM the group and wait; SIGKILL it when it has not exited after ``timeout``."""
        if self.popen is None:
            return
        if self.running:
            self._signal_group(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout)
        self.kill()

    def kill(self) -> None:
        """SIGKILL the group (a crash, as far as the service can tell) and reap the process."""
        if self.popen is None:
            return
        self._signal_group(signal.SIGKILL)
        self.popen.wait()
        _running.discard(self)

    def _signal_group(self, sig: signal.Signals) -> None:
        # The group id is the leader's pid; it outlives the leader while children remain.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, sig)

    def wait_until(
        self,
        condition: Callable[[], bool],
        what: str,
        timeout: float,
        interval: float = 0.05,
    ) -> float:
        """Poll ``condition`` until it returns true; return the seconds it took.

        An exception from ``condition`` counts as "not yet". Raises ServiceError, with the tail
        of the log, when the process exits first or ``timeout`` passes.
        """
        started = time.monotonic()
        deadline = started + timeout
        last_error: Exception | None = None
        while True:
            if not self.running:
                raise self.error(f"exited with code {self.returncode} while waiting for {what}")
            try:
                if condition():
                    return time.monotonic() - started
            except Exception as exc:
                last_error = exc
            if time.monotonic() > deadline:
                detail = f" (last error: {last_error!r})" if last_error else ""
                raise self.error(f"not {what} after {timeout:.0f}s{detail}")
            time.sleep(interval)

    def error(self, message: str) -> ServiceError:
        """A ServiceError naming this service, ending with the tail of its log."""
        return ServiceError(
            f"{self.name}: {message}\n--- last lines of {self.log_path}:\n{log_tail(self.log_path)}"
        )


@atexit.register
def _stop_leftovers() -> None:
    for process in list(_running):
        process.kill()
