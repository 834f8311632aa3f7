"""Norm data in parts, each with the keyset file of its keys, for the embedding training
cache's tests (one process and several ranks)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

import tierserve.trainer as hugectr
from tierserve.trainer.data.reader import DataReader
from tierserve.trainer.hugectr.etc import write_keyset


def keyset_parts(out: Path, slots: int, parts: int = 2,
                 i64_input_key: bool = True) -> list[tuple[str, str]]:
    """``parts`` Norm file lists of 1,024 samples (one-hot, ``slots`` slots of 300 keys,
    different seeds, so their keys overlap) and each one's keyset file, keys of the given
    width: ``(file list, keyset)`` pairs."""
    pairs = []
    for i in range(parts):
        folder = out / f"part{i}"
        hugectr.tools.DataGenerator(hugectr.tools.DataGeneratorParams(
            format=hugectr.DataReaderType_t.Norm, label_dim=1, dense_dim=3, num_slot=slots,
            i64_input_key=i64_input_key, source=str(folder / "file_list.txt"),
            eval_source=str(folder / "file_list_test.txt"), slot_size_array=[300] * slots,
            nnz_array=[1] * slots, check_type=hugectr.Check_t.Sum, num_files=1,
            eval_num_files=1, num_samples_per_file=1024, seed=11 + i)).generate()
        with DataReader("Norm", folder / "file_list.txt", 1024, 1, 3,
                        [hugectr.DataReaderSparseParam("s", 1, True, slots)],
                        i64_input_key=i64_input_key, check_type="Sum") as reader:
            keys = np.unique(np.concatenate([b.sparse[0].keys for b in reader]))
        write_keyset(folder / "keyset", keys, i64_input_key)
        pairs.append((str(folder / "file_list.txt"), str(folder / "keyset")))
    return pairs
