"""``train_and_evaluate`` with ``TrainSpec`` / ``EvalSpec`` (as ``tf.estimator``), in this
process: training runs to ``TrainSpec.max_steps``; after a checkpoint is saved, evaluation
runs when ``EvalSpec.start_delay_secs`` have passed since training started and
``throttle_secs`` since the last evaluation, then the exporters run on its result; a final
evaluation (and export) follows the last step.  HybridBackend's ``eval_every_n_iter``
evaluates every n steps instead (saving a checkpoint first).

Under ``mpiexec -n N`` every rank trains; the chief (rank 0) alone evaluates the whole
evaluation input on each checkpoint it wrote and runs the exporters (one version per export),
while the other ranks wait for it at their next step; they return ``(None, [])``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tierserve.core.errors import ConfigError

from .hooks import CheckpointSaverListener, SessionRunHook


@dataclass
class TrainSpec:
    """Training input, the global step to stop at (None: until the input ends) and hooks."""

    input_fn: Callable | Any
    max_steps: int | None = None
    hooks: Sequence[SessionRunHook] = ()

    def __post_init__(self) -> None:
        if self.max_steps is not None and int(self.max_steps) <= 0:
            raise ConfigError(f"TrainSpec: max_steps must be positive, got {self.max_steps}")
        self.hooks = list(self.hooks or [])


@dataclass
class EvalSpec:
    """Evaluation input, batches per evaluation (None: the whole input), its name, hooks,
    exporters, and the delays (seconds) before the first and between evaluations."""

    input_fn: Callable | Any
    steps: int | None = 100
    name: str | None = None
    hooks: Sequence[SessionRunHook] | None = None
    exporters: Any = None
    start_delay_secs: float = 120
    throttle_secs: float = 600

    def __post_init__(self) -> None:
        if self.steps is not None and int(self.steps) <= 0:
            raise ConfigError(f"EvalSpec: steps must be positive, got {self.steps}")
        if self.start_delay_secs < 0 or self.throttle_secs < 0:
            raise ConfigError("EvalSpec: start_delay_secs and throttle_secs must be >= 0")
        ex = self.exporters
        self.exporters = [] if ex is None else list(ex) if isinstance(ex, (list, tuple)) else [ex]
        names = [e.name for e in self.exporters]
        if len(set(names)) != len(names):
            raise ConfigError(f"EvalSpec: exporter names must be unique, got {names}")
        self.hooks = list(self.hooks or [])


@dataclass
class _Evaluator:
    estimator: Any
    eval_spec: EvalSpec
    active: bool = True  # False on the ranks other than the chief: they never evaluate
    started: float = field(default_factory=time.monotonic)
    last_time: float | None = None
    last_step: int | None = None
    result: dict | None = None
    exports: list = field(default_factory=list)

    def due(self) -> bool:
        if not self.active:
            return False
        now = time.monotonic()
        if now - self.started < self.eval_spec.start_delay_secs:
            return False
        return self.last_time is None or now - self.last_time >= self.eval_spec.throttle_secs

    def run(self, final: bool = False) -> dict | None:
        if not self.active:
            return None
        est, spec = self.estimator, self.eval_spec
        self.result = est.evaluate(spec.input_fn, steps=spec.steps, hooks=spec.hooks,
                                   name=spec.name)
        self.last_time, self.last_step = time.monotonic(), self.result["global_step"]
        path = est.latest_checkpoint()
        for exporter in spec.exporters:
            base = os.path.join(est.model_dir, "export", exporter.name)
            out = exporter.export(est, base, path, self.result, final)
            if out is not None:
                self.exports.append(out)
        return self.result


class _EvalAfterSave(CheckpointSaverListener):
    def __init__(self, evaluator: _Evaluator) -> None:
        self.evaluator = evaluator

    def after_save(self, session, global_step_value):
        if self.evaluator.due() and self.evaluator.last_step != global_step_value:
            self.evaluator.run()


class _EvalEveryN(SessionRunHook):
    def __init__(self, evaluator: _Evaluator, n: int) -> None:
        self.evaluator, self.n = evaluator, int(n)

    def after_run(self, run_context, run_values):
        session = run_context.session
        if session.global_step % self.n == 0:
            session.save_checkpoint()
            self.evaluator.run()


def train_and_evaluate(estimator: Any, train_spec: TrainSpec, eval_spec: EvalSpec,
                       eval_every_n_iter: int | None = None) -> tuple[dict | None, list]:
    """Train and evaluate (see the module docstring); returns the last evaluation's metrics
    and what the exporters returned."""
    if not isinstance(train_spec, TrainSpec):
        raise ConfigError(f"train_and_evaluate: train_spec must be a TrainSpec, got "
                          f"{type(train_spec).__name__}")
    if not isinstance(eval_spec, EvalSpec):
        raise ConfigError(f"train_and_evaluate: eval_spec must be an EvalSpec, got "
                          f"{type(eval_spec).__name__}")
    if eval_every_n_iter is not None and int(eval_every_n_iter) <= 0:
        raise ConfigError(f"eval_every_n_iter must be positive, got {eval_every_n_iter}")
    from .export import check_servable

    for exporter in eval_spec.exporters or ():  # refused now, not after the training
        receiver_fn = getattr(exporter, "serving_input_receiver_fn", None)
        if receiver_fn is not None:
            check_servable(estimator, receiver_fn)
    dist = getattr(estimator, "_dist", None)
    evaluator = _Evaluator(estimator, eval_spec) if dist is None else _Evaluator(
        dist.twin(estimator), eval_spec, active=dist.is_chief)  # the chief, from checkpoints
    hooks = list(train_spec.hooks)
    listeners = []
    if eval_every_n_iter is not None:
        hooks.append(_EvalEveryN(evaluator, eval_every_n_iter))
    else:
        listeners.append(_EvalAfterSave(evaluator))
    estimator.train(train_spec.input_fn, hooks=hooks, max_steps=train_spec.max_steps,
                    saving_listeners=listeners)
    if estimator.latest_checkpoint() is None:
        raise ConfigError("train_and_evaluate: training wrote no checkpoint (did the train "
                          "input_fn give any data?)")
    step = estimator._store.global_step
    if evaluator.active and evaluator.last_step != step:
        evaluator.run(final=True)
    return evaluator.result, evaluator.exports


__all__ = ["EvalSpec", "TrainSpec", "train_and_evaluate"]
