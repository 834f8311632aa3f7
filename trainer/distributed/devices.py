"""How ranks map to ``vvgpu`` entries.

``vvgpu`` follows HugeCTR: one inner list per node, the devices of that node in it
(``[[0, 1]]``: one node, two devices; ``[[0], [0]]``: two nodes, one device each).  With
``mpiexec -n N`` each rank is one device: flatten ``vvgpu`` node by node and rank ``r`` takes
entry ``r`` (node ``i``'s devices go to the consecutive ranks ``mpiexec`` places on node
``i`` with its default block placement).  On the CPU the device number only names the rank's
share; on a GPU the rank computes on that device.  ``vvgpu`` must list exactly ``N`` devices.
"""

from __future__ import annotations

from typing import Any

from tierserve.core.errors import ConfigError
from tierserve.model.device import flatten_vvgpu


def rank_device(vvgpu: Any, rank: int, size: int) -> tuple[int, int]:
    """``(node, device)`` of ``rank`` among ``size`` ranks, or a ConfigError naming ``vvgpu``
    and the rank count when they disagree."""
    nodes = [list(n) if isinstance(n, (list, tuple)) else [n] for n in (vvgpu or [[0]])]
    placed = [(i, int(d)) for i, node in enumerate(nodes) for d in node]
    if len(placed) != size:
        raise ConfigError(
            f"CreateSolver(vvgpu={vvgpu!r}) lists {len(placed)} device(s) but the job has "
            f"{size} ranks: under mpiexec each rank is one device, so vvgpu must list {size} "
            f"(one inner list per node, e.g. [[{', '.join(map(str, range(size)))}]] for "
            f"{size} ranks on one node)")
    for i, node in enumerate(nodes):
        if len(set(node)) != len(node):
            raise ConfigError(f"CreateSolver(vvgpu={vvgpu!r}): node {i} lists a device twice")
    return placed[rank]


def device_list(vvgpu: Any, rank: int, size: int) -> list[int]:
    """The one-device ``vvgpu`` a rank selects its array module with."""
    if size == 1:
        return flatten_vvgpu(vvgpu)
    return [rank_device(vvgpu, rank, size)[1]]
