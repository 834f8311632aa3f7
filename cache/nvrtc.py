"""Compiling the CUDA sources of ``cuda/`` with NVRTC, without a GPU or a driver.

cupy compiles the kernels at first use on a GPU, and needs a driver even to compile.  This
module runs the same compiler (NVRTC, from the ``nvidia-cuda-nvrtc-cu12`` wheel through
``cuda-python``'s ``cuda.bindings.nvrtc``) with the same options
(:data:`tierserve.cache.kernels.COMPILE_OPTIONS`) for named architectures, so CI and
``tierserve doctor`` can tell whether every kernel builds on a machine with no GPU.

NVRTC has no ``-Werror``: a compile whose log holds a warning fails here all the same.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from .kernels import COMPILE_OPTIONS, kernel_source, kernel_source_names

#: Architectures every kernel must build for: T4, A100, A10/RTX 30xx, L4/RTX 40xx, H100/H200.
ARCHITECTURES: tuple[str, ...] = ("sm_75", "sm_80", "sm_86", "sm_89", "sm_90")
_WARNING = re.compile(r"\bwarning\b", re.IGNORECASE)
_ARCH = re.compile(r"^(sm|compute)_\d+[a-z]?$")


class KernelCompileError(Exception):
    """A CUDA source did not compile (or compiled with warnings); the message holds NVRTC's log."""


class NvrtcUnavailableError(Exception):
    """``cuda-python`` or the NVRTC library is not installed."""


@dataclass(frozen=True)
class Compiled:
    """One source compiled for one architecture."""

    source: str
    arch: str
    cubin_bytes: int


@functools.cache
def _preload_cuda12_nvrtc() -> None:
    """Load the CUDA 12 NVRTC of the ``nvidia-cuda-nvrtc-cu12`` wheel before the bindings
    look for one: cuda-pathfinder takes the first NVRTC it finds in site-packages, and with
    PyTorch's CUDA 13 wheels installed beside ours that is libnvrtc.so.13, which cuda-python
    12's bindings then drive (and which compiles for other architectures)."""
    import ctypes
    from importlib import metadata

    try:
        files = metadata.files("nvidia-cuda-nvrtc-cu12") or []
    except metadata.PackageNotFoundError:
        return
    for f in files:
        if f.name.startswith("libnvrtc.so.12"):
            try:
                ctypes.CDLL(str(f.locate()), mode=ctypes.RTLD_GLOBAL)
            except OSError:
                continue
            return


def _nvrtc():
    _preload_cuda12_nvrtc()
    try:
        from cuda.bindings import nvrtc
    except ImportError:
        try:
            from cuda import nvrtc  # cuda-python before 12.6 kept the module here
        except ImportError:
            raise NvrtcUnavailableError(
                "NVRTC is not available: install cuda-python>=12.6,<13 and "
                "nvidia-cuda-nvrtc-cu12 (the dev dependency group)"
            ) from None
    return nvrtc


def _check(nvrtc, result, what: str) -> None:
    if result != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        _, text = nvrtc.nvrtcGetErrorString(result)
        raise KernelCompileError(f"NVRTC {what} failed: {text.decode(errors='replace')}")


def nvrtc_version() -> str:
    """NVRTC's version, ``"major.minor"`` (raises :class:`NvrtcUnavailableError`)."""
    nvrtc = _nvrtc()
    try:
        result, major, minor = nvrtc.nvrtcVersion()
    except Exception as exc:  # the bindings import, the shared library does not load
        raise NvrtcUnavailableError(f"NVRTC library not found: {exc}") from None
    _check(nvrtc, result, "nvrtcVersion")
    return f"{major}.{minor}"


def compile_source(
    name: str, arch: str, source: str | None = None, options: tuple[str, ...] = COMPILE_OPTIONS
) -> Compiled:
    """Compile ``cuda/<name>`` (or the text ``source``, reported as ``name``) for ``arch``
    (``sm_80``, ...) with ``options``.

    Raises :class:`KernelCompileError` naming the source and architecture, with NVRTC's log,
    when it does not compile or when the log holds a warning.
    """
    if not _ARCH.match(arch):
        raise ValueError(f"arch must look like sm_90 or compute_90, got {arch!r}")
    nvrtc = _nvrtc()
    text = kernel_source(name) if source is None else source
    try:
        result, program = nvrtc.nvrtcCreateProgram(text.encode(), name.encode(), 0, [], [])
    except Exception as exc:
        raise NvrtcUnavailableError(f"NVRTC library not found: {exc}") from None
    _check(nvrtc, result, "nvrtcCreateProgram")
    try:
        opts = [o.encode() for o in (*options, f"--gpu-architecture={arch}")]
        (compiled,) = nvrtc.nvrtcCompileProgram(program, len(opts), opts)
        result, size = nvrtc.nvrtcGetProgramLogSize(program)
        _check(nvrtc, result, "nvrtcGetProgramLogSize")
        buffer = b" " * size
        (result,) = nvrtc.nvrtcGetProgramLog(program, buffer)
        _check(nvrtc, result, "nvrtcGetProgramLog")
        log = buffer.rstrip(b"\0").decode(errors="replace").strip()
        if compiled != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise KernelCompileError(f"{name} does not compile for {arch}:\n{log}")
        if _WARNING.search(log):
            raise KernelCompileError(
                f"{name} compiles for {arch} with warnings (treated as errors):\n{log}"
            )
        if arch.startswith("sm_"):
            result, cubin_bytes = nvrtc.nvrtcGetCUBINSize(program)
        else:
            result, cubin_bytes = nvrtc.nvrtcGetPTXSize(program)
        _check(nvrtc, result, "reading the compiled size")
        return Compiled(name, arch, int(cubin_bytes))
    finally:
        nvrtc.nvrtcDestroyProgram(program)


def compile_all(arches: tuple[str, ...] = ARCHITECTURES) -> list[Compiled]:
    """Every ``.cu`` source of the package compiled for every one of ``arches``
    (raises at the first failure)."""
    names = kernel_source_names()
    if not names:
        raise FileNotFoundError("no CUDA sources found in package tierserve.cache.cuda")
    return [compile_source(name, arch) for name in names for arch in arches]
