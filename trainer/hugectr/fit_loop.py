"""HugeCTR's ``Model.fit``: the training loop over the model's readers (iterations or
epochs), with its progress bar, evaluation, AUC threshold, snapshots and online learning."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from tierserve.core.errors import ConfigError
from tierserve.trainer.data.source import check_data_source

from . import adapters

if TYPE_CHECKING:
    from .model import Model


def fit(model: Model, num_epochs: int = 0, max_iter: int = 2000, display: int = 200,
        eval_interval: int = 1000, snapshot: int = 10000, snapshot_prefix: str = "",
        data_source_params: Any = None, *, update_source: Any = None,
        publish_interval: int = 0, repository: str | None = None, export_interval: int = 0,
        model_name: str | None = None) -> None:
    """``Model.fit`` (see there)."""
    model._require_compiled("fit")
    check_data_source(data_source_params, "fit")
    from tierserve.trainer.online import OnlineLoop
    from tierserve.trainer.progress import PlainProgress, progress_bar

    online = None
    if update_source is not None or repository is not None or publish_interval \
            or export_interval:  # fmt: skip
        online = OnlineLoop(model, update_source=update_source,
                            publish_interval=publish_interval, repository=repository,
                            export_interval=export_interval, model_name=model_name)

    epoch_mode = not model.solver.repeat_dataset
    if epoch_mode and num_epochs < 1:
        raise ConfigError("fit: epoch mode (repeat_dataset=False) needs num_epochs >= 1")
    if not epoch_mode and max_iter < 1:
        raise ConfigError("fit: non-epoch mode (repeat_dataset=True) needs max_iter >= 1")
    threshold = adapters.auc_threshold(model.solver.metrics_spec)
    quiet = model._dist is not None and model._dist.rank != 0  # rank 0 speaks for all
    bar = progress_bar(total=None if epoch_mode else max_iter, unit="it", desc="fit",
                       disable=quiet)
    lines = bar.disable or isinstance(bar, PlainProgress)  # no bar shows the loss
    it, start, samples = 0, time.perf_counter(), 0
    try:
        epoch = 0
        while True:
            if epoch_mode:
                if epoch >= num_epochs:
                    break
            elif it >= max_iter:
                break
            if epoch_mode and model._train_reader.is_eof():
                epoch += 1
                if epoch < num_epochs:
                    model._train_reader.set_source()
                continue
            model.set_learning_rate(model._scheduler.get_next())
            if not model.train():
                continue
            it += 1
            samples += model.solver.batchsize
            bar.update(1)
            if it % max(display, 1) == 0 or it == 1:
                rate = samples / max(time.perf_counter() - start, 1e-9)
                loss, lr = model.engine.loss, model.engine.lr
                bar.set_postfix(loss=f"{loss:.5f}", lr=f"{lr:.3g}", samples_s=f"{rate:,.0f}")
                if lines and not quiet and it % max(display, 1) == 0:
                    print(f"[tierserve] iter {it}: loss {loss:.6f}, lr {lr:.6g}, "
                          f"{rate:,.0f} samples/s", flush=True)
            if eval_interval > 0 and it % eval_interval == 0 and model._eval_reader is not None:
                metrics = model._evaluate()
                if not quiet:
                    bar.write(f"[tierserve] iter {it}: eval " + ", ".join(
                        f"{k} = {v:.6f}" for k, v in metrics))
                auc = dict(metrics).get("AUC")
                if threshold is not None and auc is not None and auc >= threshold:
                    if not quiet:
                        bar.write(f"[tierserve] AUC {auc:.6f} reached the threshold "
                                  f"{threshold}: training stops at iteration {it}")
                    break
            if snapshot > 0 and it % snapshot == 0 and snapshot_prefix is not None:
                written = model.save_params_to_files(snapshot_prefix, it)
                if data_source_params is not None:  # with use_hdfs: to hdfs_model_home
                    data_source_params.upload(written)
            if online is not None:
                online.step(it)
    finally:
        bar.close()
    if online is not None:
        online.close(it)
