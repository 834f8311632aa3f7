"""Where this process sits in an MPI job, read from the launcher's environment (no mpi4py
import): its rank, and the cluster properties ``RunConfig`` reports from them."""

from __future__ import annotations

from typing import Any

from .comm import launched_rank, launched_size


def cluster_properties() -> dict[str, Any]:
    """``RunConfig``'s cluster properties for this rank, as TensorFlow derives them from a
    ``TF_CONFIG`` with one chief and N-1 workers: rank 0 is the chief (``task_type``
    ``"chief"``, ``task_id`` 0), rank r > 0 is ``("worker", r - 1)``; ``global_id_in_cluster``
    is the rank and ``num_worker_replicas`` the rank count.  One process: TensorFlow's local
    values (``"worker"``, 0, chief)."""
    size = launched_size()
    rank = launched_rank() if size > 1 else 0
    if size <= 1:
        return {"is_chief": True, "num_worker_replicas": 1, "task_type": "worker",
                "task_id": 0, "global_id_in_cluster": 0, "cluster_spec": {}}
    return {"is_chief": rank == 0, "num_worker_replicas": size,
            "task_type": "chief" if rank == 0 else "worker",
            "task_id": 0 if rank == 0 else rank - 1, "global_id_in_cluster": rank,
            "cluster_spec": {"chief": ["rank:0"],
                             "worker": [f"rank:{r}" for r in range(1, size)]}}
