"""Every CUDA source in cuda/ compiles with NVRTC for every supported architecture, with the
options cupy uses at run time, warnings as errors; no GPU or driver needed.

A broken copy of the source (syntax error, type error, a warning) fails with a message that
names the source, the architecture and NVRTC's diagnostic: a kernel that does not build
fails CI, not the first GPU user.
"""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

import pytest

from tierserve.cache.kernels import COMPILE_OPTIONS, SOURCE, kernel_source, kernel_source_names
from tierserve.cache.nvrtc import (
    ARCHITECTURES,
    KernelCompileError,
    compile_source,
    nvrtc_version,
)

CUDA_DIR = Path(__file__).resolve().parents[2] / "cuda"

if sys.platform == "darwin":  # NVIDIA ships no NVRTC wheel for macOS
    pytest.skip("NVRTC wheels exist for Linux and Windows only", allow_module_level=True)


def test_nvrtc_is_cuda_12():
    # cupy-cuda12x (the gpu extra) compiles with CUDA 12's NVRTC: CI compiles with the same.
    assert nvrtc_version().startswith("12.")


def test_every_source_in_the_folder_is_compiled():
    assert kernel_source_names() == sorted(p.name for p in CUDA_DIR.glob("*.cu"))
    assert SOURCE in kernel_source_names()


def test_the_compile_options_are_the_ones_cupy_is_given():
    assert inspect.signature(compile_source).parameters["options"].default is COMPILE_OPTIONS
    assert {"sm_80", "sm_90"} <= set(ARCHITECTURES)


@pytest.mark.parametrize("arch", ARCHITECTURES)
@pytest.mark.parametrize("name", sorted(p.name for p in CUDA_DIR.glob("*.cu")))
def test_kernel_compiles(name, arch):
    compiled = compile_source(name, arch)
    assert compiled.cubin_bytes > 1000  # a real cubin, not an empty module


BROKEN = {
    "syntax error": (
        "h ^= h >> 32;", "h ^= h >> 32",
        r"embedding_cache\.cu does not compile for sm_90:\n.*embedding_cache\.cu\(\d+\): error: expected a \";\"",
    ),
    "type error": (
        "const long long key = keys[i];", "const long long key = keys;",
        r"does not compile for sm_90:\n.*error: a value of type \"const long long \*\"",
    ),
    "undefined name": (
        "found = base + __ffs(mine) - 1;", "found = bas + __ffs(mine) - 1;",
        r"does not compile for sm_90:\n.*error: identifier \"bas\" is undefined",
    ),
    "warning": (
        "int found = -1;", "int found = -1; int unused;",
        r"compiles for sm_90 with warnings \(treated as errors\):\n.*\"unused\" was declared but never referenced",
    ),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_a_broken_kernel_fails_with_the_compiler_message(case):
    old, new, message = BROKEN[case]
    source = kernel_source(SOURCE)
    assert source.count(old) == 1, f"the {case} case no longer matches the source"
    with pytest.raises(KernelCompileError, match=message) as info:
        compile_source(SOURCE, "sm_90", source=source.replace(old, new))
    assert "\n" in str(info.value)  # the log is in the message


def test_an_unknown_architecture_is_refused():
    with pytest.raises(ValueError, match="arch must look like sm_90"):
        compile_source(SOURCE, "hopper")
