"""``hugectr.tools``: the synthetic data generator (``DataGeneratorParams``, ``DataGenerator``)."""

from tierserve.trainer.data.generator import (
    DataGenerator,
    DataGeneratorParams,
    Distribution_t,
    PowerLaw_t,
)

__all__ = ["DataGenerator", "DataGeneratorParams", "Distribution_t", "PowerLaw_t"]
