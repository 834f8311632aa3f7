"""tierserve's runtime as a Triton Python-backend model (``tierserve triton-repo`` makes them).

Each version folder of a generated Triton repository holds a thin ``model.py`` that puts
tierserve on ``sys.path`` and hands every call to :class:`TritonPythonModel` here.  It serves
the version the way ``tierserve serve`` does:
:class:`~tierserve.server.runtime.loader.RepositoryLoader`
stages the version found in Triton's version folder with the tiers of the ``ps.json`` named
by the ``ps_config`` parameter, the version is committed, and Kafka updates from that
``ps.json``'s ``update_source`` are applied by the loader's consumers until Triton unloads it.

config.pbtxt parameters:

- ``ps_config``: the repository's ``ps.json`` (tiers, update source, the model's entry);
- ``site_packages`` (optional): a site-packages folder holding tierserve, read by ``model.py``.

Triton runs every model version in a process of its own, so tiers in process memory
(``hash_map``) are per version, and a version's Kafka consumers (unique replica id) see every
update.  Nothing of the HTTP or gRPC front ends is imported.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tierserve.core.errors import ConfigError, TierserveError
from tierserve.ps.config import load_ps_config

from .errors import http_status
from .runtime.loader import RepositoryLoader
from .runtime.servables import Servable

log = logging.getLogger("tierserve.server.triton_model")

PS_CONFIG_PARAMETER = "ps_config"
SITE_PACKAGES_PARAMETER = "site_packages"


def model_parameters(model_config: dict) -> dict[str, str]:
    """The ``parameters`` of a Triton model config (as Triton passes it: JSON) as strings."""
    return {
        key: str(value.get("string_value", ""))
        for key, value in (model_config.get("parameters") or {}).items()
    }


@dataclass
class RequestError:
    """Why one request failed: tierserve's message and the HTTP status it maps to."""

    message: str
    http_status: int = 400


def _error(exc: BaseException) -> RequestError:
    if isinstance(exc, TierserveError):
        return RequestError(str(exc), http_status(exc))
    log.exception("inference failed")
    return RequestError("internal error", 500)


class TritonRuntime:
    """One committed model version and what it runs on; no Triton types involved.

    ``folder`` is the version folder (``None``: the files ``ps.json`` names).
    ``use_gpu_embedding_cache`` overrides ps.json's ``gpucache`` (``None``: as it says).
    """

    def __init__(
        self,
        name: str,
        version: str,
        folder: Path | None,
        ps_config_path: str | Path,
        use_gpu_embedding_cache: bool | None = None,
    ) -> None:
        self.loader = RepositoryLoader(use_gpu_embedding_cache=use_gpu_embedding_cache)
        try:
            servable = self.loader(name, version, folder, load_ps_config(ps_config_path))
            try:
                servable.commit()
            except BaseException:
                servable.discard()  # staged, never served: its tables go
                servable.close()
                raise
        except BaseException:
            self.loader.close()
            raise
        self.servable: Servable = servable
        self.input_names = [spec.name for spec in servable.inputs]

    def rows(self, inputs: dict[str, np.ndarray]) -> int | None:
        """The rows a request's outputs must have (None: the model has no batch dimension)."""
        if self.servable.max_batch_size <= 0 or not inputs:
            return None
        first = inputs.get(self.input_names[0])
        return None if first is None or first.ndim == 0 else int(first.shape[0])

    def infer(
        self, requests: Sequence[dict[str, np.ndarray]]
    ) -> list[dict[str, np.ndarray] | RequestError]:
        """Answer each request (its input arrays by name): outputs, or why it failed alone.

        Requests that pass the checks run merged (up to the model's ``max_batch_size`` rows
        per execution) when the model has a batch dimension.
        """
        servable = self.servable
        results: list[Any] = [None] * len(requests)
        units, owners = [], []
        for i, inputs in enumerate(requests):
            try:
                servable.check(inputs)
                units.append(servable.prepare(inputs))
                owners.append(i)
            except Exception as exc:  # noqa: BLE001 - one bad request fails alone
                results[i] = _error(exc)
        for group in self._groups(units):
            try:
                outputs = self._execute([units[g] for g in group])
            except Exception as exc:  # noqa: BLE001 - reported to every request of the group
                failure = _error(exc)
                for g in group:
                    results[owners[g]] = failure
                continue
            for g, out in zip(group, outputs):
                results[owners[g]] = out
        return results

    def _groups(self, units: list) -> list[list[int]]:
        """Indices of ``units`` run together: consecutive units up to max_batch_size rows."""
        limit = self.servable.max_batch_size
        if limit <= 0:
            return [[i] for i in range(len(units))]
        groups: list[list[int]] = []
        rows = 0
        for i, unit in enumerate(units):
            size = int(unit.batch_size)
            if groups and rows + size <= limit:
                groups[-1].append(i)
                rows += size
            else:
                groups.append([i])
                rows = size
        return groups

    def _execute(self, units: list) -> list[dict[str, np.ndarray]]:
        servable = self.servable
        if len(units) == 1:
            return [servable.execute(units[0])]
        outputs = servable.execute(servable.merge(units))
        cuts = np.cumsum([u.batch_size for u in units])[:-1]
        parts = {name: np.split(array, cuts) for name, array in outputs.items()}
        return [{name: p[i] for name, p in parts.items()} for i in range(len(units))]

    def close(self) -> None:
        """Close the version and its tiers and consumers.

        Its tables are not discarded: tiers in this process go with it, and tables in shared
        (Redis) or persistent tiers stay for other replicas and the next start, as at
        ``tierserve serve``'s shutdown (Triton does not say unload from shutdown).
        """
        try:
            self.servable.close()
        finally:
            self.loader.close()


class OutputError(TierserveError):
    """An output whose bytes would not fill its declared shape: answered as an error, never
    handed to Triton."""


def output_tensor(pb_utils, name: str, array: np.ndarray, rows: int | None):
    """``pb_utils.Tensor`` of output ``name``: C-contiguous float32 (OUTPUT0 is FP32) with
    ``rows`` rows when the request has a batch dimension; anything else is an
    :class:`OutputError` (a 500 for that request)."""
    array = np.asarray(array)
    if array.dtype != np.float32:
        raise OutputError(f"output {name!r} is {array.dtype}, not the FP32 config.pbtxt declares")
    if rows is not None and (array.ndim < 1 or array.shape[0] != rows):
        raise OutputError(
            f"output {name!r} has shape {list(array.shape)} for a request of {rows} rows"
        )
    return pb_utils.Tensor(name, np.ascontiguousarray(array))


def stub_reads_this_numpy(pb_utils) -> bool:
    """Whether the stub's tensors read and write arrays of the numpy imported here.

    The stubs of Triton 24.10 (2.51) and older are built with pybind11 2.10, which reads
    numpy's dtype descriptors with numpy 1's struct layout.  Where the numpy the stub
    imports is numpy 2 (its ``sys.path`` starts with tritonserver's working directory and
    the system's site-packages, ahead of the backend's folder), an element size reads as 0:
    ``pb_utils.Tensor(name, array)`` then hands Triton an output of 0 bytes (binary: 200
    with ``binary_data_size`` 0; JSON: 500 "output tensor shape does not match size of
    output") and ``as_numpy()`` of an input reads zeros.  The probe: a tensor rebuilt by the
    stub from its own DLPack capsule (the path its inputs take) must read back as written.
    """
    probe = np.arange(1, 7, dtype=np.float32).reshape(2, 3)
    written = pb_utils.Tensor("probe", probe)
    try:
        read = pb_utils.Tensor.from_dlpack("probe", written.to_dlpack()).as_numpy()
    except Exception:  # noqa: BLE001 - a stub that cannot rebuild it cannot be trusted either
        return False
    return read is not None and read.shape == probe.shape and np.array_equal(read, probe)


def numpy_mismatch_reason() -> str:
    import sys

    where = Path(np.__file__).parent.parent
    venv = ""
    if sys.prefix != sys.base_prefix:  # the stub's Python took a virtual environment's prefix
        venv = (f" The stub's Python runs in the virtual environment {sys.prefix}: its embedded "
                "interpreter finds its prefix through the python3 on tritonserver's PATH, so "
                "tritonserver was started with that environment activated. Start it without "
                "(deactivate), or with `tierserve triton-install`'s bin/tritonserver, which "
                "leaves virtual environments off PATH.")  # fmt: skip
    return (
        f"the Python backend's stub misreads the arrays of numpy {np.__version__} (from "
        f"{where}), which it imported instead of the numpy it was built for (numpy 1 for "
        f"Triton 24.10 and older: pybind11 2.10); its outputs would carry no data.{venv} "
        "Otherwise: the stub's sys.path starts with tritonserver's working directory and the "
        f"system's site-packages; remove numpy {np.__version__} from {where}, so that the "
        "numpy<2 beside the backend's stub is imported"
    )


def _configure_logging() -> None:
    root = logging.getLogger()
    if not root.handlers:  # the stub's stderr goes to tritonserver's log
        logging.basicConfig(
            level=logging.INFO, format="tierserve %(levelname)s %(name)s: %(message)s"
        )


def _select_device(kind: str, device_id: str) -> bool | None:
    """``use_gpu_embedding_cache`` for an instance of ``kind``: a KIND_CPU instance keeps its
    embedding cache in host memory (False); a KIND_GPU one makes its GPU current and follows
    ps.json's ``gpucache`` (None)."""
    if kind != "GPU":
        return False
    try:
        import cupy
    except ImportError:
        raise ConfigError(
            "instance_group kind KIND_GPU needs cupy in Triton's Python (pip install "
            "'tierserve[gpu]'), or generate the repository with --kind cpu"
        ) from None
    cupy.cuda.Device(int(device_id)).use()
    return None


class TritonPythonModel:
    """The Python-backend model: ``initialize``, ``execute``, ``finalize`` (Triton's contract)."""

    def initialize(self, args: dict[str, str]) -> None:
        """Stage and commit the version in Triton's version folder; raise with tierserve's
        reason when it cannot serve (Triton then reports the version not ready)."""
        global pb_utils
        import triton_python_backend_utils as pb_utils  # only inside Triton's stub

        _configure_logging()
        config = json.loads(args["model_config"])
        parameters = model_parameters(config)
        name, version = args["model_name"], str(args["model_version"])
        ps_config = parameters.get(PS_CONFIG_PARAMETER)
        if not ps_config:
            raise pb_utils.TritonModelException(
                f"tierserve: model {name!r}: config.pbtxt has no '{PS_CONFIG_PARAMETER}' "
                "parameter naming its ps.json"
            )
        folder = Path(args["model_repository"]) / version
        kind = args.get("model_instance_kind", "CPU")
        if not stub_reads_this_numpy(pb_utils):
            reason = numpy_mismatch_reason()
            log.error("model %s version %s failed to load: %s", name, version, reason)
            raise pb_utils.TritonModelException(
                f"tierserve: model {name!r} version {version} failed to load: {reason}"
            )
        try:
            use_gpu = _select_device(kind, args.get("model_instance_device_id", "0"))
            self.runtime = TritonRuntime(name, version, folder, ps_config, use_gpu)
        except Exception as exc:
            reason = str(exc) if isinstance(exc, TierserveError) else f"{type(exc).__name__}: {exc}"
            log.error("model %s version %s failed to load: %s", name, version, reason)
            raise pb_utils.TritonModelException(
                f"tierserve: model {name!r} version {version} failed to load: {reason}"
            ) from None
        log.info(
            "model %s version %s is serving (%s instance; numpy %s from %s)", name, version,
            kind, np.__version__, Path(np.__file__).parent.parent,
        )  # fmt: skip
        self._codes = {
            400: pb_utils.TritonError.INVALID_ARG,
            404: pb_utils.TritonError.NOT_FOUND,
            503: pb_utils.TritonError.UNAVAILABLE,
        }

    def execute(self, requests: list) -> list:
        """One response per request, in order; a failing request gets its own error, and so
        does one whose output would not fill its shape (:func:`output_tensor`)."""
        names = self.runtime.input_names
        arrays = []
        for request in requests:
            inputs = {}
            for name in names:
                tensor = pb_utils.get_input_tensor_by_name(request, name)
                if tensor is not None:
                    inputs[name] = tensor.as_numpy()
            arrays.append(inputs)
        responses = []
        for inputs, result in zip(arrays, self.runtime.infer(arrays)):
            if not isinstance(result, RequestError):
                try:
                    tensors = [output_tensor(pb_utils, n, a, self.runtime.rows(inputs))
                               for n, a in result.items()]  # fmt: skip
                except OutputError as exc:
                    log.error("%s", exc)
                    result = RequestError(str(exc), 500)
            if isinstance(result, RequestError):
                code = self._codes.get(result.http_status, pb_utils.TritonError.INTERNAL)
                responses.append(
                    pb_utils.InferenceResponse(error=pb_utils.TritonError(result.message, code))
                )
            else:
                responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
        return responses

    def finalize(self) -> None:
        """Close the version, its tiers and its Kafka consumers."""
        runtime = getattr(self, "runtime", None)
        if runtime is not None:
            runtime.close()
