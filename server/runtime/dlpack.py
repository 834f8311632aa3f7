"""Reading and writing the tensor behind a DLPack capsule without consuming it.

HugeCTR's ``HPS.lookup_fromdlpack(keys, out_tensor, ...)`` takes two capsules (made by
``torch.utils.dlpack.to_dlpack``, ``tf.experimental.dlpack.to_dlpack``, numpy's or cupy's
``__dlpack__``) and writes into the second, which the caller then turns back into its tensor.
So the capsules are read in place (``DLManagedTensor`` through ctypes) and left unconsumed:
their producer still owns the memory.  Host tensors (``kDLCPU``, ``kDLCUDAHost``) are read
and written with numpy; CUDA tensors (``kDLCUDA``, ``kDLCUDAManaged``) with cupy's memcpy.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from tierserve.core.errors import InvalidInputError

K_DL_CPU, K_DL_CUDA, K_DL_CUDA_HOST, K_DL_CUDA_MANAGED = 1, 2, 3, 13
_HOST = (K_DL_CPU, K_DL_CUDA_HOST)
_CUDA = (K_DL_CUDA, K_DL_CUDA_MANAGED)
_CODES = {0: "i", 1: "u", 2: "f"}  # kDLInt, kDLUInt, kDLFloat


class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _Tensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _Device),
        ("ndim", ctypes.c_int32),
        ("dtype", _DataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_get_pointer.restype = ctypes.c_void_p
_get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_is_valid = ctypes.pythonapi.PyCapsule_IsValid
_is_valid.restype = ctypes.c_int
_is_valid.argtypes = [ctypes.py_object, ctypes.c_char_p]


def _tensor(capsule: Any, what: str) -> tuple[_Tensor, np.dtype, tuple[int, ...]]:
    if not _is_valid(capsule, b"dltensor"):
        raise InvalidInputError(f"{what}: not an unconsumed DLPack capsule (\"dltensor\"); pass "
                                "what to_dlpack / __dlpack__() returns, once")
    t = _Tensor.from_address(_get_pointer(capsule, b"dltensor"))  # DLManagedTensor starts so
    if t.dtype.lanes != 1 or t.dtype.code not in _CODES:
        raise InvalidInputError(f"{what}: DLPack type code {t.dtype.code} x{t.dtype.lanes} is "
                                "not an integer or float type")
    dtype = np.dtype(f"{_CODES[t.dtype.code]}{t.dtype.bits // 8}")
    shape = tuple(int(t.shape[i]) for i in range(t.ndim))
    if t.strides:  # NULL strides: compact row-major
        expect, step = [], 1
        for n in reversed(shape):
            expect.append(step)
            step *= n
        given = [int(t.strides[i]) for i in range(t.ndim)]
        if any(g != e for g, e, n in zip(given, reversed(expect), shape) if n > 1):
            raise InvalidInputError(f"{what}: the tensor must be contiguous (row-major), got "
                                    f"strides {given} for shape {list(shape)}")
    if t.device.device_type not in _HOST + _CUDA:
        raise InvalidInputError(f"{what}: DLPack device type {t.device.device_type} is neither "
                                "the host nor a CUDA device")
    return t, dtype, shape


def _cupy(what: str):
    from tierserve.cache.device import cupy_or_none

    cp = cupy_or_none()
    if cp is None:
        raise InvalidInputError(f"{what} is on a CUDA device, and cupy sees none here")
    return cp


def read_capsule(capsule: Any, what: str) -> np.ndarray:
    """A host copy of the tensor behind ``capsule`` (integer or float)."""
    t, dtype, shape = _tensor(capsule, what)
    count = int(np.prod(shape, dtype=np.int64))
    address = (t.data or 0) + int(t.byte_offset)
    out = np.empty(count, dtype=dtype)
    if count == 0:
        return out.reshape(shape)
    if t.device.device_type in _HOST:
        ctypes.memmove(out.ctypes.data, address, out.nbytes)
    else:
        cp = _cupy(what)
        with cp.cuda.Device(t.device.device_id):
            cp.cuda.runtime.memcpy(out.ctypes.data, address, out.nbytes, 2)  # device to host
    return out.reshape(shape)


def write_capsule(capsule: Any, values: Any, what: str) -> None:
    """Write float32 ``values`` (numpy, or cupy on the capsule's device) into the first
    ``values.size`` elements of the float32 tensor behind ``capsule``."""
    t, dtype, shape = _tensor(capsule, what)
    if dtype != np.float32:
        raise InvalidInputError(f"{what}: the tensor must be float32, got {dtype}")
    count = int(values.size)
    capacity = int(np.prod(shape, dtype=np.int64))
    if capacity < count:
        raise InvalidInputError(f"{what}: the tensor holds {capacity} values; the lookup "
                                f"returns {count} (number of keys x embedding vector size)")
    if count == 0:
        return
    address = (t.data or 0) + int(t.byte_offset)
    on_host = isinstance(values, np.ndarray)
    if t.device.device_type in _HOST and on_host:
        src = np.ascontiguousarray(values, dtype=np.float32)
        ctypes.memmove(address, src.ctypes.data, src.nbytes)
        return
    cp = _cupy(what if t.device.device_type in _CUDA else "the embedding cache")
    if on_host:
        src = np.ascontiguousarray(values, dtype=np.float32)
        kind, pointer = 1, src.ctypes.data  # host to device
    else:
        src = cp.ascontiguousarray(values, dtype=cp.float32)
        kind, pointer = (3 if t.device.device_type in _CUDA else 2), src.data.ptr
    with cp.cuda.Device(t.device.device_id if t.device.device_type in _CUDA else src.device.id):
        cp.cuda.runtime.memcpy(address, pointer, src.nbytes, kind)
