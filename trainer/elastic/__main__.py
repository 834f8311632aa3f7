"""``python -m tierserve.trainer.elastic --conf module.TrainConf``: DLRover's
``python -m dlrover.trainer`` (see :mod:`.entry`)."""

import sys

from .entry import main

sys.exit(main())
