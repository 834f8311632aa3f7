"""Which online updates a model version still needs: the rule the Kafka consumers follow.

A version's tables are loaded from files written at some time *T* (its *creation time*,
:func:`version_time_ms`).  Those files already hold every update published before *T*, and
none published after.  So, for each committed version of a model and each tier level:

- an update message whose timestamp is older than *T* is skipped (counted as ``stale``): the
  files hold that row as it was then, or newer;
- when a consumer first meets a version (a model loaded after its updates were published, a
  server restarted, a new version swapped in), it reads that model's partitions again from
  the first message published at or after *T* (Kafka's offsets-for-times), so the tier ends as
  the files plus every update since: nothing applied before a restart is lost, even in a
  tier that lives in the process;
- while no version of the model is committed, its partitions wait (paused, offsets not
  committed) and are read once one is.

A version's creation time is what its folder's :data:`STAMP` file says (milliseconds since
the epoch, written by the trainer's ``fit(repository=...)`` by the clock that stamps its
update messages, before it takes the rows), else the oldest modification time of its sparse
files' ``emb_vector`` (written after the rows were taken; copies made with ``cp -p``,
``rsync -t`` or ``shutil.copy2`` keep it).  A version that attached to tables another process
loaded (``initialize_after_startup: false``) has no creation time: it is never replayed.

:func:`mark_synced` / :func:`synced` remember, per version and tier level, the partitions a
consumer of this process already brought up to date, so a consumer restarted in the same
process resumes from its committed offsets rather than replaying.
"""

from __future__ import annotations

import os
import threading
import weakref
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .served_model import ServedModel

#: The file of a version folder that holds its creation time in ms (see the module docstring).
STAMP = "tierserve.created"
_lock = threading.Lock()
_synced: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # ServedModel -> set
_times: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # ServedModel -> ms


def version_time_ms(served: ServedModel) -> int:
    """The creation time of version ``served`` in ms since the epoch; 0 when it has none."""
    with _lock:
        cached = _times.get(served)
    if cached is not None:
        return cached
    value = 0 if served.attached else _creation_ms(served.config.sparse_files)
    with _lock:
        _times[served] = value
    return value


def _creation_ms(sparse_files: list[str]) -> int:
    """The version folder's stamp, else its oldest ``emb_vector``'s mtime (a converted
    folder's ``emb_vector.<dtype>``, which keeps its source's); 0 when neither."""
    if sparse_files:
        try:
            return int((Path(sparse_files[0]).parent / STAMP).read_text().strip())
        except (OSError, ValueError):
            pass
    times = []
    for folder in sparse_files:
        for path in (Path(folder) / "emb_vector", *Path(folder).glob("emb_vector.*")):
            try:
                times.append(os.stat(path).st_mtime_ns // 1_000_000)
            except OSError:
                continue
    return min(times, default=0)


def synced(served, level: str, partition: tuple[str, int]) -> bool:
    """Whether a consumer of tier ``level`` already brought ``partition`` of version
    ``served`` up to date in this process."""
    with _lock:
        return (level, *partition) in _synced.get(served, ())


def mark_synced(served, level: str, partition: tuple[str, int]) -> None:
    with _lock:
        _synced.setdefault(served, set()).add((level, *partition))
