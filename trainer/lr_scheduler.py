"""HugeCTR's ``LearningRateScheduler``: linear warmup, then an optional polynomial decay.

For step ``s = 1, 2, ...`` (the value :meth:`LearningRateScheduler.get_next` returns for the
s-th update), exactly as HugeCTR's ``learning_rate_scheduler.hpp`` computes it:

* ``s <= warmup_steps``: ``lr * s / warmup_steps``;
* else, with ``decay_start == 0`` (no decay): ``lr``;
* else ``s <= decay_start``: ``lr``;
* else ``s <= decay_start + decay_steps``:
  ``max(lr * ((decay_start + decay_steps - s) / decay_steps) ** decay_power, end_lr)``;
* else ``end_lr``.

HugeCTR's defaults (``warmup_steps=1``, ``decay_start=0``) give a constant ``lr``.
"""

from __future__ import annotations

from tierserve.core.errors import InvalidInputError


class LearningRateScheduler:
    """The learning rate of each training step (HugeCTR's low-level ``LearningRateScheduler``)."""

    def __init__(
        self,
        base_lr: float,
        warmup_steps: int = 1,
        decay_start: int = 0,
        decay_steps: int = 1,
        decay_power: float = 2.0,
        end_lr: float = 0.0,
    ) -> None:
        self.reset(base_lr, warmup_steps, decay_start, decay_steps, decay_power, end_lr)

    def reset(
        self,
        base_lr: float,
        warmup_steps: int = 1,
        decay_start: int = 0,
        decay_steps: int = 1,
        decay_power: float = 2.0,
        end_lr: float = 0.0,
    ) -> None:
        """Start over with new settings (``Model.reset_learning_rate_scheduler``)."""
        if (base_lr < 0 or warmup_steps < 1 or decay_steps < 1 or decay_power < 1.0
                or end_lr < 0 or decay_start < 0):
            raise InvalidInputError(
                "learning rate scheduler needs lr >= 0, warmup_steps >= 1, decay_start >= 0, "
                f"decay_steps >= 1, decay_power >= 1 and end_lr >= 0; got lr={base_lr}, "
                f"warmup_steps={warmup_steps}, decay_start={decay_start}, "
                f"decay_steps={decay_steps}, decay_power={decay_power}, end_lr={end_lr}"
            )
        self.base_lr = float(base_lr)
        self.warmup_steps = int(warmup_steps)
        self.decay_start = int(decay_start)
        self.decay_steps = int(decay_steps)
        self.decay_power = float(decay_power)
        self.end_lr = float(end_lr)
        self.step = 0
        self.current_lr = 0.0

    def lr_at(self, step: int) -> float:
        """The learning rate of update number ``step`` (1-based), without advancing."""
        if step <= self.warmup_steps:
            return step * self.base_lr / self.warmup_steps
        if self.decay_start == 0 or step <= self.decay_start:
            return self.base_lr
        if step <= self.decay_start + self.decay_steps:
            factor = ((self.decay_start + self.decay_steps - step) / self.decay_steps
                      ) ** self.decay_power
            return max(self.base_lr * factor, self.end_lr)
        return self.end_lr

    def get_next(self) -> float:
        """Advance one step and return its learning rate."""
        self.step += 1
        self.current_lr = self.lr_at(self.step)
        return self.current_lr

    def get_lr(self) -> float:
        """The rate :meth:`get_next` returned last (0 before the first call)."""
        return self.current_lr

    def get_step(self) -> int:
        """How many times :meth:`get_next` was called since construction or reset."""
        return self.step
