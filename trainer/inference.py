"""``from hugectr.inference import ...`` reads ``from tierserve.trainer.inference import ...``:
the names of :mod:`tierserve.trainer.hugectr.inference`."""

from tierserve.trainer.hugectr.inference import *  # noqa: F403
from tierserve.trainer.hugectr.inference import __all__  # noqa: F401
