"""The learning rate schedule against hand-computed values."""

from __future__ import annotations

import pytest

from tierserve.core.errors import InvalidInputError
from tierserve.trainer.lr_scheduler import LearningRateScheduler


def _take(s: LearningRateScheduler, n: int) -> list[float]:
    return [s.get_next() for _ in range(n)]


def test_defaults_are_a_constant_rate():
    assert _take(LearningRateScheduler(0.001), 4) == [0.001] * 4


def test_warmup_hold_decay_end():
    # warmup 4 steps to 1.0, hold until step 6, decay over 4 steps with power 2, end 0.05
    s = LearningRateScheduler(1.0, warmup_steps=4, decay_start=6, decay_steps=4,
                              decay_power=2.0, end_lr=0.05)
    expected = [
        0.25, 0.5, 0.75, 1.0,  # steps 1-4: s / 4
        1.0, 1.0,  # steps 5-6: held
        (3 / 4) ** 2, (2 / 4) ** 2, (1 / 4) ** 2,  # steps 7-9: ((10 - s) / 4) ** 2
        0.05,  # step 10: (0/4)**2 = 0 < end_lr
        0.05, 0.05,  # after the decay: end_lr
    ]
    assert _take(s, 12) == pytest.approx(expected)
    assert s.get_step() == 12 and s.get_lr() == pytest.approx(0.05)


def test_decay_start_zero_means_no_decay_even_after_warmup():
    s = LearningRateScheduler(2.0, warmup_steps=2, decay_start=0, decay_steps=3, end_lr=0.0)
    assert _take(s, 5) == pytest.approx([1.0, 2.0, 2.0, 2.0, 2.0])


def test_reset_starts_over_with_new_settings():
    s = LearningRateScheduler(1.0, warmup_steps=2)
    _take(s, 3)
    s.reset(0.5, warmup_steps=1, decay_start=1, decay_steps=2, decay_power=1.0)
    assert s.get_lr() == 0.0
    assert _take(s, 4) == pytest.approx([0.5, 0.25, 0.0, 0.0])


@pytest.mark.parametrize("kwargs", [
    {"warmup_steps": 0}, {"decay_steps": 0}, {"decay_power": 0.5}, {"end_lr": -1.0},
])
def test_bad_settings_raise(kwargs):
    with pytest.raises(InvalidInputError, match="scheduler"):
        LearningRateScheduler(0.1, **kwargs)
