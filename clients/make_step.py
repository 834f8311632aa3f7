"""Run one long step of the Makefile so that it shows it is alive.

    python3 clients/make_step.py "installing tierserve" [--only REGEX] -- COMMAND ARGS...

Prints ``[make] <name> ...``, relays the command's output lines (with ``--only``, just the
lines that match; ``\\r`` progress redraws become lines), prints ``[make] <name>: still
running (N s)`` whenever the command has been silent for :data:`QUIET_S` seconds, and ends
with the time the step took.  The exit status is the command's.  Standard library only: it
runs before the virtual environment exists.
"""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time

#: Longest silence before a "still running" line.
QUIET_S = 5.0


def main(argv: list[str]) -> int:
    if "--" not in argv or argv.index("--") < 1:
        print(__doc__, file=sys.stderr)
        return 2
    split = argv.index("--")
    options, command = argv[:split], argv[split + 1 :]
    name = options[0]
    only = re.compile(options[options.index("--only") + 1]) if "--only" in options else None
    start = time.monotonic()
    last = [start]
    lock = threading.Lock()

    def say(text: str) -> None:
        with lock:
            print(text, flush=True)
            last[0] = time.monotonic()

    say(f"[make] {name} ...")
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    done = threading.Event()

    def beat() -> None:
        while not done.wait(0.5):
            if time.monotonic() - last[0] >= QUIET_S:
                say(f"[make] {name}: still running ({time.monotonic() - start:.0f} s)")

    watcher = threading.Thread(target=beat, daemon=True)
    watcher.start()
    assert proc.stdout is not None
    for raw in proc.stdout:
        for piece in raw.decode(errors="replace").replace("\r", "\n").split("\n"):
            if piece.strip() and (only is None or only.search(piece)):
                say(f"  {piece.rstrip()}")
    code = proc.wait()
    done.set()
    watcher.join()
    took = time.monotonic() - start
    say(f"[make] {name}: {'done' if code == 0 else f'failed (exit {code})'} in {took:.0f} s")
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
