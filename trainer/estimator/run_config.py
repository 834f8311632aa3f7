"""``RunConfig``: where and how often an Estimator writes checkpoints and summaries."""

from __future__ import annotations

import os
from typing import Any

from tierserve.core.errors import ConfigError

_UNSET: Any = object()


class RunConfig:
    """``tf.estimator.RunConfig``'s settings that mean something in one process.

    Checkpoints every ``save_checkpoints_steps`` steps or ``save_checkpoints_secs`` seconds
    (not both; neither: every 600 s), and at the end of each ``train``; the newest
    ``keep_checkpoint_max`` are kept (None or 0: all).  TensorBoard summaries every
    ``save_summary_steps`` steps (None or 0: none); the loss is logged every
    ``log_step_count_steps`` steps.  ``tf_random_seed`` seeds initial weights, embedding
    rows and dropout.  Distribution settings (``train_distribute``, ``session_config``,
    ``device_fn``, ...) are refused: training runs in this process, or on the ranks of
    ``mpiexec -n N`` (:mod:`tierserve.trainer.estimator.distributed`), whose place the
    cluster properties report (``is_chief``, ``task_type``, ``task_id``,
    ``global_id_in_cluster``, ``num_worker_replicas``).
    """

    def __init__(self, model_dir: str | os.PathLike | None = None,
                 tf_random_seed: int | None = None, save_summary_steps: int | None = 100,
                 save_checkpoints_steps: Any = _UNSET, save_checkpoints_secs: Any = _UNSET,
                 session_config: Any = None, keep_checkpoint_max: int | None = 5,
                 keep_checkpoint_every_n_hours: Any = None, log_step_count_steps: int = 100,
                 train_distribute: Any = None, device_fn: Any = None, protocol: Any = None,
                 eval_distribute: Any = None, experimental_distribute: Any = None,
                 experimental_max_worker_delay_secs: Any = None,
                 session_creation_timeout_secs: int = 7200,
                 checkpoint_save_graph_def: bool = True) -> None:
        refused = {"session_config": session_config, "train_distribute": train_distribute,
                   "device_fn": device_fn, "protocol": protocol,
                   "eval_distribute": eval_distribute,
                   "experimental_distribute": experimental_distribute,
                   "keep_checkpoint_every_n_hours": keep_checkpoint_every_n_hours,
                   "experimental_max_worker_delay_secs": experimental_max_worker_delay_secs}
        if session_creation_timeout_secs != 7200 or not checkpoint_save_graph_def:
            raise ConfigError("RunConfig: session_creation_timeout_secs and "
                              "checkpoint_save_graph_def are TensorFlow session settings; "
                              "there is no session or graph def here")
        for name, value in refused.items():
            if value is not None:
                raise ConfigError(f"RunConfig({name}=...) is not supported: the Estimator "
                                  "trains in this process, on its own runtime (several "
                                  "processes: mpiexec -n N)")
        steps_set = save_checkpoints_steps is not _UNSET and save_checkpoints_steps is not None
        secs_set = save_checkpoints_secs is not _UNSET and save_checkpoints_secs is not None
        if steps_set and secs_set:
            raise ConfigError("RunConfig: give save_checkpoints_steps or save_checkpoints_secs, "
                              "not both")
        if not steps_set and not secs_set and save_checkpoints_secs is _UNSET \
                and save_checkpoints_steps is _UNSET:
            save_checkpoints_secs = 600
        self.model_dir = None if model_dir is None else os.fspath(model_dir)
        self.tf_random_seed = tf_random_seed
        self.save_summary_steps = save_summary_steps or 0
        self.save_checkpoints_steps = int(save_checkpoints_steps) if steps_set else None
        self.save_checkpoints_secs = (float(save_checkpoints_secs) if secs_set or (
            save_checkpoints_secs not in (_UNSET, None)) else None)
        for name in ("save_checkpoints_steps", "save_checkpoints_secs"):
            v = getattr(self, name)
            if v is not None and v <= 0:
                raise ConfigError(f"RunConfig: {name} must be positive, got {v}")
        self.keep_checkpoint_max = keep_checkpoint_max or 0
        self.log_step_count_steps = log_step_count_steps or 0
        self.session_creation_timeout_secs = session_creation_timeout_secs
        self.checkpoint_save_graph_def = checkpoint_save_graph_def
        # the cluster properties Estimator code reads: this rank's under mpiexec (rank 0 the
        # chief), else one process's
        from ..distributed.cluster import cluster_properties

        cluster = cluster_properties()
        self.is_chief = cluster["is_chief"]
        self.num_worker_replicas = cluster["num_worker_replicas"]
        self.num_ps_replicas = 0
        self.task_type = cluster["task_type"]
        self.task_id = cluster["task_id"]
        self.cluster_spec = cluster["cluster_spec"]
        self.master = ""
        self.evaluation_master = ""
        self.global_id_in_cluster = cluster["global_id_in_cluster"]

    def replace(self, **kwargs: Any) -> RunConfig:
        """A copy with some settings changed."""
        values = {k: getattr(self, k) for k in (
            "model_dir", "tf_random_seed", "save_summary_steps", "keep_checkpoint_max",
            "log_step_count_steps")}
        if self.save_checkpoints_steps is not None:
            values["save_checkpoints_steps"] = self.save_checkpoints_steps
        else:
            values["save_checkpoints_secs"] = self.save_checkpoints_secs
        if "save_checkpoints_steps" in kwargs:
            values.pop("save_checkpoints_secs", None)
        if "save_checkpoints_secs" in kwargs:
            values.pop("save_checkpoints_steps", None)
        values.update(kwargs)
        return RunConfig(**values)

    def __repr__(self) -> str:
        return (f"RunConfig(model_dir={self.model_dir!r}, save_checkpoints_steps="
                f"{self.save_checkpoints_steps}, save_checkpoints_secs="
                f"{self.save_checkpoints_secs}, keep_checkpoint_max={self.keep_checkpoint_max})")
