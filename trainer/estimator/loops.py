"""The loops behind ``Estimator.train``, ``evaluate`` and ``predict``: each reads the
``input_fn``'s batches, runs them through the mode's :class:`~.program.Program` and drives
the hooks (``begin``, ``before_run`` / ``after_run`` around each step, ``end``); training
also counts the global step, logs the step rate and writes summaries, evaluation sums the
losses and ``eval_metric_ops``.  The :class:`~.estimator.Estimator` keeps the public methods
and the model (programs, variables, checkpoints); these functions take it as ``est``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tierserve.core.errors import ConfigError, InvalidInputError

from .fetches import _fetch, _progress, _value
from .hooks import GraphSummaryHook, SessionRunContext, SessionRunHook, SessionRunValues
from .program import Program, StepResult
from .spec import ModeKeys

if TYPE_CHECKING:
    from .estimator import Estimator

log = logging.getLogger("tierserve.trainer.estimator")


class Session:
    """What hooks see as the session: the global step, checkpoints and a stop request."""

    def __init__(self, estimator: Estimator) -> None:
        self._estimator = estimator
        self.stop = False

    @property
    def global_step(self) -> int:
        return self._estimator._store.global_step

    def save_checkpoint(self, directory: str | None = None, basename: str = "model.ckpt"
                        ) -> Path:
        return self._estimator._save(directory, basename)

    def request_stop(self) -> None:
        self.stop = True


# -- hooks --------------------------------------------------------------------------------------

def _begin(hooks: list[SessionRunHook], session: Session) -> None:
    for h in hooks:
        h.begin()
    for h in hooks:
        h.after_create_session(session, None)


def _end(hooks: list[SessionRunHook], session: Session) -> None:
    for h in hooks:
        h.end(session)


def _after_run(hooks: list[SessionRunHook], ctx: SessionRunContext, requests: list,
               result: StepResult, step: int) -> None:
    for h, req in zip(hooks, requests):
        values = None if req is None else _fetch(req.fetches, result, step)
        h.after_run(ctx, SessionRunValues(values))


# -- train --------------------------------------------------------------------------------------

def _check_steps(steps: int | None, max_steps: int | None) -> None:
    if steps is not None and max_steps is not None:
        raise ConfigError("train: give steps or max_steps, not both")
    for name, v in (("steps", steps), ("max_steps", max_steps)):
        if v is not None and int(v) <= 0:
            raise ConfigError(f"train: {name} must be positive, got {v}")


def _last_step(est: Estimator, steps: int | None, max_steps: int | None) -> int | None:
    """The global step training stops at (None: when the input ends)."""
    if steps is not None:
        return est._store.global_step + int(steps)
    return int(max_steps) if max_steps is not None else None


@dataclass
class _TrainRun:
    """One ``train`` call's hooks, summary writer and step-rate clock."""

    est: Estimator
    hooks: list[SessionRunHook]
    last: int | None
    session: Session = field(init=False)
    writer: Any = None
    rate_t: float = field(default_factory=time.perf_counter)
    rate_step: int = 0

    def __post_init__(self) -> None:
        self.session = Session(self.est)
        self.rate_step = self.est._store.global_step

    def start(self, prog: Program, labels: Any, saving_listeners: list | None) -> None:
        """The first batch built the program: add its hooks, the saver and the summary
        hook, and begin them."""
        est = self.est
        chief_hooks = prog.spec.training_chief_hooks if est._config.is_chief else []
        self.hooks = self.hooks + list(chief_hooks) + list(prog.spec.training_hooks)
        self.hooks.append(est._saver_hook(saving_listeners))
        self.writer = est._writer("train")
        if self.writer is not None and prog.graph.summaries:  # tf.summary.scalar
            self.hooks.append(GraphSummaryHook(prog.graph.summaries, self.writer,
                                               est._config.save_summary_steps))
        _begin(self.hooks, self.session)
        est._check_head_labels(prog, labels)

    def step(self, prog: Program, features: dict, labels: Any, progress: Any) -> bool:
        """Train one batch; True when training should stop."""
        store = self.est._store
        ctx = SessionRunContext(session=self.session)
        requests = [h.before_run(ctx) for h in self.hooks]
        result = prog.run(features, labels, training=True)
        store.global_step += 1
        step = store.global_step
        _after_run(self.hooks, ctx, requests, result, step)
        progress.update(1)
        self._report(prog, result, step, progress)
        stop = ctx.stop_requested or self.session.stop or (
            self.last is not None and step >= self.last)
        if self.est._dist is not None:  # a hook's stop on one rank stops every rank
            stop = self.est._dist.any(stop, "training stop")
        return stop

    def _report(self, prog: Program, result: StepResult, step: int, progress: Any) -> None:
        """Log the loss and step rate every ``log_step_count_steps``; write the loss and
        learning rates every ``save_summary_steps``."""
        config, writer = self.est._config, self.writer
        every = config.log_step_count_steps
        if every and (step % every == 0):
            now = time.perf_counter()
            rate = (step - self.rate_step) / max(now - self.rate_t, 1e-9)
            log.info("loss = %.6g, step = %d (%.1f global_step/sec)", result.loss,
                     step, rate)
            progress.set_postfix(loss=f"{result.loss:.5f}")
            if writer is not None:
                writer.scalars({"global_step/sec": rate}, step)
            self.rate_t, self.rate_step = now, step
        sumsteps = config.save_summary_steps
        if writer is not None and sumsteps and step % sumsteps == 0:
            writer.scalars({"loss": result.loss, **prog.learning_rates()}, step)

    def finish(self) -> None:
        _end(self.hooks, self.session)
        if self.writer is not None:
            self.est._close_writer(self.writer)


def train(est: Estimator, input_fn: Any, hooks: list[SessionRunHook] | None,
          steps: int | None, max_steps: int | None, saving_listeners: list | None) -> None:
    """``Estimator.train`` (see there)."""
    _check_steps(steps, max_steps)
    est._restore()
    store = est._store
    if max_steps is not None and store.global_step >= int(max_steps):
        log.info("Skipping training since max_steps has already saved.")
        return
    last = _last_step(est, steps, max_steps)
    hooks = list(hooks or [])
    for h in hooks:
        if not isinstance(h, SessionRunHook):
            raise ConfigError(f"train: hooks must be SessionRunHooks, got {h!r}")
    run = _TrainRun(est, hooks, last)
    prog = None
    progress = _progress(None if last is None else last - store.global_step)
    try:
        for features, labels in est._batches(input_fn, ModeKeys.TRAIN, True):
            labels = est._labels_for(labels)
            if labels is None:
                raise InvalidInputError("train: the input_fn gave no labels")
            started = prog is not None
            prog = est._program(ModeKeys.TRAIN, features, labels)
            if not started:
                run.start(prog, labels, saving_listeners)
            if run.step(prog, features, labels, progress):
                break
    finally:
        progress.close()
        if prog is not None:
            run.finish()


# -- evaluate -----------------------------------------------------------------------------------

@dataclass
class _EvalTotals:
    """What ``evaluate`` sums over its batches, and what a merge over ranks recomputes the
    metrics from (``recorded``, ``batch_losses``; kept only when ``gather``)."""

    gather: Any
    ops: dict[str, Any] = field(default_factory=dict)
    n_batches: int = 0
    loss_sum: float = 0.0
    weighted_sum: float = 0.0
    examples: int = 0
    recorded: dict[str, list] = field(default_factory=dict)
    batch_losses: list[tuple[float, int]] = field(default_factory=list)

    def add(self, prog: Program, result: StepResult) -> None:
        for key, op in self.ops.items():
            values = [_value(t, result) for t in op.tensors]
            op.update(values)
            if self.gather is not None:
                self.recorded.setdefault(key, []).append(values)
        if self.gather is not None:
            self.batch_losses.append((result.loss, result.batch_size))
        self.loss_sum += result.loss
        self.weighted_sum += (result.loss if prog.loss_is_sum
                              else result.loss * result.batch_size)
        self.examples += result.batch_size
        self.n_batches += 1

    def metrics(self) -> dict[str, Any]:
        if self.gather is not None:  # collective: every rank's batches
            return self.gather(self.ops, self.recorded, self.batch_losses)
        if self.n_batches == 0:
            raise InvalidInputError("evaluate: the input_fn gave no batches")
        metrics = {k: op.result() for k, op in self.ops.items()}
        metrics["loss"] = self.loss_sum / self.n_batches
        metrics["average_loss"] = self.weighted_sum / max(self.examples, 1)
        return metrics


def _evaluate_batches(est: Estimator, input_fn: Any, steps: int | None,
                      hooks: list[SessionRunHook], totals: _EvalTotals) -> None:
    session = Session(est)
    prog = None
    try:
        for features, labels in est._batches(input_fn, ModeKeys.EVAL, steps is not None):
            labels = est._labels_for(labels)
            if labels is None:
                raise InvalidInputError("evaluate: the input_fn gave no labels")
            p = est._program(ModeKeys.EVAL, features, labels)
            if prog is None:
                prog = p
                totals.ops = dict(prog.spec.eval_metric_ops or {})
                for op in totals.ops.values():
                    op.reset()
                hooks = hooks + list(prog.spec.evaluation_hooks)
                _begin(hooks, session)
                est._check_head_labels(prog, labels)
            ctx = SessionRunContext(session=session)
            requests = [h.before_run(ctx) for h in hooks]
            result = p.run(features, labels, training=False)
            totals.add(p, result)
            _after_run(hooks, ctx, requests, result, est._store.global_step)
            if ctx.stop_requested or (steps is not None and totals.n_batches >= int(steps)):
                break
    finally:
        if prog is not None:
            _end(hooks, session)


def evaluate(est: Estimator, input_fn: Any, steps: int | None,
             hooks: list[SessionRunHook] | None, checkpoint_path: str | None,
             name: str | None) -> dict[str, Any]:
    """``Estimator.evaluate`` in this process (see there)."""
    est._restore(checkpoint_path)
    if est.latest_checkpoint() is None and est._store.global_step == 0:
        log.warning("evaluate: no checkpoint in %s; evaluating the initial model",
                    est._model_dir)
    totals = _EvalTotals(est._gather_eval)
    _evaluate_batches(est, input_fn, steps, list(hooks or []), totals)
    metrics = totals.metrics()
    metrics["global_step"] = est._store.global_step
    writer = est._writer("eval" if name is None else f"eval_{name}")
    if writer is not None:
        writer.scalars({k: v for k, v in metrics.items() if k != "global_step"},
                       est._store.global_step)
        est._close_writer(writer)
    log.info("Saving dict for global step %d: %s", est._store.global_step,
             ", ".join(f"{k} = {v:.6g}" for k, v in sorted(metrics.items())))
    return metrics


# -- predict ------------------------------------------------------------------------------------

def predict(est: Estimator, input_fn: Any, predict_keys: list[str] | None,
            hooks: list[SessionRunHook] | None, checkpoint_path: str | None,
            yield_single_examples: bool) -> Iterator[Any]:
    """``Estimator.predict`` in this process (see there)."""
    est._restore(checkpoint_path)
    session = Session(est)
    hooks = list(hooks or [])
    started = False
    try:
        for features, _labels in est._batches(input_fn, ModeKeys.PREDICT, False):
            prog = est._program(ModeKeys.PREDICT, features, None)
            if not started:
                started = True
                hooks = hooks + list(prog.spec.prediction_hooks)
                _begin(hooks, session)
            ctx = SessionRunContext(session=session)
            requests = [h.before_run(ctx) for h in hooks]
            result = prog.run(features, None, training=False)
            values = prediction_values(prog, result, predict_keys)
            _after_run(hooks, ctx, requests, result, est._store.global_step)
            if not yield_single_examples:
                yield values
            elif isinstance(values, dict):
                for i in range(result.batch_size):
                    yield {k: v[i] for k, v in values.items()}
            else:
                yield from values
            if ctx.stop_requested:
                break
    finally:
        if started:
            _end(hooks, session)


def prediction_values(prog: Program, result: StepResult, keys: list[str] | None) -> Any:
    """The model_fn's predictions for one batch: a dict (``keys`` of it when given, derived
    predictions included) or one tensor's value."""
    preds = prog.spec.predictions
    if isinstance(preds, dict):
        values = {k: _value(t, result) for k, t in preds.items()}
        for k, fn in prog.spec.derived_predictions.items():
            values[k] = fn(values)
        if keys is not None:
            unknown = [k for k in keys if k not in values]
            if unknown:
                raise InvalidInputError(f"predict_keys {unknown} are not predictions of "
                                        f"this model ({', '.join(values)})")
            values = {k: values[k] for k in keys}
        return values
    if keys is not None:
        raise InvalidInputError("predict_keys: the model's predictions is one tensor, "
                                "not a dict")
    return _value(preds, result)


__all__ = ["Session", "evaluate", "predict", "prediction_values", "train"]
