"""Session hooks (as ``tf.estimator.SessionRunHook`` and friends): code run around each
training, evaluation or prediction step.

A hook's ``before_run`` may return :class:`SessionRunArgs` naming tensors to fetch (graph
tensors returned by ``model_fn``, their names, or ``'loss'`` / ``'global_step'``); its
``after_run`` gets their values in ``run_values.results`` and may call
``run_context.request_stop()``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from tierserve.core.errors import ConfigError

log = logging.getLogger("tierserve.trainer.estimator")


@dataclass
class SessionRunArgs:
    """What ``before_run`` asks for: ``fetches`` (a tensor, name, list or dict of them)."""

    fetches: Any = None
    feed_dict: Any = None
    options: Any = None


@dataclass
class SessionRunValues:
    results: Any
    options: Any = None
    run_metadata: Any = None


class SessionRunContext:
    """Handed to ``before_run`` / ``after_run``: the step's original args and a stop flag."""

    def __init__(self, original_args: SessionRunArgs | None = None, session: Any = None
                 ) -> None:
        self.original_args = original_args
        self.session = session
        self._stop = False

    def request_stop(self) -> None:
        self._stop = True

    @property
    def stop_requested(self) -> bool:
        return self._stop


class SessionRunHook:
    """Base class: every method does nothing."""

    def begin(self) -> None:
        pass

    def after_create_session(self, session: Any, coord: Any) -> None:
        pass

    def before_run(self, run_context: SessionRunContext) -> SessionRunArgs | None:
        return None

    def after_run(self, run_context: SessionRunContext, run_values: SessionRunValues) -> None:
        pass

    def end(self, session: Any) -> None:
        pass


class StopAtStepHook(SessionRunHook):
    """Stop after ``num_steps`` more steps or at global step ``last_step`` (one of them)."""

    def __init__(self, num_steps: int | None = None, last_step: int | None = None) -> None:
        if (num_steps is None) == (last_step is None):
            raise ConfigError("StopAtStepHook: give exactly one of num_steps and last_step")
        self.num_steps, self.last_step = num_steps, last_step

    def after_create_session(self, session: Any, coord: Any) -> None:
        if self.num_steps is not None:
            self.last_step = session.global_step + int(self.num_steps)

    def before_run(self, run_context):
        return SessionRunArgs("global_step")

    def after_run(self, run_context, run_values):
        if run_values.results >= self.last_step:
            run_context.request_stop()


class LoggingTensorHook(SessionRunHook):
    """Log ``tensors`` (a list or dict of tensors / names) every ``every_n_iter`` steps or
    ``every_n_secs`` seconds, and at the end with ``at_end``."""

    def __init__(self, tensors: Any, every_n_iter: int | None = None,
                 every_n_secs: float | None = None, at_end: bool = False,
                 formatter: Any = None) -> None:
        if (every_n_iter is None) == (every_n_secs is None) and not at_end:
            raise ConfigError("LoggingTensorHook: give exactly one of every_n_iter and "
                              "every_n_secs (or only at_end=True)")
        if isinstance(tensors, dict):
            self.tensors = dict(tensors)
        else:
            self.tensors = {getattr(t, "name", t): t for t in tensors}
        self.every_n_iter, self.every_n_secs = every_n_iter, every_n_secs
        self.at_end, self.formatter = at_end, formatter
        self.logged: list[dict[str, Any]] = []  # what was logged (for callers and tests)
        self._iter = 0
        self._last_time = None
        self._last = None

    def before_run(self, run_context):
        return SessionRunArgs(dict(self.tensors))

    def _due(self) -> bool:
        if self.every_n_iter is not None:
            return self._iter % int(self.every_n_iter) == 0
        if self.every_n_secs is not None:
            now = time.monotonic()
            if self._last_time is None or now - self._last_time >= self.every_n_secs:
                self._last_time = now
                return True
        return False

    def _log(self, values: dict[str, Any]) -> None:
        self.logged.append(values)
        if self.formatter is not None:
            log.info("%s", self.formatter(values))
        else:
            log.info("%s", ", ".join(f"{k} = {v}" for k, v in values.items()))

    def after_run(self, run_context, run_values):
        self._last = run_values.results
        if self._due():
            self._log(run_values.results)
        self._iter += 1

    def end(self, session):
        if self.at_end and self._last is not None:
            self._log(self._last)


class CheckpointSaverListener:
    """Called around each checkpoint a :class:`CheckpointSaverHook` writes."""

    def begin(self) -> None:
        pass

    def before_save(self, session: Any, global_step_value: int) -> None:
        pass

    def after_save(self, session: Any, global_step_value: int) -> bool | None:
        return None

    def end(self, session: Any, global_step_value: int) -> None:
        pass


class CheckpointSaverHook(SessionRunHook):
    """Save a checkpoint into ``checkpoint_dir`` every ``save_steps`` steps or ``save_secs``
    seconds (one of them) and at the end; ``listeners`` are told around each save."""

    def __init__(self, checkpoint_dir: str, save_secs: float | None = None,
                 save_steps: int | None = None, saver: Any = None,
                 checkpoint_basename: str = "model.ckpt", scaffold: Any = None,
                 listeners: list | None = None, save_graph_def: bool = True) -> None:
        if (save_secs is None) == (save_steps is None):
            raise ConfigError("CheckpointSaverHook: give exactly one of save_secs and "
                              "save_steps")
        if saver is not None or scaffold is not None:
            raise ConfigError("CheckpointSaverHook: saver and scaffold are not supported")
        self.checkpoint_dir = str(checkpoint_dir)
        self.save_secs, self.save_steps = save_secs, save_steps
        self.basename = checkpoint_basename
        self.listeners = list(listeners or [])
        self._last_step = None
        self._last_time = None

    def begin(self) -> None:
        for listener in self.listeners:
            listener.begin()

    def after_create_session(self, session, coord):
        self._last_step = session.global_step
        self._last_time = time.monotonic()

    def _save(self, session) -> None:
        step = session.global_step
        for listener in self.listeners:
            listener.before_save(session, step)
        session.save_checkpoint(self.checkpoint_dir, self.basename)
        self._last_step, self._last_time = step, time.monotonic()
        for listener in self.listeners:
            if listener.after_save(session, step):
                session.request_stop()

    def after_run(self, run_context, run_values):
        session = run_context.session
        step = session.global_step
        if self.save_steps is not None:
            due = step - self._last_step >= int(self.save_steps)
        else:
            due = time.monotonic() - self._last_time >= float(self.save_secs)
        if due:
            self._save(session)

    def end(self, session):
        if session.global_step != self._last_step:
            self._save(session)
        for listener in self.listeners:
            listener.end(session, session.global_step)


class FinalOpsHook(SessionRunHook):
    """Kept for code that builds one; holds ``final_ops`` values after ``end``."""

    def __init__(self, final_ops: Any, final_ops_feed_dict: Any = None) -> None:
        self.final_ops = final_ops
        self.final_ops_values = None


__all__ = [
    "CheckpointSaverHook", "CheckpointSaverListener", "FinalOpsHook", "LoggingTensorHook",
    "SessionRunArgs", "SessionRunContext", "SessionRunHook", "SessionRunValues",
    "StopAtStepHook",
]


class GraphSummaryHook(SessionRunHook):
    """Writes the ``tf.summary.scalar`` values a ``model_fn`` registered every
    ``every_n_steps`` training steps: a loss's value, a scalar tensor's value, a metric's
    running value over the steps so far (TensorFlow's streaming metrics in training)."""

    def __init__(self, summaries: dict[str, Any], writer: Any, every_n_steps: int) -> None:
        self.summaries = dict(summaries)
        self.writer = writer
        self.every = int(every_n_steps)
        self._step = 0

    def begin(self) -> None:
        for value in self.summaries.values():
            if hasattr(value, "reset"):
                value.reset()

    def before_run(self, run_context):
        fetches = {}
        for name, value in self.summaries.items():
            terms = getattr(value, "terms", None)
            fetches[name] = (list(terms) if terms is not None
                             else list(value.tensors) if hasattr(value, "tensors") else value)
        return SessionRunArgs(fetches)

    def after_run(self, run_context, run_values):
        self._step = run_context.session.global_step if run_context.session else self._step + 1
        out = {}
        for name, got in run_values.results.items():
            value = self.summaries[name]
            if hasattr(value, "terms"):
                out[name] = sum(s * float(np.asarray(v)) for s, v in zip(value.terms.values(), got))
            elif hasattr(value, "update"):
                value.update(got)
                out[name] = value.result()
            else:
                out[name] = float(np.asarray(got).mean())
        if self.every and self._step % self.every == 0:
            self.writer.scalars(out, self._step)
