"""The dense layers' CPU matrix products: numpy's BLAS, or Intel MKL's sequential GEMM.

At one BLAS thread MKL's ``sgemm`` runs the DLRM layers' products (batch 2048, widths
13-512) about 10% faster than the OpenBLAS that numpy wheels ship (docs/performance.md).
:func:`matmul` uses MKL, through ``cblas_?gemm`` from the ``mkl`` package's
``libmkl_rt`` (the ``mkl`` extra), when it is installed and selected, and numpy's ``@``
otherwise.  ``TIERSERVE_BLAS`` selects:

- ``auto`` (default): MKL while numpy's BLAS runs one thread
  (:func:`tierserve.model.blas_threads.set_blas_threads`, ``OPENBLAS_NUM_THREADS=1``),
  where MKL is installed; numpy's threaded BLAS otherwise;
- ``mkl``: MKL (one thread) whatever numpy's thread count; an error where MKL is missing;
- ``numpy``: numpy's BLAS only.

MKL runs its sequential layer, so it never starts threads of its own beside OpenBLAS's.
Products equal numpy's up to float rounding (another summation order).
"""

from __future__ import annotations

import ctypes
import glob
import os
import sys
from typing import Any

import numpy as np

from tierserve.core.errors import ConfigError

from .blas_threads import get_blas_threads, on_blas_threads_changed

_CHOICES = ("auto", "mkl", "numpy")
_ROW_MAJOR, _NO_TRANS, _TRANS = 101, 111, 112
_MKL_THREADING_SEQUENTIAL = 1
_INT_MAX = 2**31 - 1
_GEMM = {np.dtype(np.float32): "cblas_sgemm", np.dtype(np.float64): "cblas_dgemm"}

_lib: Any = False  # False: not looked for yet; None: not found
_use_mkl: bool | None = None  # None: decide on the next product


def _choice() -> str:
    value = os.environ.get("TIERSERVE_BLAS", "auto").strip().lower() or "auto"
    if value not in _CHOICES:
        raise ConfigError(
            f"TIERSERVE_BLAS={value!r} is not one of {', '.join(_CHOICES)}")
    return value


def _candidates() -> list[str]:
    found: list[str] = []
    try:
        from importlib.metadata import PackageNotFoundError, distribution
        try:
            dist = distribution("mkl")
            found += [str(dist.locate_file(f)) for f in dist.files or ()
                      if os.path.basename(str(f)).startswith(("libmkl_rt.so", "libmkl_rt."))]
        except PackageNotFoundError:
            pass
    except ImportError:  # pragma: no cover - importlib.metadata is in every supported Python
        pass
    found += sorted(glob.glob(os.path.join(sys.prefix, "lib", "libmkl_rt.so*")))
    return found


def _load_mkl() -> Any:
    """MKL's runtime library set to its sequential layer, or None where it is not installed."""
    global _lib
    if _lib is not False:
        return _lib
    _lib = None
    for path in _candidates():
        try:
            lib = ctypes.CDLL(path)
            lib.MKL_Set_Threading_Layer(ctypes.c_int(_MKL_THREADING_SEQUENTIAL))
        except (OSError, AttributeError):
            continue
        args = [ctypes.c_int] * 6
        for name, real in (("cblas_sgemm", ctypes.c_float), ("cblas_dgemm", ctypes.c_double)):
            fn = getattr(lib, name)
            fn.argtypes = [*args, real, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p,
                           ctypes.c_int, real, ctypes.c_void_p, ctypes.c_int]
            fn.restype = None
        _lib = lib
        break
    return _lib


def mkl_available() -> bool:
    """Whether MKL's runtime library is installed and loads."""
    return _load_mkl() is not None


def uses_mkl() -> bool:
    """Whether :func:`matmul` runs MKL now (see the module docstring)."""
    global _use_mkl
    if _use_mkl is None:
        choice = _choice()
        if choice == "numpy":
            _use_mkl = False
        elif choice == "mkl":
            if not mkl_available():
                raise ConfigError(
                    "TIERSERVE_BLAS=mkl but MKL's runtime library (libmkl_rt) is not "
                    "installed: pip install 'tierserve[mkl]'")
            _use_mkl = True
        else:
            _use_mkl = mkl_available() and get_blas_threads() == 1
    return _use_mkl


def blas_threads_changed() -> None:
    """Re-decide between MKL and numpy's BLAS on the next product (numpy's BLAS thread
    count changed)."""
    global _use_mkl
    _use_mkl = None


on_blas_threads_changed(blas_threads_changed)


def _operand(a: np.ndarray) -> tuple[int, int] | None:
    """(transpose flag, leading dimension) of a 2-D row-major operand, None if unusable."""
    if a.flags.c_contiguous:
        return _NO_TRANS, a.shape[1]
    if a.flags.f_contiguous:
        return _TRANS, a.shape[0]
    return None


def matmul(a: Any, b: Any) -> Any:
    """``a @ b`` for 2-D arrays; a new C-contiguous array."""
    if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.ndim == 2
            and b.ndim == 2 and a.dtype == b.dtype and a.dtype in _GEMM
            and a.shape[1] == b.shape[0] and min(*a.shape, b.shape[1]) > 0
            and max(*a.shape, b.shape[1]) <= _INT_MAX and uses_mkl()):
        return a @ b
    ops = _operand(a), _operand(b)
    if None in ops:
        return a @ b
    (ta, lda), (tb, ldb) = ops
    m, k = a.shape
    n = b.shape[1]
    c = np.empty((m, n), dtype=a.dtype)
    getattr(_lib, _GEMM[a.dtype])(_ROW_MAJOR, ta, tb, m, n, k, 1.0, a.ctypes.data, lda,
                                  b.ctypes.data, ldb, 0.0, c.ctypes.data, n)
    return c

