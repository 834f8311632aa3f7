"""HugeCTR's parameter initializers: Uniform, XavierNorm, XavierUniform, Zero, Default.

Each layer decides what ``Default`` means for each of its parameters (HugeCTR's per-layer
defaults); the other types mean the same everywhere, given the fan-in and fan-out.
"""

from __future__ import annotations

import math

import numpy as np

from tierserve.core.errors import ConfigError

INITIALIZER_NAMES = ("Default", "Uniform", "XavierNorm", "XavierUniform", "Zero")

# sqrt(scale) / this is the standard deviation of a normal truncated at +-2 sigma whose
# variance is ``scale`` (the TensorFlow / HugeCTR variance-scaling convention).
_TRUNCATED_NORMAL_STD = 0.87962566103423978


def initializer_name(value: object) -> str:
    """``Initializer_t.XavierNorm``, ``"XavierNorm"`` or ``None`` (Default) -> a name."""
    if value is None:
        return "Default"
    name = getattr(value, "name", value)
    if not isinstance(name, str) or name not in INITIALIZER_NAMES:
        raise ConfigError(f"unknown initializer {value!r}; expected one of {INITIALIZER_NAMES}")
    return name


def truncated_normal(rng: np.random.Generator, shape, std: float) -> np.ndarray:
    """Normal(0, std) samples, redrawn until inside +-2 std."""
    out = rng.normal(0.0, std, size=shape)
    bad = np.abs(out) > 2 * std
    while bad.any():
        out[bad] = rng.normal(0.0, std, size=int(bad.sum()))
        bad = np.abs(out) > 2 * std
    return out


def variance_scaling(
    rng: np.random.Generator, shape, fan_in: float, fan_out: float, uniform: bool
) -> np.ndarray:
    """Variance scaling with scale 1 over the average fan (Glorot / Xavier)."""
    fan_avg = max(1.0, (fan_in + fan_out) / 2.0)
    if uniform:
        limit = math.sqrt(3.0 / fan_avg)
        return rng.uniform(-limit, limit, size=shape)
    return truncated_normal(rng, shape, math.sqrt(1.0 / fan_avg) / _TRUNCATED_NORMAL_STD)


def initialize(
    rng: np.random.Generator,
    kind: str,
    shape,
    fan_in: float,
    fan_out: float,
    default: str,
    uniform_limit: float | None = None,
) -> np.ndarray:
    """A float32 array of ``shape`` initialised by ``kind`` (``Default`` means ``default``).

    ``default`` may also be ``"One"``, ``"Zero"`` or ``"BiasNormal"`` (HugeCTR's fully
    connected bias: normal with std sqrt(1/fan_out) truncated at +-2 std).  ``Uniform`` draws
    from +-``uniform_limit`` (HugeCTR: 1/(fan_in + fan_out)).
    """
    if kind == "Default":
        kind = default
    if kind == "Zero":
        out = np.zeros(shape)
    elif kind == "One":
        out = np.ones(shape)
    elif kind == "Uniform":
        limit = uniform_limit if uniform_limit is not None else 1.0 / max(1.0, fan_in + fan_out)
        out = rng.uniform(-limit, limit, size=shape)
    elif kind == "XavierUniform":
        out = variance_scaling(rng, shape, fan_in, fan_out, uniform=True)
    elif kind == "XavierNorm":
        out = variance_scaling(rng, shape, fan_in, fan_out, uniform=False)
    elif kind == "BiasNormal":
        std = math.sqrt(1.0 / max(1.0, fan_out))
        out = np.clip(rng.normal(0.0, std, size=shape), -2 * std, 2 * std)
    else:
        raise ConfigError(f"unknown initializer {kind!r}")
    return out.astype(np.float32)
