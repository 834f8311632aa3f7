"""``tierserve train --conf module.TrainConf``: DLRover's local entry.

The conf is a class (DLRover's ``TrainConf``) whose attributes say what to train:

- ``classifier_class``: an Estimator subclass (or ``"module.Class"``) built as
  ``classifier_class(model_dir, config, params)``, DLRover's call;
- ``model_dir`` (``--model-dir`` wins), ``params`` (dict, handed to the estimator);
- ``train_set`` and optionally ``eval_set``: ``{"reader", "columns", "epoch", "batch_size",
  "field_delim"}`` (:mod:`.input_fn`); the conf's ``epoch`` and ``batch_size`` are their
  defaults;
- checkpoints: ``save_steps`` (every N steps), ``keep_checkpoint_max``, ``log_steps``
  (RunConfig's ``log_step_count_steps``); ``max_steps`` ends training (else the data does);
- evaluation: ``eval_steps``, ``throttle_secs`` (default 10), ``start_delay_secs`` (5)
  (EvalSpec, DLRover's defaults); a last evaluation follows the last step;
- export: ``serving_input_receiver_fn`` adds a ``LatestExporter`` (``exports_to_keep``) to
  the EvalSpec, writing served model versions under ``model_dir/export/latest``;
  ``exporters`` gives the exporters instead.

DLRover's launch arguments: ``--platform local`` (its Kubernetes and Ray platforms are
refused by name), ``--worker_num N`` (N > 1: the command runs again under ``mpiexec -n N``,
the distributed Estimator's ranks, :mod:`tierserve.trainer.estimator.distributed`),
``--ps_num`` 0 or 1 (the workers hold the parameters; more is refused).

Training reports each step's batch to the train reader's shard client (DLRover's
``ElasticDataShardReportHook``), so a shard counts as done once trained on.
DeepRec's incremental checkpoints (``enable_incr_saved_model``,
``checkpoint_incremental_save_secs``) are refused by name.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from typing import Any

from tierserve.core.errors import ConfigError

from .input_fn import build_input_fn, check_data_set

log = logging.getLogger("tierserve.trainer.elastic")

_REFUSED = {
    "enable_incr_saved_model": "DeepRec's incremental SavedModel is not supported; remove it "
    "(checkpoints: save_steps and keep_checkpoint_max)",
    "checkpoint_incremental_save_secs": "DeepRec's incremental checkpoints are not supported; "
    "use save_steps",
}


def load_object(path: str, what: str = "--conf") -> Any:
    """The object ``module.attr`` names (the current directory is importable, as DLRover's
    entry runs from the example's folder)."""
    module_name, _, attr = path.rpartition(".")
    if not module_name or not attr:
        raise ConfigError(f"{what} must be module.Name (e.g. train_conf.TrainConf), got {path!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"{what} {path!r}: cannot import {module_name!r}: {exc}") from exc
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ConfigError(f"{what} {path!r}: module {module_name!r} has no {attr!r}") from None


class TrainJob:
    """What a conf describes, built: estimator, input_fns, specs (see the module doc)."""

    def __init__(self, conf: Any, model_dir: str | None = None) -> None:
        from tierserve.trainer import estimator as est

        for name, why in _REFUSED.items():
            if getattr(conf, name, None):
                raise ConfigError(f"conf {name}: {why}")
        self.conf = conf
        self.model_dir = model_dir or getattr(conf, "model_dir", None)
        if not self.model_dir:
            raise ConfigError("the conf has no model_dir (set it, or pass --model-dir)")
        classifier = getattr(conf, "classifier_class", None)
        if classifier is None:
            raise ConfigError("the conf has no classifier_class (the Estimator class to train)")
        if isinstance(classifier, str):
            classifier = load_object(classifier, "classifier_class")
        params = getattr(conf, "params", None) or {}
        if not isinstance(params, dict):
            raise ConfigError(f"conf params must be a dict, got {type(params).__name__}")
        batch_size = _positive(conf, "batch_size", 64)
        epoch = _positive(conf, "epoch", 1)

        train_set = check_data_set(getattr(conf, "train_set", None), "conf train_set")
        self.train_input_fn = build_input_fn(train_set, batch_size, epoch, what="conf train_set")
        self.eval_input_fn = None
        eval_set = getattr(conf, "eval_set", None)
        if eval_set is not None:
            check_data_set(eval_set, "conf eval_set")
            self.eval_input_fn = build_input_fn(
                eval_set, batch_size, 1, restart_each_call=True, what="conf eval_set"
            )

        config_kwargs: dict[str, Any] = {"model_dir": self.model_dir}
        if getattr(conf, "save_steps", None) is not None:
            config_kwargs["save_checkpoints_steps"] = _positive(conf, "save_steps", None)
        if getattr(conf, "keep_checkpoint_max", None) is not None:
            config_kwargs["keep_checkpoint_max"] = _positive(conf, "keep_checkpoint_max", None)
        if getattr(conf, "log_steps", None) is not None:
            config_kwargs["log_step_count_steps"] = _positive(conf, "log_steps", None)
        self.config = est.RunConfig(**config_kwargs)
        self.estimator = classifier(self.model_dir, self.config, params)

        self.hooks = [shard_report_hook(self.train_input_fn)]
        self.max_steps = getattr(conf, "max_steps", None)
        self.train_spec = est.TrainSpec(
            self.train_input_fn, max_steps=self.max_steps, hooks=self.hooks
        )
        self.eval_spec = None
        if self.eval_input_fn is not None:
            exporters = getattr(conf, "exporters", None)
            receiver = getattr(conf, "serving_input_receiver_fn", None)
            if exporters is None and receiver is not None:
                keep = getattr(conf, "exports_to_keep", 5)
                latest = getattr(est, "LatestExporter", None) or est.export.LatestExporter
                exporters = [latest("latest", receiver, exports_to_keep=keep)]
            self.eval_spec = est.EvalSpec(
                self.eval_input_fn,
                steps=getattr(conf, "eval_steps", None),
                exporters=exporters,
                start_delay_secs=getattr(conf, "start_delay_secs", 5),  # DLRover's values
                throttle_secs=getattr(conf, "throttle_secs", 10),
            )
        elif getattr(conf, "serving_input_receiver_fn", None) is not None:
            raise ConfigError(
                "conf serving_input_receiver_fn: exports are made after evaluations; add an "
                "eval_set"
            )

    def run(self) -> Any:
        """Train (and evaluate and export, with an eval_set); the last evaluation's metrics."""
        from tierserve.trainer import estimator as est

        if self.eval_spec is None:
            self.estimator.train(self.train_input_fn, max_steps=self.max_steps, hooks=self.hooks)
            return None
        return est.train_and_evaluate(self.estimator, self.train_spec, self.eval_spec)


def _positive(conf: Any, name: str, default: Any) -> Any:
    value = getattr(conf, name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"conf {name} must be a positive int, got {value!r}")
    return value


def shard_report_hook(input_fn: Any) -> Any:
    """A SessionRunHook reporting each trained batch to the reader's shard client."""
    from tierserve.trainer import estimator as est

    reader, batch_size = input_fn.reader, input_fn.batch_size

    class ShardReportHook(est.SessionRunHook):
        """DLRover's ElasticDataShardReportHook: shards are done once trained on."""

        def begin(self) -> None:
            client = getattr(reader, "data_shard_client", None)
            if client is not None:  # shards are done when trained on, not when read
                client.report_on_fetch = False

        def after_run(self, run_context: Any, run_values: Any) -> None:
            client = getattr(reader, "data_shard_client", None)
            if client is not None:
                client.report_batch_done(batch_size)

    return ShardReportHook()


def run(conf_path: str, model_dir: str | None = None) -> Any:
    """Build and run the job ``conf_path`` (``module.TrainConf``) describes."""
    conf = load_object(conf_path)
    return TrainJob(conf, model_dir).run()


def register(commands: argparse._SubParsersAction) -> None:
    """Attach ``tierserve train`` to the CLI."""
    p = commands.add_parser(
        "train",
        help="train an Estimator from a DLRover-style conf (module.TrainConf)",
        description=__doc__.split("\n\n")[0],
    )
    _arguments(p)


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--conf", required=True, help="the conf class, as module.TrainConf")
    p.add_argument("--model-dir", "--model_dir", default=None,
                   help="checkpoint folder (default: the conf's)")
    p.add_argument(
        "--platform",
        default="local",
        help="where to run: 'local' (DLRover's Kubernetes and Ray platforms are not here)",
    )
    p.add_argument("--worker_num", "--worker-num", type=int, default=None,
                   help="training processes: 1 runs here; N > 1 runs this command under "
                   "'mpiexec -n N' (the mpi extra), each rank training its share of every "
                   "batch")
    p.add_argument("--ps_num", "--ps-num", type=int, default=None,
                   help="parameter servers: 0 or 1 (the workers hold the parameters: embedding "
                   "tables split over the --worker_num ranks, dense weights on each)")
    p.set_defaults(run=_cli_run)


_PLATFORMS = ("kubernetes", "local_kubernetes", "ray", "pyray", "k8s")


def check_launch(platform: str, worker_num: int | None, ps_num: int | None) -> int | None:
    """DLRover's ``--platform`` / ``--worker_num`` / ``--ps_num`` mapped to this launcher:
    the number of ranks to start under mpiexec (None: run in this process)."""
    from ..distributed.comm import launched_size

    kind = str(platform).lower()
    if kind != "local":
        known = "DLRover's" if kind in _PLATFORMS else "an unknown"
        raise ConfigError(f"--platform {platform!r}: {known} platform is not supported here "
                          "(DLRover's master starts its pods or actors); use --platform local, "
                          "with --worker_num N for N training processes under mpiexec")
    if ps_num is not None and not 0 <= ps_num <= 1:
        raise ConfigError(f"--ps_num {ps_num}: tierserve trains without separate parameter-"
                          "server processes; the workers hold the parameters (embedding tables "
                          "split over the --worker_num ranks). Use --ps_num 1 (or 0) and "
                          "--worker_num N")
    size = launched_size()
    if worker_num is None:
        return None
    if worker_num < 1:
        raise ConfigError(f"--worker_num must be at least 1, got {worker_num}")
    if size > 1:
        if size != worker_num:
            raise ConfigError(f"--worker_num {worker_num}: this job was started with {size} "
                              "MPI ranks")
        return None
    return worker_num if worker_num > 1 else None


def _relaunch(ranks: int, argv: list[str]) -> int:
    """This command again under ``mpiexec -n ranks``; its exit status."""
    import shutil
    import subprocess

    beside = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    mpiexec = beside if os.path.exists(beside) else shutil.which("mpiexec")
    if mpiexec is None:
        raise ConfigError(f"--worker_num {ranks} starts {ranks} processes with mpiexec, which "
                          "is not installed: pip install 'tierserve[mpi]'")
    cmd = [mpiexec, "-n", str(ranks), sys.executable, "-m", "tierserve.trainer.elastic.entry",
           *argv]
    print(f"train: starting {ranks} workers: {' '.join(cmd)}", file=sys.stderr, flush=True)
    return subprocess.call(cmd)


def _cli_run(args: argparse.Namespace) -> int:
    ranks = check_launch(args.platform, args.worker_num, args.ps_num)
    if ranks is not None:
        load_object(args.conf)  # a conf that does not import fails here, once
        argv = ["--conf", args.conf, "--worker_num", str(ranks)]
        if args.model_dir:
            argv += ["--model-dir", args.model_dir]
        return _relaunch(ranks, argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    result = run(args.conf, args.model_dir)
    if result is not None:
        print(result)
    return 0


def main(argv: list[str] | None = None, prog: str = "python -m tierserve.trainer.elastic"
         ) -> int:
    """``python -m tierserve.trainer.elastic --conf module.TrainConf`` (DLRover's
    ``python -m dlrover.trainer --conf ...`` form, with its ``--platform``, ``--worker_num``
    and ``--ps_num``); exit status 2 on a bad conf."""
    from tierserve.core.errors import TierserveError

    parser = argparse.ArgumentParser(prog=prog)
    _arguments(parser)
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except TierserveError as exc:
        print(f"train: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
