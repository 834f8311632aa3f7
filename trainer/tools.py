"""``from hugectr.tools import ...`` reads ``from tierserve.trainer.tools import ...``: the
names of :mod:`tierserve.trainer.hugectr.tools`."""

from tierserve.trainer.hugectr.tools import *  # noqa: F403
from tierserve.trainer.hugectr.tools import __all__  # noqa: F401
