"""The one data plane behind REST and gRPC: health, metadata, repository and inference.

Front ends only convert formats: they hand decoded numpy tensors to :meth:`DataPlane.infer`
and turn the dicts the other methods return into their wire format.  Every failure is a
:class:`~tierserve.core.errors.TierserveError`, which each front end maps in one place.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tierserve.core.errors import InvalidInputError

from ..version import version
from .allocator import trimmer
from .batching import DynamicBatcher
from .heap import Refreezer
from .metrics import ServerMetrics
from .repository import Handle, ModelEntry, ModelRepository
from .servables import NO_LIMITS, RequestLimits, Servable
from .tensors import DecodedRequest, TensorSpec

SERVER_NAME = "tierserve"
EXTENSIONS = ["binary_tensor_data", "model_repository", "statistics", "model_configuration"]


def _outcome(future: asyncio.Future) -> tuple[Any, BaseException | None]:
    """A finished future as ``(result, None)`` or ``(None, exception)``."""
    if future.cancelled():
        return None, asyncio.CancelledError()
    exc = future.exception()
    return (None, exc) if exc is not None else (future.result(), None)


@dataclass
class InferResult:
    """What a front end encodes: the version that answered and the requested outputs."""

    model_name: str
    model_version: str
    id: str
    outputs: dict[str, np.ndarray]
    binary: dict[str, bool]


@dataclass
class _Duration:
    count: int = 0
    ns: int = 0

    def add(self, ns: int, count: int = 1) -> None:
        """``count`` requests of ``ns`` each."""
        self.count += count
        self.ns += ns * count

    def to_dict(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}


@dataclass
class ModelStats:
    """Triton-style statistics of one model version.

    As Triton's, every successful request counts once in ``queue``, ``compute_input``,
    ``compute_infer`` and ``compute_output`` (``perf_analyzer`` finds the version it measured
    by the ``queue`` count).  Their times: ``compute_input`` checking the request and
    building its batch unit; ``compute_infer`` the rest until its outputs are there, its wait
    for a dynamic batch included (the batcher does not time the wait apart, so ``queue``
    holds no time), and the split of merged outputs (``compute_output`` holds no time).
    """

    last_inference: int = 0
    inference_count: int = 0
    execution_count: int = 0
    success: _Duration = field(default_factory=_Duration)
    fail: _Duration = field(default_factory=_Duration)
    queue: _Duration = field(default_factory=_Duration)
    compute_input: _Duration = field(default_factory=_Duration)
    compute_infer: _Duration = field(default_factory=_Duration)
    compute_output: _Duration = field(default_factory=_Duration)
    batches: dict[int, _Duration] = field(default_factory=dict)


class DataPlane:
    """Serves the models of a :class:`ModelRepository`; see the module docstring."""

    #: Key limits and value checks of every request (the server's settings).
    limits: RequestLimits = NO_LIMITS

    def __init__(
        self,
        repository: ModelRepository,
        executor: Executor | None,
        metrics: ServerMetrics | None = None,
        dynamic_batching: bool = True,
        max_batch_delay_s: float = 0.001,
        limits: RequestLimits = NO_LIMITS,
    ) -> None:
        self.repository = repository
        self.limits = limits
        self.executor = executor
        self.metrics = metrics or ServerMetrics()
        self.dynamic_batching = dynamic_batching
        self.max_batch_delay_s = max_batch_delay_s
        self.stats: dict[tuple[str, str], ModelStats] = {}
        self._stats_lock = threading.Lock()
        self.started = False
        self.loop: asyncio.AbstractEventLoop | None = None  # set when the server starts
        #: Set by a serving process whose heap is frozen (:mod:`.heap`): told of swaps.
        self.heap: Refreezer | None = None
        repository.subscribe(self._on_swap)

    def metrics_label(self, name: str) -> str:
        """``name`` when the repository knows it, else ``"unknown"``: request paths never
        create metric series of their own."""
        return name if name in self.repository.entries else "unknown"

    # -- health and metadata ----------------------------------------------------------------

    def live(self) -> bool:
        return True

    def ready(self) -> bool:
        """Started, the loader healthy (its Kafka consumers run), and every model that is
        not unloaded serves."""
        loader = self.repository.loader
        return (
            self.started
            and (loader is None or loader.healthy())
            and all(e.state == "READY" or e.unloaded for e in self.repository.entries.values())
        )

    def not_ready_reason(self) -> str:
        """Why :meth:`ready` is false, for the body of a 503 (a hint: read after ready())."""
        if not self.started:
            return "starting: loading the models"
        loader = self.repository.loader
        text = loader.not_ready_reason() if loader is not None else None
        if text:
            return text
        for name, e in self.repository.entries.items():
            if e.state != "READY" and not e.unloaded:
                return f"model {name!r} is {e.state}"
        return "not ready"

    def server_metadata(self) -> dict[str, Any]:
        return {"name": SERVER_NAME, "version": version(), "extensions": EXTENSIONS}

    def model_ready(self, name: str, version: str = "") -> bool:
        handle = self.repository.acquire(name, version)
        handle.release()
        return True

    def serves(self, name: str, version: str = "") -> bool:
        """Whether ``name`` (``version``, when given) serves now: a cheap hint, no lock taken;
        False says nothing (ask :meth:`model_ready` for the error), and a request that gets
        True still acquires the version to run."""
        entry = self.repository.entries.get(name)
        return (
            entry is not None
            and entry.handle is not None
            and (not version or version == entry.version)
        )

    def _with_servable(self, name: str, version: str, fn):
        handle = self.repository.acquire(name, version)
        try:
            return fn(handle.servable)
        finally:
            handle.release()

    def model_metadata(self, name: str, version: str = "") -> dict[str, Any]:
        """The model's metadata: the tensors its :meth:`~Servable.interface` presents."""

        def meta(s: Servable) -> dict[str, Any]:
            face = s.interface()
            return {
                "name": s.name,
                "versions": [s.version],
                "platform": s.platform,
                "inputs": [t.metadata() for t in face.inputs],
                "outputs": [t.metadata() for t in face.outputs],
            }

        return self._with_servable(name, version, meta)

    def input_specs(self, name: str, version: str = "") -> dict[str, TensorSpec]:
        """Every input the model takes (presented or not), by name."""
        return self._with_servable(name, version, lambda s: {t.name: t for t in s.inputs})

    def model_config(self, name: str, version: str = "") -> dict[str, Any]:
        """The model's configuration in Triton's JSON form (dims without the batch dim) for
        the tensors its :meth:`~Servable.interface` presents."""

        def config(s: Servable) -> dict[str, Any]:
            face = s.interface()
            batched = face.max_batch_size > 0

            def dims(shape):
                return list(shape[1:]) if batched else list(shape)

            out: dict[str, Any] = {
                "name": s.name,
                "platform": s.platform,
                "backend": "tierserve",
                "version_policy": {"latest": {"num_versions": 1}},
                "max_batch_size": face.max_batch_size,
                "input": [
                    {
                        "name": t.name,
                        "data_type": f"TYPE_{t.datatype}",
                        "dims": dims(t.shape),
                        **({"optional": True} if t.optional else {}),
                    }
                    for t in face.inputs
                ],  # fmt: skip
                "output": [
                    {"name": t.name, "data_type": f"TYPE_{t.datatype}", "dims": dims(t.shape)}
                    for t in face.outputs
                ],
                "parameters": {k: {"string_value": str(v)} for k, v in s.config().items()},
            }
            if batched and self.dynamic_batching:
                out["dynamic_batching"] = {
                    "max_queue_delay_microseconds": int(self.max_batch_delay_s * 1e6)
                }
            return out

        return self._with_servable(name, version, config)

    def model_statistics(self, name: str = "", version: str = "") -> dict[str, Any]:
        """Triton's statistics extension for one model or, with no name, all loaded ones."""
        if name:
            handle = self.repository.acquire(name, version)
            handle.release()
            keys = [(name, handle.servable.version)]
        else:
            keys = [(e.name, e.version) for e in self.repository.entries.values() if e.handle]
        stats = []
        with self._stats_lock:
            for key in keys:
                st = self.stats.get(key) or ModelStats()
                zero = _Duration().to_dict()
                stats.append(
                    {
                        "name": key[0],
                        "version": key[1],
                        "last_inference": st.last_inference,
                        "inference_count": st.inference_count,
                        "execution_count": st.execution_count,
                        "inference_stats": {
                            "success": st.success.to_dict(),
                            "fail": st.fail.to_dict(),
                            "queue": st.queue.to_dict(),
                            "compute_input": st.compute_input.to_dict(),
                            "compute_infer": st.compute_infer.to_dict(),
                            "compute_output": st.compute_output.to_dict(),
                            "cache_hit": zero,
                            "cache_miss": zero,
                        },
                        "batch_stats": [
                            {
                                "batch_size": size,
                                "compute_input": zero,
                                "compute_infer": d.to_dict(),
                                "compute_output": zero,
                            }
                            for size, d in sorted(st.batches.items())
                        ],
                    }
                )
        return {"model_stats": stats}

    # -- repository -------------------------------------------------------------------------

    def repository_index(self, ready_only: bool = False) -> list[dict[str, str]]:
        index = self.repository.index()
        return [m for m in index if m["state"] == "READY"] if ready_only else index

    async def load(self, name: str) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self.repository.load, name)

    async def unload(self, name: str) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self.repository.unload, name)

    def _on_swap(self, entry: ModelEntry, old: Handle | None) -> None:
        if self.heap is not None:
            self.heap.version_changed()
        stale = old.extras.pop("batcher", None) if old is not None else None
        if stale is not None and self.loop is not None and not self.loop.is_closed():
            # Queued requests of the old version still run; then its worker stops.
            self.loop.call_soon_threadsafe(lambda: self.loop.create_task(stale.close()))
        new = entry.handle
        if new is not None:  # its series exist (at 0) before its first request needs them
            self.metrics.prepare_model(self.metrics_label(new.servable.name))
        if new is not None and self.dynamic_batching and new.servable.max_batch_size > 0:
            name = new.servable.name
            new.extras["batcher"] = DynamicBatcher(
                new.servable,
                self.executor,
                max_delay_s=self.max_batch_delay_s,
                on_batch=lambda rows, n: self._on_batch(name, new.servable.version, rows, n),
            )

    async def close(self) -> None:
        """Stop the batchers of every loaded version."""
        for entry in list(self.repository.entries.values()):
            batcher = entry.handle.extras.pop("batcher", None) if entry.handle else None
            if batcher is not None:
                await batcher.close()

    # -- inference --------------------------------------------------------------------------

    def _on_batch(self, name: str, version: str, rows: int, requests: int) -> None:
        """Called on the thread that ran the batch."""
        trimmer.after_batch(rows)
        self.metrics.observe_batch(name, rows, requests)
        with self._stats_lock:
            self._stats_of(name, version).execution_count += 1

    def _execute_timed(self, servable: Servable, unit: Any) -> dict[str, np.ndarray]:
        out = servable.execute(unit)
        self._on_batch(servable.name, servable.version, int(getattr(unit, "batch_size", 1)), 1)
        return out

    async def infer(
        self,
        name: str,
        version: str,
        request: DecodedRequest,
        alive: Callable[[], bool] | None = None,
    ) -> InferResult:
        """Run one request (:meth:`start_infer`, awaited); raises a TierserveError for
        anything a caller got wrong.  A request whose awaiting task is cancelled, or whose
        ``alive()`` turns false, before its batch runs is dropped."""
        future = asyncio.get_running_loop().create_future()

        def done(result: InferResult | None, exc: BaseException | None) -> None:
            if future.done():  # cancelled meanwhile
                return
            if exc is None:
                future.set_result(result)
            else:
                future.set_exception(exc)

        def wanted() -> bool:
            return not future.done() and (alive is None or alive())

        self.start_infer(name, version, request, done, wanted)
        return await future

    def start_infer(
        self,
        name: str,
        version: str,
        request: DecodedRequest,
        done: Callable[[InferResult | None, BaseException | None], None],
        alive: Callable[[], bool] | None = None,
        sizes: list[int] | None = None,
    ) -> None:
        """The one entry of every transport's infer requests (:meth:`infer` awaits it), for
        a front end that answers from callbacks:
        raises a TierserveError at once for a request that cannot run, else ``done(result,
        None)`` or ``done(None, exception)`` is called later on the event loop.  ``alive()``
        false (its client gave up) before a batched request runs drops it
        (:class:`~tierserve.core.errors.RequestCancelledError`).  ``sizes``: ``request`` merges
        several clients' requests of these rows, one after another (each is counted in the
        statistics)."""
        started = time.perf_counter_ns()
        handle, servable, wanted, unit = self._begin(name, version, request, started, sizes)
        t0 = time.perf_counter_ns()

        def finish(outputs: dict[str, np.ndarray] | None, exc: BaseException | None) -> None:
            handle.release()
            _trim_after(request)
            ok = exc is None
            compute = time.perf_counter_ns() - t0 if ok else 0
            self._record(servable, request, ok, started, compute, t0 - started, sizes)
            if ok:
                done(self._result(servable, request, outputs, wanted), None)
            else:
                done(None, exc)

        try:
            batcher: DynamicBatcher | None = handle.extras.get("batcher")
            if batcher is not None:
                batcher.enqueue(unit, finish, alive)
                return
            loop = asyncio.get_running_loop()
            future = loop.run_in_executor(self.executor, self._execute_timed, servable, unit)
        except BaseException:
            handle.release()
            _trim_after(request)
            self._record(servable, request, False, started, 0, 0, sizes)
            raise
        future.add_done_callback(lambda f: finish(*_outcome(f)))

    def _begin(
        self,
        name: str,
        version: str,
        request: DecodedRequest,
        started: int,
        sizes: list[int] | None = None,
    ):
        """The handle (acquired), servable, requested outputs and prepared unit of a
        request; a request that fails its checks is recorded and raises."""
        handle = self.repository.acquire(name, version)
        servable = handle.servable
        try:
            servable.check(request.inputs, request.declared, self.limits)
            wanted = self._requested(servable, request)
            unit = servable.prepare(request.inputs)
        except BaseException:
            handle.release()
            _trim_after(request)
            if sizes is None:  # a merged request refused is retried request by request
                self._record(servable, request, False, started, 0)
            raise
        return handle, servable, wanted, unit

    @staticmethod
    def _result(servable: Servable, request: DecodedRequest, outputs, wanted) -> InferResult:
        return InferResult(
            model_name=servable.name,
            model_version=servable.version,
            id=request.id,
            outputs={n: outputs[n] for n in wanted},
            binary=wanted,
        )

    def _requested(self, servable: Servable, request: DecodedRequest) -> dict[str, bool]:
        names = [t.name for t in servable.outputs]
        if request.outputs is None:
            return {n: request.binary_output for n in names}
        wanted = {}
        for out in request.outputs:
            if out.name not in names:
                raise InvalidInputError(
                    f"unknown output {out.name!r}; the model's outputs are {names}"
                )
            wanted[out.name] = request.binary_output if out.binary is None else bool(out.binary)
        return wanted

    def _stats_of(self, name: str, version: str) -> ModelStats:
        """The statistics of one version (call with the lock held)."""
        st = self.stats.get((name, version))
        if st is None:
            st = self.stats[(name, version)] = ModelStats()
        return st

    def _record(
        self,
        servable: Servable,
        request,
        ok: bool,
        started: int,
        compute: int,
        prepare: int = 0,
        sizes: list[int] | None = None,
    ) -> None:
        now = time.perf_counter_ns()
        first = next(iter(request.inputs.values()), None)
        rows = first.shape[0] if first is not None and first.ndim else 1
        requests = 1 if sizes is None else len(sizes)
        with self._stats_lock:
            st = self._stats_of(servable.name, servable.version)
            st.last_inference = int(time.time() * 1000)
            if ok:
                st.inference_count += rows if servable.max_batch_size > 0 else 1
                st.success.add(now - started, requests)
                st.queue.add(0, requests)
                st.compute_input.add(prepare, requests)
                st.compute_infer.add(compute, requests)
                st.compute_output.add(0, requests)
                for size in sizes or (rows,):
                    size = size if servable.max_batch_size > 0 else 1
                    per_size = st.batches.get(size)
                    if per_size is None:
                        per_size = st.batches[size] = _Duration()
                    per_size.add(compute)
            else:
                st.fail.add(now - started, requests)


def _trim_after(request: DecodedRequest) -> None:
    """The heap goes back to the OS soon after a large request (by its rows or its
    tensors' bytes, :data:`~.allocator.trimmer`): once per request, whichever transport
    brought it."""
    inputs = request.inputs
    trimmer.after_request(inputs, sum(getattr(a, "nbytes", 0) for a in inputs.values()))
