"""The graph a ``model_fn`` builds (TensorFlow's core, as the Estimator API sees it): symbolic
tensors (:mod:`.tensors`), the functional layers (:mod:`.layers`, ``tf.layers``), losses
(:mod:`.losses`), tensor ops (:mod:`.ops`, which also gives tensors their arithmetic and
indexing operators) and dtypes (:mod:`.dtypes`).

It sits below the feature columns and the Estimator, which build on it, and imports neither.
"""

from . import ops  # noqa: F401 - installs Tensor's operators
