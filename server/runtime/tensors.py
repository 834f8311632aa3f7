"""Tensors of the KServe v2 protocol: datatypes, specs, validation and the REST codec.

A request's tensors become numpy arrays here, whatever transport carried them: JSON ``data``
lists, or Triton's binary tensor extension (a JSON header of ``Inference-Header-Content-Length``
bytes followed by the raw little-endian tensors, each input naming its
``parameters.binary_data_size``).  Every error is an
:class:`~tierserve.core.errors.InvalidInputError` that names the tensor and what was expected.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from tierserve.core.errors import InvalidInputError

#: KServe v2 datatype name -> numpy dtype (little-endian, as the binary extension sends it).
DATATYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype("?"),
    "UINT8": np.dtype("<u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("<i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
}

_BY_KIND = {(dt.kind, dt.itemsize): name for name, dt in DATATYPES.items()}


def datatype_of(array: np.ndarray) -> str:
    """The KServe v2 datatype name of ``array``'s dtype."""
    try:
        return _BY_KIND[(array.dtype.kind, array.dtype.itemsize)]
    except KeyError:
        raise InvalidInputError(f"dtype {array.dtype} has no KServe v2 datatype") from None


def shape_text(shape: Sequence[int]) -> str:
    """``[-1, 13]`` as a message shows it."""
    return "[" + ", ".join(str(int(d)) for d in shape) + "]"


@dataclass(frozen=True)
class TensorSpec:
    """An input or output a model declares: name, datatype and shape (-1 = any size).

    For a model that batches (``max_batch_size > 0``) the first dimension is the batch.
    ``alternatives`` lists other accepted shapes (as for CSR inputs); ``optional`` inputs may
    be left out.
    """

    name: str
    datatype: str
    shape: tuple[int, ...]
    optional: bool = False
    alternatives: tuple[tuple[int, ...], ...] = field(default_factory=tuple)
    #: Other datatypes a request may send (the servable converts them, checking their range).
    also_datatypes: tuple[str, ...] = ()

    def metadata(self) -> dict[str, Any]:
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}

    def accepts_shape(self, shape: Sequence[int]) -> bool:
        return any(_fits(shape, s) for s in (self.shape, *self.alternatives))

    def expected_shapes(self) -> str:
        return " or ".join(shape_text(s) for s in (self.shape, *self.alternatives))

    def accepts_datatype(self, datatype: str) -> bool:
        return datatype == self.datatype or datatype in self.also_datatypes

    def expected_datatypes(self) -> str:
        return " or ".join((self.datatype, *self.also_datatypes))


def _fits(shape: Sequence[int], pattern: Sequence[int]) -> bool:
    return len(shape) == len(pattern) and all(p < 0 or p == s for s, p in zip(shape, pattern))


def check_inputs(
    specs: Sequence[TensorSpec],
    inputs: dict[str, np.ndarray],
    declared: dict[str, str] | None = None,
) -> None:
    """Check that ``inputs`` match ``specs``: names, datatypes and shapes.

    ``declared`` maps input names to the datatype the request declared (which may differ from
    the array's when JSON numbers were parsed); it defaults to the arrays' own datatypes.
    """
    declared = declared or {}
    signature = tuple(
        (name, declared.get(name) or array.dtype.str, array.shape) for name, array in inputs.items()
    )
    seen = _checked.get(id(specs))
    if seen is not None and seen[0] is specs and signature in seen[1]:
        return  # these names, datatypes and shapes passed against these specs before
    _check_inputs(specs, inputs, declared)
    if seen is None or seen[0] is not specs:
        if len(_checked) >= 64:
            _checked.clear()
        seen = _checked[id(specs)] = (specs, set())
    if len(seen[1]) < 1024:
        seen[1].add(signature)


#: id(specs) -> (specs, signatures of inputs that passed :func:`check_inputs` against them);
#: the specs are held, so their id is not reused while they are here.
_checked: dict[int, tuple[Sequence[TensorSpec], set]] = {}


def _check_inputs(
    specs: Sequence[TensorSpec], inputs: dict[str, np.ndarray], declared: dict[str, str]
) -> None:
    known = {s.name: s for s in specs}
    for name in inputs:
        if name not in known:
            raise InvalidInputError(
                f"unexpected input {name!r}; the model's inputs are {sorted(known)}"
            )
    for spec in specs:
        if spec.name not in inputs:
            if spec.optional:
                continue
            raise InvalidInputError(
                f"input {spec.name!r} is missing: expected {spec.datatype} "
                f"with shape {spec.expected_shapes()}"
            )
        array = inputs[spec.name]
        datatype = declared.get(spec.name) or datatype_of(array)
        if not spec.accepts_datatype(datatype):
            raise InvalidInputError(
                f"input {spec.name!r} has datatype {datatype}; expected "
                f"{spec.expected_datatypes()} with shape {spec.expected_shapes()}"
            )
        if not spec.accepts_shape(array.shape):
            raise InvalidInputError(
                f"input {spec.name!r} has shape {shape_text(array.shape)}; expected "
                f"{spec.expected_datatypes()} with shape {spec.expected_shapes()}"
            )


def check_finite(inputs: dict[str, np.ndarray]) -> None:
    """Refuse NaN and infinite values in floating-point inputs (an out-of-range JSON number
    becomes infinite when it is read as FP32)."""
    for name, array in inputs.items():
        if array.dtype.kind == "f" and array.size and not np.isfinite(array).all():
            bad = int(np.count_nonzero(~np.isfinite(array)))
            raise InvalidInputError(
                f"input {name!r} holds {bad} NaN or infinite value(s) (or numbers out of range "
                f"for {datatype_of(array)}); the server refuses them unless started with "
                "--allow-nonfinite-inputs"
            )


def check_int_range(name: str, array: np.ndarray, dtype: np.dtype, why: str = "") -> None:
    """Refuse integers of ``array`` that ``dtype`` cannot hold, naming the input."""
    if array.size == 0 or np.can_cast(array.dtype, dtype, casting="safe"):
        return
    info = np.iinfo(dtype)
    low, high = array.min(), array.max()
    if (low < 0 and int(low) < info.min) or int(high) > info.max:
        raise InvalidInputError(
            f"input {name!r} holds values outside {_BY_KIND[(dtype.kind, dtype.itemsize)]} "
            f"[{info.min}, {info.max}]{why}"
        )


#: Dimensions a tensor may have (numpy's own limit is 64).
MAX_DIMS = 32


def element_count(name: str, shape: Any) -> tuple[tuple[int, ...], int]:
    """``shape`` as a tuple and its element count; refuses anything but a list of at most
    :data:`MAX_DIMS` non-negative integers."""
    if isinstance(shape, (list, tuple)) and len(shape) <= MAX_DIMS:
        dims = tuple(shape)
        if all(type(d) is int and d >= 0 for d in dims):
            return dims, math.prod(dims)
    text = repr(shape)
    raise InvalidInputError(
        f"input {name!r}: 'shape' must be a list of at most {MAX_DIMS} non-negative integers, "
        f"got {text if len(text) <= 80 else text[:77] + '...'}"
    )


def array_from_bytes(name: str, datatype: str, shape: Any, raw: bytes | memoryview) -> np.ndarray:
    """The array of ``shape`` and ``datatype`` held in ``raw`` (little-endian, row-major)."""
    dtype = _dtype(name, datatype)
    dims, count = element_count(name, shape)
    if len(raw) != count * dtype.itemsize:
        raise InvalidInputError(
            f"input {name!r}: {len(raw)} bytes of {datatype} data do not fill shape "
            f"{shape_text(dims)} ({count * dtype.itemsize} bytes)"
        )
    return np.frombuffer(raw, dtype=dtype).reshape(dims)


def array_from_list(name: str, datatype: str, shape: Any, data: Any) -> np.ndarray:
    """The array of ``shape`` and ``datatype`` from a JSON ``data`` list (flat or nested)."""
    _dtype(name, datatype)
    dims, count = element_count(name, shape)
    if not isinstance(data, list):
        raise InvalidInputError(f"input {name!r}: 'data' must be a JSON list")
    array = array_from_json(name, datatype, data)
    if array.size != count:
        raise InvalidInputError(
            f"input {name!r}: 'data' holds {array.size} values; shape {shape_text(dims)} "
            f"needs {count}"
        )
    return array.reshape(dims)


def array_from_json(name: str, datatype: str, value: Any) -> np.ndarray:
    """A JSON value (nested lists of numbers, or one number) as an array of ``datatype``;
    integers that do not fit the datatype are refused, never wrapped."""
    dtype = _dtype(name, datatype)
    try:
        array = np.asarray(value)
    except (ValueError, TypeError, RecursionError):
        raise InvalidInputError(f"input {name!r}: 'data' is a ragged or mixed list") from None
    if array.size and not _json_kind_fits(array.dtype, dtype):
        if dtype.kind in "iu" and array.dtype.kind in "fO":
            # numpy reads a list mixing small and huge integers as float64 (or objects)
            info = np.iinfo(dtype)
            raise InvalidInputError(
                f"input {name!r}: 'data' holds numbers that are not {datatype} integers "
                f"(fractions, or integers outside [{info.min}, {info.max}])"
            )
        raise InvalidInputError(
            f"input {name!r}: 'data' holds {array.dtype.name} values, not {datatype}"
        )
    if array.dtype.kind in "iu" and dtype.kind in "iu":
        check_int_range(name, array, dtype)
    try:
        with np.errstate(over="ignore", invalid="ignore"):  # check_finite reports them
            return array.astype(dtype, casting="unsafe")
    except (ValueError, TypeError, OverflowError):
        raise InvalidInputError(f"input {name!r}: 'data' cannot be read as {datatype}") from None


def _json_kind_fits(got: np.dtype, want: np.dtype) -> bool:
    if want.kind == "b":
        return got.kind == "b"
    if want.kind in "iu":
        return got.kind in "iu"
    if want.kind == "f":
        return got.kind in "iuf"
    return False


def _dtype(name: str, datatype: Any) -> np.dtype:
    if not isinstance(datatype, str) or datatype not in DATATYPES:
        text = repr(datatype)
        raise InvalidInputError(
            f"input {name!r}: datatype {text if len(text) <= 40 else text[:37] + '...'} is not "
            f"supported; use one of {sorted(DATATYPES)}"
        )
    return DATATYPES[datatype]


# --- REST: JSON and the binary tensor extension --------------------------------------------


@dataclass
class RequestedOutput:
    """An output a request asked for, and whether it wants it as binary data."""

    name: str
    binary: bool | None = None


@dataclass
class DecodedRequest:
    """A transport-neutral infer request: arrays by input name, plus what to send back."""

    inputs: dict[str, np.ndarray]
    declared: dict[str, str]
    outputs: list[RequestedOutput] | None
    id: str = ""
    parameters: dict[str, Any] = field(default_factory=dict)
    binary_output: bool = False


def _json_text(data) -> str | bytes:
    """UTF-8 JSON as str (json.loads then skips its encoding detection); anything else as
    bytes, for json to detect UTF-16/32."""
    try:
        text = str(data, "utf-8")
    except UnicodeDecodeError:
        return bytes(data)
    return text[1:] if text.startswith("\ufeff") else text


def parse_json(body: bytes | memoryview) -> Any:
    """``body`` parsed as JSON; anything that is not (bad UTF-8, nesting too deep, integers
    of more digits than Python reads) is an :class:`InvalidInputError`.

    orjson reads what RFC 8259 allows (integers beyond 64 bits as floats); the rest (NaN and
    Infinity literals, a byte-order mark, UTF-16/32, lone surrogates, numbers beyond FP64)
    is read as :mod:`json` reads it, whose message names what is wrong."""
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        pass
    return parse_json_exact(body)


def parse_json_exact(body: bytes | memoryview) -> Any:
    """:func:`parse_json` by :mod:`json` alone: integers of any size read exactly (orjson
    reads those beyond 64 bits as floats); slower."""
    try:
        return json.loads(_json_text(body))
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError is a ValueError
        raise InvalidInputError(f"the request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise InvalidInputError("the request body is not valid JSON: nested too deep") from None


def dump_json(value: Any) -> bytes:
    """``value`` as compact UTF-8 JSON (orjson; :mod:`json` for what orjson cannot encode:
    lone surrogates, integers beyond 64 bits).  NaN is never written: callers put ``null``."""
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError:
        return json.dumps(value, separators=(",", ":"), allow_nan=False).encode()


#: Most distinct JSON headers of binary requests whose decoding is remembered, and the
#: longest one remembered (a client sends the same header for every request of one shape).
HEADER_PLANS, HEADER_PLAN_BYTES = 256, 4096


@dataclass(frozen=True)
class _HeaderPlan:
    """What a binary request's JSON header says, ready to cut its tensors from the body:
    ``(name, dtype, dims, offset, count)`` per input, and the rest of the request."""

    tensors: tuple[tuple[str, np.dtype, tuple[int, ...], int, int], ...]
    binary_size: int
    declared: dict[str, str]
    outputs: list[RequestedOutput] | None
    id: str
    parameters: dict[str, Any]
    binary_output: bool


_plans: dict[bytes, _HeaderPlan] = {}


def decode_rest_request(body: bytes, header_length: int | None) -> DecodedRequest:
    """Decode a KServe v2 REST infer body (JSON, or JSON header + binary tensors)."""
    if header_length is not None and 0 <= header_length <= min(len(body), HEADER_PLAN_BYTES):
        header = bytes(memoryview(body)[:header_length])
        plan = _plans.get(header)
        if plan is not None and len(body) - header_length == plan.binary_size:
            return _from_plan(plan, body, header_length)
        decoded = _decode_rest_request(body, header_length)
        if plan is None:
            _remember(header, decoded)
        return decoded
    return _decode_rest_request(body, header_length)


def _from_plan(plan: _HeaderPlan, body: bytes, start: int) -> DecodedRequest:
    frombuffer = np.frombuffer
    inputs = {
        name: frombuffer(body, dtype, count, start + offset).reshape(dims)
        for name, dtype, dims, offset, count in plan.tensors
    }
    return DecodedRequest(
        inputs=inputs,
        declared=dict(plan.declared),
        outputs=None if plan.outputs is None else list(plan.outputs),
        id=plan.id,
        parameters=dict(plan.parameters),
        binary_output=plan.binary_output,
    )


def _remember(header: bytes, decoded: DecodedRequest) -> None:
    """Keep how ``header`` decoded when every input came from the binary part (then the
    same header always cuts the same tensors from a body of the same size)."""
    tensors, offset = [], 0
    for name, array in decoded.inputs.items():
        base = array.base
        while isinstance(base, np.ndarray):
            base = base.base
        if not isinstance(base, (bytes, memoryview)):
            return  # a JSON 'data' input: its values are in the header, not cut from the body
        tensors.append((name, array.dtype, array.shape, offset, array.size))
        offset += array.nbytes
    if len(_plans) >= HEADER_PLANS:
        _plans.clear()
    _plans[header] = _HeaderPlan(
        tuple(tensors), offset, dict(decoded.declared),
        None if decoded.outputs is None else list(decoded.outputs), decoded.id,
        dict(decoded.parameters), decoded.binary_output,
    )  # fmt: skip


def _decode_rest_request(body: bytes, header_length: int | None) -> DecodedRequest:
    """:func:`decode_rest_request` from the JSON up (every check, every message)."""
    if header_length is None:
        header, binary = body, memoryview(b"")
    else:
        if header_length < 0 or header_length > len(body):
            raise InvalidInputError(
                f"Inference-Header-Content-Length is {header_length} but the body has only "
                f"{len(body)} bytes"
            )
        view = memoryview(body)
        header, binary = view[:header_length], view[header_length:]
    request = parse_json(header)
    if not isinstance(request, dict):
        raise InvalidInputError("the request body must be a JSON object")
    raw_inputs = request.get("inputs")
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise InvalidInputError("the request needs a non-empty 'inputs' list")
    parameters = request.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise InvalidInputError("'parameters' must be a JSON object")

    inputs: dict[str, np.ndarray] = {}
    declared: dict[str, str] = {}
    offset = 0
    for i, spec in enumerate(raw_inputs):
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
            raise InvalidInputError(f"inputs[{i}] must be an object with a 'name'")
        name = spec["name"]
        if name in inputs:
            raise InvalidInputError(f"input {name!r} is given twice")
        datatype = spec.get("datatype")
        shape = spec.get("shape")
        params = spec.get("parameters") or {}
        size = params.get("binary_data_size") if isinstance(params, dict) else None
        if size is not None:
            if type(size) is not int or size < 0:
                raise InvalidInputError(
                    f"input {name!r}: binary_data_size must be a non-negative integer"
                )
            if offset + size > len(binary):
                raise InvalidInputError(
                    f"input {name!r}: binary_data_size is {size} bytes but only "
                    f"{len(binary) - offset} bytes of binary data remain (truncated body?)"
                )
            array = array_from_bytes(name, datatype, shape, binary[offset : offset + size])
            offset += size
        elif "data" in spec:
            array = array_from_list(name, datatype, shape, spec["data"])
        else:
            raise InvalidInputError(f"input {name!r} has neither 'data' nor binary_data_size")
        inputs[name] = array
        declared[name] = datatype
    if offset != len(binary):
        raise InvalidInputError(
            f"the body carries {len(binary) - offset} bytes of binary data that no input claims"
        )

    outputs = None
    raw_outputs = request.get("outputs")
    if raw_outputs is not None:
        if not isinstance(raw_outputs, list):
            raise InvalidInputError("'outputs' must be a list")
        outputs = []
        for i, out in enumerate(raw_outputs):
            if not isinstance(out, dict) or not isinstance(out.get("name"), str):
                raise InvalidInputError(f"outputs[{i}] must be an object with a 'name'")
            params = out.get("parameters") or {}
            binary_flag = params.get("binary_data") if isinstance(params, dict) else None
            outputs.append(RequestedOutput(out["name"], binary_flag))
    request_id = request.get("id", "")
    return DecodedRequest(
        inputs=inputs,
        declared=declared,
        outputs=outputs,
        id=request_id if isinstance(request_id, str) else str(request_id),
        parameters=parameters,
        binary_output=bool(parameters.get("binary_data_output", False)),
    )


def json_values(array: np.ndarray) -> list:
    """``array.tolist()``, with ``null`` for NaN and infinite values: JSON has no literal for
    them (Python's ``NaN`` is not JSON).  Binary outputs carry them as they are."""
    if array.dtype.kind != "f" or np.isfinite(array).all():
        return array.tolist()
    values = array.astype(object)
    values[~np.isfinite(array)] = None
    return values.tolist()


def encode_rest_response(
    model_name: str,
    model_version: str,
    request_id: str,
    outputs: dict[str, np.ndarray],
    binary: dict[str, bool],
) -> tuple[bytes, int | None]:
    """The REST infer response body, and its JSON header length when any output is binary."""
    tensors, chunks = [], []
    for name, array in outputs.items():
        array = np.ascontiguousarray(array)
        entry: dict[str, Any] = {
            "name": name,
            "datatype": datatype_of(array),
            "shape": list(array.shape),
        }
        if binary.get(name):
            raw = array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes()
            entry["parameters"] = {"binary_data_size": len(raw)}
            chunks.append(raw)
        else:
            entry["data"] = json_values(array.reshape(-1))
        tensors.append(entry)
    body: dict[str, Any] = {"model_name": model_name, "model_version": model_version}
    if request_id:
        body["id"] = request_id
    body["outputs"] = tensors
    header = dump_json(body)
    if not chunks:
        return header, None
    return header + b"".join(chunks), len(header)
