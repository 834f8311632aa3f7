"""Every dense layer, forward and backward, written once against ``xp`` (numpy or cupy).

``build_layer(config)`` makes the layer object for a graph-JSON layer dict; see
:mod:`.base` for the contract shared by training and the inference server.
"""

from . import (
    activation,
    elementwise,
    interaction,
    linear,
    loss,
    normalization,
    recurrent,
    shape,
)
from .base import LAYER_TYPES, Layer, Shape, build_layer, register
from .loss import LossLayer

__all__ = [
    "LAYER_TYPES",
    "Layer",
    "LossLayer",
    "Shape",
    "activation",
    "build_layer",
    "elementwise",
    "interaction",
    "linear",
    "loss",
    "normalization",
    "recurrent",
    "register",
    "shape",
]
