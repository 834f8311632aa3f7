"""Index ranges handed out in shards, as DLRover's master hands them to its workers.

A :class:`ShardDispatcher` cuts ``dataset_size`` records into shards of
``batch_size * num_minibatches_per_shard`` indices, epoch after epoch, and hands each to one
worker at a time.  A worker reports a shard done once its records are consumed; when a worker
stops, :meth:`ShardDispatcher.worker_stopped` puts the shards it held but had not finished
back at the front of the queue, so every index is consumed once per epoch whichever worker
ends up with it.  :class:`ShardingClient` is one worker's handle (DLRover's
``ShardingClient``: ``fetch_shard``, ``report_batch_done``).  The dispatcher is thread-safe;
several workers in one process share it directly.
"""

from __future__ import annotations

import collections
import threading
from dataclasses import dataclass

import numpy as np

from tierserve.core.errors import ConfigError, InvalidInputError


@dataclass(frozen=True)
class Shard:
    """Records ``start`` (inclusive) to ``end`` (exclusive) of epoch ``epoch``."""

    id: int
    name: str
    start: int
    end: int
    epoch: int

    def __len__(self) -> int:
        return self.end - self.start


class ShardDispatcher:
    """Hands out the shards of ``num_epochs`` passes (None: forever) over ``dataset_size``
    records; ``shuffle`` orders each epoch's shards at random (``seed``)."""

    def __init__(
        self,
        dataset_size: int,
        batch_size: int = 64,
        num_epochs: int | None = 1,
        num_minibatches_per_shard: int = 2,
        dataset_name: str = "training_data",
        shuffle: bool = False,
        seed: int | None = None,
    ) -> None:
        for what, value in (
            ("batch_size", batch_size),
            ("num_minibatches_per_shard", num_minibatches_per_shard),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"ShardDispatcher: {what} must be a positive int, got {value!r}")
        if (
            isinstance(dataset_size, bool)
            or not isinstance(dataset_size, (int, np.integer))
            or dataset_size < 0
        ):
            raise ConfigError(
                f"ShardDispatcher {dataset_name!r}: dataset_size must be an int >= 0, got {dataset_size!r}"
            )
        if num_epochs is not None and (not isinstance(num_epochs, int) or num_epochs < 1):
            raise ConfigError(
                f"ShardDispatcher: num_epochs must be a positive int or None, got {num_epochs!r}"
            )
        self.dataset_size, self.name = int(dataset_size), dataset_name
        self.batch_size = batch_size
        self.shard_size = batch_size * num_minibatches_per_shard
        self.num_epochs, self.shuffle = num_epochs, shuffle
        self._rng = np.random.default_rng(seed)
        self._lock = threading.Lock()
        self._todo: collections.deque[Shard] = collections.deque()
        self._doing: dict[int, tuple[str, Shard]] = {}  # shard id -> (worker, shard)
        self._epoch = 0  # epochs created so far
        self._next_id = 0
        self.completed: list[Shard] = []  # finished shards, in the order they were reported

    def _create_epoch(self) -> bool:
        if self.dataset_size == 0 or (
            self.num_epochs is not None and self._epoch >= self.num_epochs
        ):
            return False
        starts = np.arange(0, self.dataset_size, self.shard_size)
        if self.shuffle:
            starts = self._rng.permutation(starts)
        for start in starts.tolist():
            end = min(self.dataset_size, start + self.shard_size)
            self._todo.append(Shard(self._next_id, self.name, start, end, self._epoch))
            self._next_id += 1
        self._epoch += 1
        return True

    def fetch_shard(self, worker: str = "worker-0") -> Shard | None:
        """The next shard for ``worker``, or None when every epoch has been handed out."""
        with self._lock:
            if not self._todo:
                self._create_epoch()
            if not self._todo:
                return None
            shard = self._todo.popleft()
            self._doing[shard.id] = (worker, shard)
            return shard

    def report_done(self, shard_id: int, worker: str | None = None) -> None:
        """Shard ``shard_id`` is consumed."""
        with self._lock:
            held = self._doing.get(shard_id)
            if held is None:
                raise InvalidInputError(
                    f"shard {shard_id} of {self.name!r} is not handed out (finished already, or "
                    "given back when its worker stopped)"
                )
            if worker is not None and held[0] != worker:
                raise InvalidInputError(
                    f"shard {shard_id} of {self.name!r} is held by {held[0]!r}, not {worker!r}"
                )
            del self._doing[shard_id]
            self.completed.append(held[1])

    def worker_stopped(self, worker: str) -> list[Shard]:
        """Give back the shards ``worker`` held unfinished (they are handed out next)."""
        with self._lock:
            back = [s for w, s in self._doing.values() if w == worker]
            for shard in back:
                del self._doing[shard.id]
            self._todo.extendleft(sorted(back, key=lambda s: s.id, reverse=True))
            return back

    def finished(self) -> bool:
        """Whether every epoch has been handed out and reported done."""
        with self._lock:
            if self._todo or self._doing:
                return False
            return self.dataset_size == 0 or (
                self.num_epochs is not None and self._epoch >= self.num_epochs
            )

    def pending(self) -> int:
        """Shards handed out and not yet reported done."""
        with self._lock:
            return len(self._doing)


class ShardingClient:
    """One worker's handle on a dispatcher (DLRover's ``ShardingClient``; built with
    DLRover's arguments, ``ShardingClient(dataset_name=..., batch_size=..., num_epochs=...,
    dataset_size=...)``, it makes its own dispatcher: the one worker of this process).

    :meth:`fetch_shard` reports the shard fetched before it done (its records were read);
    :meth:`report_batch_done` instead counts consumed records and reports shards done as
    they are covered, for a training hook that reports after each step.
    """

    def __init__(self, dispatcher: ShardDispatcher | str | None = None, worker: str = "worker-0",
                 *, dataset_name: str | None = None, batch_size: int | None = None,
                 num_epochs: int | None = None, dataset_size: int | None = None,
                 shuffle: bool = False, num_minibatches_per_shard: int = 2,
                 task_type: object = None, storage_type: str = "") -> None:
        if not isinstance(dispatcher, ShardDispatcher):
            # DLRover's constructor: the client describes the dataset (its master splits it)
            if isinstance(dispatcher, str):
                dataset_name = dispatcher
            if batch_size is None or dataset_size is None:
                raise ConfigError("ShardingClient: give a ShardDispatcher, or DLRover's "
                                  "dataset_name, batch_size, num_epochs and dataset_size")
            if task_type not in (None, 0, "training", "TRAINING"):
                raise ConfigError(f"ShardingClient: task_type {task_type!r} is not supported "
                                  "(training shards only; evaluation reads its whole set)")
            dispatcher = ShardDispatcher(int(dataset_size), int(batch_size), num_epochs,
                                         int(num_minibatches_per_shard),
                                         dataset_name or "training_data", bool(shuffle))
        self.dispatcher, self.worker = dispatcher, worker
        self._held: collections.deque[Shard] = collections.deque()
        self._consumed = 0  # records of the oldest held shard already consumed
        self.report_on_fetch = True

    def fetch_shard(self) -> Shard | None:
        """The next shard, or None at the end of the data."""
        if self.report_on_fetch:
            self._report_all()
        shard = self.dispatcher.fetch_shard(self.worker)
        if shard is not None:
            self._held.append(shard)
        return shard

    def report_batch_done(self, batch_size: int | None = None) -> None:
        """``batch_size`` more records (default: the dispatcher's batch) were trained on."""
        self.report_on_fetch = False
        n = self.dispatcher.batch_size if batch_size is None else int(batch_size)
        self._consumed += n
        while self._held and self._consumed >= len(self._held[0]):
            shard = self._held.popleft()
            self._consumed -= len(shard)
            self.dispatcher.report_done(shard.id, self.worker)

    def report_all_done(self) -> None:
        """Every shard fetched so far was consumed (the end of a pass)."""
        self._report_all()

    def _report_all(self) -> None:
        while self._held:
            self.dispatcher.report_done(self._held.popleft().id, self.worker)
        self._consumed = 0

    def stop(self) -> list[Shard]:
        """This worker stops: its unfinished shards go back to the dispatcher."""
        self._held.clear()
        self._consumed = 0
        return self.dispatcher.worker_stopped(self.worker)
