"""The model graph JSON (docs/formats.md, Files and messages 3), as written by
``Model.graph_to_json``.

``{"solver": {...}, "optimizer": {...}, "layers": [...]}``; each layer is
``{"name", "type", "bottom", "top", ...params}`` with HugeCTR's type names.  The first layer
is the ``Data`` layer, whose tops are its label, dense and sparse inputs instead of a
``top`` field.  :func:`load_graph_json` checks the structure and that every ``bottom`` names
a tensor an earlier layer produced, and names the offending layer when not.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tierserve.core.errors import CorruptModelFileError
from tierserve.ps.atomic import atomic_write_file


def as_list(value: str | list[str] | None) -> list[str]:
    """A layer's ``bottom`` or ``top`` as a list of tensor names."""
    if value is None:
        return []
    return [value] if isinstance(value, str) else list(value)


def data_layer_tops(layer: dict[str, Any]) -> list[str]:
    """The tensors the ``Data`` layer produces: label, dense and each sparse input."""
    tops = []
    for key in ("label", "dense"):
        part = layer.get(key)
        if isinstance(part, dict) and part.get("top"):
            tops.extend(as_list(part["top"]))  # several label tops in multi-task graphs
    for sparse in layer.get("sparse", []) or []:
        tops.append(sparse["top"])
    return tops


@dataclass
class Graph:
    """A parsed graph JSON: solver and optimizer settings and the ordered layer list."""

    layers: list[dict[str, Any]]
    solver: dict[str, Any] = field(default_factory=dict)
    optimizer: dict[str, Any] = field(default_factory=dict)

    @property
    def data_layer(self) -> dict[str, Any]:
        return self.layers[0]

    def layers_of_type(self, *types: str) -> list[dict[str, Any]]:
        return [layer for layer in self.layers if layer["type"] in types]

    def to_dict(self) -> dict[str, Any]:
        return {"solver": self.solver, "optimizer": self.optimizer, "layers": self.layers}


def validate_graph(data: Any, source: str = "graph JSON") -> Graph:
    """Check a decoded graph JSON and return it as a :class:`Graph`."""
    if not isinstance(data, dict) or not isinstance(data.get("layers"), list):
        raise CorruptModelFileError(f"{source}: expected an object with a 'layers' list")
    layers = data["layers"]
    if not layers or not isinstance(layers[0], dict) or layers[0].get("type") != "Data":
        raise CorruptModelFileError(f"{source}: the first layer must be of type 'Data'")
    produced: set[str] = set()
    names: set[str] = set()
    for i, layer in enumerate(layers):
        if not isinstance(layer, dict):
            raise CorruptModelFileError(f"{source}: layer #{i} is not an object")
        name, kind = layer.get("name", f"#{i}"), layer.get("type")
        if not isinstance(kind, str):
            raise CorruptModelFileError(f"{source}: layer {name!r} has no 'type'")
        if name in names:
            raise CorruptModelFileError(f"{source}: layer name {name!r} is used twice")
        names.add(name)
        if kind == "Data":
            if i:
                raise CorruptModelFileError(
                    f"{source}: layer {name!r}: only the first layer may be Data"
                )
            produced.update(data_layer_tops(layer))
            continue
        for bottom in as_list(layer.get("bottom")):
            if bottom not in produced:
                raise CorruptModelFileError(
                    f"{source}: layer {name!r} ({kind}) has bottom {bottom!r}, "
                    f"which no earlier layer produces"
                )
        tops = as_list(layer.get("top"))
        if not tops:
            raise CorruptModelFileError(f"{source}: layer {name!r} ({kind}) has no 'top'")
        produced.update(tops)
    return Graph(
        layers=layers,
        solver=dict(data.get("solver") or {}),
        optimizer=dict(data.get("optimizer") or {}),
    )


def load_graph_json(path: str | os.PathLike) -> Graph:
    """Read and validate the graph JSON at ``path``."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise CorruptModelFileError(f"graph JSON {path} does not exist") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CorruptModelFileError(f"graph JSON {path} is not valid JSON: {exc}") from None
    return validate_graph(data, source=str(path))


def save_graph_json(path: str | os.PathLike, graph: Graph | dict[str, Any]) -> Path:
    """Validate and write ``graph`` to ``path`` atomically (indented, stable key order)."""
    data = graph.to_dict() if isinstance(graph, Graph) else graph
    validate_graph(data, source=str(path))
    atomic_write_file(path, [json.dumps(data, indent=2).encode() + b"\n"])
    return Path(path)
