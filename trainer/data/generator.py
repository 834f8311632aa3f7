"""HugeCTR's data generator: ``DataGeneratorParams`` and ``DataGenerator.generate()``.

Writes a synthetic train and eval dataset in Norm, Parquet or Raw format with a planted model
(:mod:`~tierserve.trainer.data.planted`), so that labels depend on the features and a trained
model's AUC means something.  Output is deterministic for a given ``seed``.

Layout (HugeCTR's tools write the same shapes):

- Norm and Parquet: ``source`` and ``eval_source`` are file lists (they may share a folder);
  data files are ``<folder of source>/train/gen_<i>.data`` (``.parquet``) and
  ``<folder of eval_source>/val/gen_<i>.data``; Parquet's ``_metadata.json`` goes beside its
  data files, in ``train/`` and ``val/``, where HugeCTR's reader looks for it.  Norm keys are
  written global (slot offsets added), so read Norm with an empty ``slot_size_array``;
  Parquet keys are slot-local (int64, or uint32 without ``i64_input_key``): read with
  ``slot_size_array``.
- Raw: ``source`` and ``eval_source`` are the data files (``num_samples`` and
  ``eval_num_samples`` records).  Keys are slot-local: read with ``slot_size_array``.

:meth:`DataGenerator.expected_records` recomputes what a reader configured that way yields for
any generated file, for tests.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import numpy as np
from pydantic import Field

from tierserve.core.errors import ConfigError
from tierserve.ps.params import ParamsModel

from .filelist import write_file_list
from .norm import write_norm_file
from .params import Check_t, DataReaderType_t
from .parquet import (
    ParquetMetadata,
    default_column_names,
    write_parquet_file,
    write_parquet_metadata,
)
from .planted import PlantedModel, auc_score
from .raw import raw_dense, write_raw_file
from .records import Records

log = logging.getLogger(__name__)

RAW_BLOCK = 65536  # records generated at a time for one Raw file


class Distribution_t(str, Enum):  # noqa: N801 - HugeCTR's name
    """How keys are drawn within a slot."""

    PowerLaw = "PowerLaw"
    Uniform = "Uniform"


class PowerLaw_t(str, Enum):  # noqa: N801 - HugeCTR's name
    """Power-law presets: Long (alpha 0.9), Medium (1.1), Short (1.3), or ``alpha``."""

    Long = "Long"
    Medium = "Medium"
    Short = "Short"
    Specific = "Specific"


POWER_LAW_ALPHA = {PowerLaw_t.Long: 0.9, PowerLaw_t.Medium: 1.1, PowerLaw_t.Short: 1.3}


class DataGeneratorParams(ParamsModel):
    """HugeCTR's ``DataGeneratorParams`` (same names, order and defaults).

    tierserve adds ``seed`` (the output is a function of it) and ``variable_nnz``: when true,
    slot ``s`` of each sample holds 1 to ``nnz_array[s]`` keys instead of exactly that many.
    """

    format: DataReaderType_t
    label_dim: Annotated[int, Field(ge=1)]
    dense_dim: Annotated[int, Field(ge=0)]
    num_slot: Annotated[int, Field(ge=1)]
    i64_input_key: bool
    source: str
    eval_source: str
    slot_size_array: list[Annotated[int, Field(ge=1)]]
    nnz_array: list[Annotated[int, Field(ge=1)]] = Field(default_factory=list)
    check_type: Check_t = Check_t.Sum
    dist_type: Distribution_t = Distribution_t.PowerLaw
    power_law_type: PowerLaw_t = PowerLaw_t.Specific
    alpha: Annotated[float, Field(gt=0)] = 1.2
    num_files: Annotated[int, Field(ge=1)] = 128
    eval_num_files: Annotated[int, Field(ge=1)] = 32
    num_samples_per_file: Annotated[int, Field(ge=1)] = 40960
    num_samples: Annotated[int, Field(ge=1)] = 5242880
    eval_num_samples: Annotated[int, Field(ge=1)] = 1310720
    float_label_dense: bool = False
    seed: int = 0
    variable_nnz: bool = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        problems = []
        if len(self.slot_size_array) != self.num_slot:
            problems.append(
                f"slot_size_array has {len(self.slot_size_array)} entries, num_slot is "
                f"{self.num_slot}"
            )
        if self.nnz_array and len(self.nnz_array) != self.num_slot:
            problems.append(
                f"nnz_array has {len(self.nnz_array)} entries, num_slot is {self.num_slot}"
            )
        if self.alpha == 1.0:
            problems.append("alpha must not be 1.0")
        if self.format is DataReaderType_t.RawAsync:
            self.format = DataReaderType_t.Raw
        if self.format is DataReaderType_t.Raw:
            if any(n != 1 for n in self.nnz_array) or self.variable_nnz:
                problems.append("Raw data is one-hot: nnz_array must be all 1")
            if self.i64_input_key:
                problems.append("Raw data has int32 keys: i64_input_key must be False")
            if max(self.slot_size_array) > 2**31:
                problems.append("Raw keys are int32: slot sizes must be <= 2**31")
        if (
            self.format is DataReaderType_t.Norm
            and not self.i64_input_key
            and sum(self.slot_size_array) > 2**32
        ):
            problems.append("the slots hold more than 2**32 keys: use i64_input_key=True")
        if problems:
            raise ConfigError("invalid DataGeneratorParams:\n  " + "\n  ".join(problems))

    @property
    def nnz(self) -> list[int]:
        """Keys per slot (the maximum when ``variable_nnz``)."""
        return list(self.nnz_array) or [1] * self.num_slot

    @property
    def power_law_alpha(self) -> float:
        return POWER_LAW_ALPHA.get(self.power_law_type, self.alpha)


@dataclass
class GeneratedSplit:
    """What :meth:`DataGenerator.generate` wrote for the train or the eval split."""

    source: str
    files: list[str]
    num_samples: int
    positive_rate: float
    bayes_auc: float  # AUC of the true click probabilities against the sampled labels


@dataclass
class GeneratedDataset:
    """Summary of a generated dataset, with what a reader needs to read it back."""

    format: DataReaderType_t
    train: GeneratedSplit
    eval: GeneratedSplit
    slot_size_array: list[int]
    #: the ``slot_size_array`` to give ``DataReaderParams`` ([] for Norm: keys are global)
    reader_slot_size_array: list[int] = field(default_factory=list)


class DataGenerator:
    """HugeCTR's ``DataGenerator``: ``DataGenerator(params).generate()``."""

    def __init__(self, data_generator_params: DataGeneratorParams) -> None:
        self.params = p = data_generator_params
        self.model = PlantedModel(p.seed, p.label_dim, p.dense_dim, p.num_slot)
        self._sizes = np.asarray(p.slot_size_array, dtype=np.int64)
        self._offsets = np.concatenate([[0], np.cumsum(self._sizes)[:-1]]).astype(np.int64)

    # -- the samples ----------------------------------------------------------------------

    def samples(self, split: str, index: int, count: int) -> tuple[Records, np.ndarray, np.ndarray]:
        """Sample stream ``index`` of ``split`` ("train" or "eval"): slot-local records (dense
        as the reader yields it), the int dense counts and the true logits ``[n, label_dim]``."""
        p = self.params
        rng = np.random.default_rng([p.seed, {"train": 0, "eval": 1}[split], index])
        s = p.num_slot
        z = rng.standard_normal((count, p.dense_dim))
        counts_dense = self.model.dense_counts(z)
        nnz = np.asarray(p.nnz, dtype=np.int64)
        if p.variable_nnz:
            counts = rng.integers(1, nnz + 1, size=(count, s))
        else:
            counts = np.broadcast_to(nnz, (count, s))
        row_offsets = np.zeros(count * s + 1, dtype=np.int64)
        np.cumsum(counts.ravel(), out=row_offsets[1:])
        slot_of_key = np.repeat(np.tile(np.arange(s), count), counts.ravel())
        keys = self._draw_keys(rng, slot_of_key)
        logits = self.model.logits(z, keys, row_offsets)
        labels = (rng.random(logits.shape) < 1.0 / (1.0 + np.exp(-logits))).astype(np.float32)
        dense = raw_dense(counts_dense, float_label_dense=False)  # log(1 + count), float32
        return Records(labels, dense, keys, row_offsets, s), counts_dense, logits

    def _draw_keys(self, rng: np.random.Generator, slot_of_key: np.ndarray) -> np.ndarray:
        size = self._sizes[slot_of_key].astype(np.float64)
        u = rng.random(len(slot_of_key))
        if self.params.dist_type is Distribution_t.Uniform:
            keys = np.floor(u * size)
        else:  # inverse CDF of a continuous power law on [1, size + 1), shifted to [0, size)
            e = 1.0 - self.params.power_law_alpha
            lo, hi = 1.0, (size + 1.0) ** e
            keys = np.floor((lo + u * (hi - lo)) ** (1.0 / e)) - 1.0
        return np.minimum(keys.astype(np.int64), self._sizes[slot_of_key] - 1)

    def global_keys(self, records: Records) -> Records:
        """``records`` with slot offsets added to the keys."""
        n, s = len(records), records.slot_num
        slot_of_key = np.repeat(np.tile(np.arange(s), n), records.counts().ravel())
        keys = records.keys + self._offsets[slot_of_key]
        return Records(records.label, records.dense, keys, records.row_offsets, s)

    def expected_records(self, split: str, index: int = 0) -> Records:
        """What a reader set up as :attr:`GeneratedDataset.reader_slot_size_array` says yields
        for file ``index`` of ``split`` (Raw: the whole file)."""
        p = self.params
        if p.format is DataReaderType_t.Raw:
            total = p.num_samples if split == "train" else p.eval_num_samples
            parts = [
                self.samples(split, b, min(RAW_BLOCK, total - start))[0]
                for b, start in enumerate(range(0, total, RAW_BLOCK))
            ]
            return self.global_keys(Records.concat(parts))
        return self.global_keys(self.samples(split, index, p.num_samples_per_file)[0])

    # -- writing --------------------------------------------------------------------------

    def generate(self) -> GeneratedDataset:
        """Write the train and eval datasets and their file lists; report the planted signal."""
        p = self.params
        train = self._write_split("train", p.source, p.num_files, p.num_samples)
        evals = self._write_split("eval", p.eval_source, p.eval_num_files, p.eval_num_samples)
        local = p.format is not DataReaderType_t.Norm
        out = GeneratedDataset(
            p.format,
            train,
            evals,
            list(p.slot_size_array),
            list(p.slot_size_array) if local else [],
        )
        log.info(
            "generated %s data: %d train samples (Bayes-optimal AUC %.4f, %.1f%% positive), "
            "%d eval samples (Bayes-optimal AUC %.4f)",
            p.format.value,
            train.num_samples,
            train.bayes_auc,
            100 * train.positive_rate,
            evals.num_samples,
            evals.bayes_auc,
        )
        return out

    def _write_split(self, split: str, source: str, num_files: int, raw_total: int):
        p = self.params
        labels, logits, files = [], [], []
        if p.format is DataReaderType_t.Raw:
            Path(source).unlink(missing_ok=True)
            for b, start in enumerate(range(0, raw_total, RAW_BLOCK)):
                records, counts, lg = self.samples(split, b, min(RAW_BLOCK, raw_total - start))
                dense = records.dense if p.float_label_dense else counts
                keys = records.keys.reshape(len(records), p.num_slot)
                write_raw_file(source, records.label, dense, keys, p.float_label_dense, True)
                labels.append(records.label)
                logits.append(lg)
            files.append(source)
        else:
            # named as HugeCTR's generator names them: <folder of source as given>/train/...,
            # listed as such (relative to the working directory when source is relative)
            folder = os.path.join(os.path.dirname(source), "train" if split == "train" else "val")
            Path(folder).mkdir(parents=True, exist_ok=True)
            names = default_column_names(p.label_dim, p.dense_dim, p.num_slot)
            stats = {}
            list_slots = [p.variable_nnz or n > 1 for n in p.nnz]
            for i in range(num_files):
                records, _, lg = self.samples(split, i, p.num_samples_per_file)
                if p.format is DataReaderType_t.Norm:
                    path = os.path.join(folder, f"gen_{i}.data")
                    write_norm_file(path, self.global_keys(records), p.check_type, p.i64_input_key)
                else:
                    path = os.path.join(folder, f"gen_{i}.parquet")
                    meta = ParquetMetadata({}, names[2], names[1], names[0])
                    write_parquet_file(path, records, meta, list_slots, p.i64_input_key)
                    stats[os.path.basename(path)] = len(records)
                files.append(path)
                labels.append(records.label)
                logits.append(lg)
            if p.format is DataReaderType_t.Parquet:
                write_parquet_metadata(folder, ParquetMetadata(stats, names[2], names[1], names[0]))
            write_file_list(source, files, as_given=True)
        label = np.concatenate(labels)
        logit = np.concatenate(logits)
        auc = float(np.mean([auc_score(label[:, j], logit[:, j]) for j in range(p.label_dim)]))
        return GeneratedSplit(source, files, len(label), float(label.mean()), auc)
