"""The distribution ships every package: pyproject's explicit list matches the source tree."""

from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[1]


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_every_python_folder_is_listed():
    setuptools = _pyproject()["tool"]["setuptools"]
    mapping = setuptools["package-dir"]
    listed = set(setuptools["packages"])
    found = set()
    for package, folder in mapping.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            found.add(".".join([package, *rel.parts]))
    missing = found - listed
    assert not missing, f"add these to [tool.setuptools] packages in pyproject.toml: {sorted(missing)}"
    for package in listed:
        top = max((p for p in mapping if package == p or package.startswith(p + ".")), key=len)
        rest = package[len(top) + 1 :].split(".") if package != top else []
        folder = ROOT / mapping[top] / Path(*rest)
        assert folder.is_dir(), f"{package} is listed but {folder} does not exist"


def test_cuda_kernels_are_package_data():
    setuptools = _pyproject()["tool"]["setuptools"]
    assert setuptools["package-dir"]["tierserve.cache.cuda"] == "cuda"
    assert "*.cu" in setuptools["package-data"]["tierserve.cache.cuda"]
