"""Runs the HugeCTR-style example scripts of tests/trainer/scripts in this process."""

from __future__ import annotations

import os
import runpy
import warnings
from pathlib import Path

import numpy as np

from tierserve.model.blas_threads import blas_threads
from tierserve.model.device import to_numpy

SCRIPTS = Path(__file__).resolve().parent / "scripts"


def run_script(name: str, monkeypatch, **settings) -> dict:
    """The globals of ``scripts/<name>.py`` after running it with ``settings`` as environment."""
    monkeypatch.setenv("TIERSERVE_NO_PROGRESS", "1")
    monkeypatch.setenv("TIERSERVE_FORCE_CPU", os.environ.get("TIERSERVE_FORCE_CPU", ""))
    for key, value in settings.items():
        monkeypatch.setenv(key, str(value))
    # One BLAS thread: these models' matrices are small, and on a few shared cores OpenBLAS's
    # busy-waiting threads slow them down several times.
    with warnings.catch_warnings(), blas_threads(1):
        warnings.simplefilter("ignore", UserWarning)
        return runpy.run_path(str(SCRIPTS / f"{name}.py"), run_name="__main__")


def eval_batch(model):
    """One batch of the model's evaluation source, read from its start."""
    reader = model.get_data_reader_eval()
    reader.set_source()
    return reader.next_batch()


def embeddings_for(model, batch) -> dict[str, np.ndarray]:
    """Each table's pooled embeddings of ``batch`` (inference mode)."""
    out = {}
    for spec, table in zip(model.embedding_specs, model.tables):
        sparse = batch.sparse[model.sparse_names.index(spec.sparse_input)]
        out[spec.name] = to_numpy(table.forward(sparse, spec.combiner, training=False))
    return out
