"""``tf.compat``: ``v1`` (and ``v2``) are :mod:`tierserve.trainer.tf` itself, so
``from tierserve.trainer.tf.compat import v1 as tf`` stands for
``import tensorflow.compat.v1 as tf``; ``module_wrapper`` holds TensorFlow's
deprecation-warning limit, which code sets to silence warnings this module never prints."""

from __future__ import annotations

import types

from .. import tf as v1

v2 = v1
module_wrapper = types.SimpleNamespace(_PER_MODULE_WARNING_LIMIT=0)

__all__ = ["module_wrapper", "v1", "v2"]
