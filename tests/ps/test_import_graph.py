"""No import cycle between the modules of ``tierserve.ps``: the tier interface imports no
tier, the registry imports the interface and the tiers, and so on down."""

from __future__ import annotations

from import_graph import cycles, import_graph


def test_ps_modules_import_each_other_without_a_cycle():
    graph = import_graph("ps")
    assert "tierserve.ps.tier" in graph and graph["tierserve.ps.hierarchy"]
    assert cycles(graph) == []


def test_the_tier_interface_imports_no_tier():
    graph = import_graph("ps")
    tiers = {"hash_map", "shm_hash_map", "redis_tier", "rocksdb_tier"}
    assert not {m.rpartition(".")[2] for m in graph["tierserve.ps.tier"]} & tiers


def test_lazy_and_relative_imports_count(tmp_path):
    """The graph sees an import inside a function, ``from . import x`` and ``from .x import
    y``; a cycle through them is found."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from .b import g\n    return g\n")
    (pkg / "b.py").write_text("from . import c\n\ndef g():\n    pass\n")
    (pkg / "c.py").write_text("from .sub.d import h\n")
    (pkg / "sub" / "d.py").write_text("from ..a import f\nh = f\n")
    graph = import_graph("pkg", root=tmp_path)
    assert graph["tierserve.pkg.a"] == {"tierserve.pkg.b"}
    assert graph["tierserve.pkg.b"] == {"tierserve.pkg.c"}
    assert graph["tierserve.pkg.sub.d"] == {"tierserve.pkg.a"}
    assert cycles(graph) == [sorted(["tierserve.pkg.a", "tierserve.pkg.b", "tierserve.pkg.c",
                                     "tierserve.pkg.sub.d"])]
