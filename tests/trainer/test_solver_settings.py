"""The solver settings are declared once, on ``Solver``: every ``CreateSolver`` field reaches
the object that uses it with its value unchanged, and so does every ``solver_parser_helper``
field through a ``Session`` (a field with no consumer below fails the walk); the older API's
defaults and a graph JSON's ``"solver"`` clause convert into the same ``Solver``."""

from __future__ import annotations

import dataclasses
import json
import warnings
from pathlib import Path

import numpy as np
import pytest

import tierserve.trainer as hugectr
from tierserve.core.compat import HugeCTRCompatibilityWarning, reset_warnings
from tierserve.core.errors import ConfigError
from tierserve.model.device import is_gpu, select_xp
from tierserve.ps.sparse_file import read_sparse_model
from tierserve.trainer.hugectr.session import FILES
from tierserve.trainer.hugectr.solver import NOT_HONOURED, solver_default, solver_from_clause

SLOTS = [40, 30]
EVAL_ROWS = 512


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("solver")
    hugectr.DataGenerator(hugectr.DataGeneratorParams(
        format=hugectr.DataReaderType_t.Norm, label_dim=1, dense_dim=3, num_slot=len(SLOTS),
        i64_input_key=True, source=str(root / "file_list.txt"),
        eval_source=str(root / "file_list_test.txt"), slot_size_array=SLOTS,
        nnz_array=[1, 1], num_files=1, eval_num_files=1, num_samples_per_file=EVAL_ROWS,
    )).generate()  # fmt: skip
    return root


@pytest.fixture(autouse=True)
def _quiet(monkeypatch):
    monkeypatch.setenv("TIERSERVE_NO_PROGRESS", "1")
    monkeypatch.setenv("TIERSERVE_FORCE_CPU", "1")


def _fields(cls) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


class CountingModel(hugectr.Model):
    """A Model that counts the evaluation batches it runs."""

    evals = 0

    def eval(self, *args, **kwargs):
        self.evals += 1
        return super().eval(*args, **kwargs)


def _model(data: Path, model_cls=hugectr.Model, quiet=True, **solver) -> hugectr.Model:
    settings = dict(batchsize=32, batchsize_eval=16, max_eval_batches=3, i64_input_key=True)
    # (the data's keys are 64-bit: i64_input_key=True here)
    s = hugectr.CreateSolver(**{**settings, **solver})
    reader = hugectr.DataReaderParams(
        data_reader_type=hugectr.DataReaderType_t.Norm, source=[str(data / "file_list.txt")],
        eval_source=str(data / "file_list_test.txt"), check_type=hugectr.Check_t.Sum)
    model = model_cls(s, reader, hugectr.CreateOptimizer(optimizer_type=hugectr.Optimizer_t.Adam))
    model.add(hugectr.Input(label_dim=1, label_name="label", dense_dim=3, dense_name="dense",
                            data_reader_sparse_param_array=[
                                hugectr.DataReaderSparseParam("cat", 1, True, len(SLOTS))]))
    model.add(hugectr.SparseEmbedding(
        embedding_type=hugectr.Embedding_t.DistributedSlotSparseEmbeddingHash,
        workspace_size_per_gpu_in_mb=1, embedding_vec_size=4, combiner="sum",
        sparse_embedding_name="emb", bottom_name="cat"))
    d, lt = hugectr.DenseLayer, hugectr.Layer_t
    model.add(d(layer_type=lt.Reshape, bottom_names=["emb"], top_names=["r"], leading_dim=8))
    model.add(d(layer_type=lt.Concat, bottom_names=["r", "dense"], top_names=["c"]))
    model.add(d(layer_type=lt.InnerProduct, bottom_names=["c"], top_names=["fc"], num_output=1))
    model.add(d(layer_type=lt.BinaryCrossEntropyLoss, bottom_names=["fc", "label"],
                top_names=["loss"]))
    with warnings.catch_warnings():
        if quiet:
            warnings.simplefilter("ignore", UserWarning)
        model.compile()
    return model


# -- CreateSolver ---------------------------------------------------------------------------


def _evaluated(model) -> int:
    model._evaluate()
    return model.evals


def _graph_solver(model, tmp_path: Path) -> dict:
    path = tmp_path / "graph.json"
    model.graph_to_json(str(path))
    return json.loads(path.read_text())["solver"]


#: Each solver setting, a value other than its default, and what the object that uses it
#: holds (``probe(model, tmp_path)``).  CPU-only runs cannot see where the device and
#: mixed-precision settings go; those are checked on a GPU, and warn on the CPU.
CONSUMERS = {
    "model_name": ("ctr_model", lambda m, t: _graph_solver(m, t)["model_name"]),
    "seed": (4321, lambda m, t: m.tables[0].seed),
    "lr": (0.25, lambda m, t: m._scheduler.base_lr),
    "warmup_steps": (7, lambda m, t: m._scheduler.warmup_steps),
    "decay_start": (11, lambda m, t: m._scheduler.decay_start),
    "decay_steps": (13, lambda m, t: m._scheduler.decay_steps),
    "decay_power": (2.5, lambda m, t: m._scheduler.decay_power),
    "end_lr": (0.125, lambda m, t: m._scheduler.end_lr),
    "max_eval_batches": (5, lambda m, t: _evaluated(m)),
    "batchsize_eval": (24, lambda m, t: m._eval_reader.reader.batch_size),
    "batchsize": (48, lambda m, t: m._train_reader.reader.batch_size),
    "repeat_dataset": (False, lambda m, t: m._train_reader.reader.repeat_dataset),
    "metrics_spec": ({hugectr.MetricsType.AUC: 0.5},
                     lambda m, t: {hugectr.MetricsType[k]: v
                                   for k, v in m._metrics.thresholds.items()}),
    "i64_input_key": (True, lambda m, t: m._train_reader.reader.i64_input_key),
}
ON_A_GPU = {
    "vvgpu": ([[0]], lambda m, t: [[m.xp.cuda.Device().id]]),
    "use_mixed_precision": (True, lambda m, t: m.mixed),
    "scaler": (512.0, lambda m, t: m.loss_scale),
}
#: Accepted with one value only (HugeCTR has one): others are refused.
ONE_VALUE = {"lr_policy": hugectr.LrPolicy_t.fixed}


def test_every_solver_setting_has_a_consumer():
    walked = set(CONSUMERS) | set(ON_A_GPU) | set(NOT_HONOURED) | set(ONE_VALUE) | {"is_dlrm"}
    assert walked == set(_fields(hugectr.Solver)), "a solver setting nothing is known to read"
    for name, (value, _) in {**CONSUMERS, **ON_A_GPU}.items():
        assert value != solver_default(name) or name == "vvgpu", name  # one GPU: [[0]]


@pytest.mark.parametrize("name", sorted(CONSUMERS))
def test_a_solver_setting_arrives_unchanged(name, data, tmp_path):
    value, probe = CONSUMERS[name]
    model = _model(data, CountingModel, **{name: value})
    assert model.solver.__dict__[name] == value
    arrived = probe(model, tmp_path)
    assert arrived == value and type(arrived) is type(value), (name, arrived)


def test_the_schedule_takes_fractions_as_given(data):
    model = _model(data, lr=0.5, decay_power=1.5, end_lr=0.0625, warmup_steps=1,
                   decay_start=1, decay_steps=4)
    rates = [model._scheduler.lr_at(step) for step in range(1, 7)]
    assert rates == [0.5, 0.5 * 0.75**1.5, 0.5 * 0.5**1.5, max(0.5 * 0.25**1.5, 0.0625),
                     0.0625, 0.0625]  # fmt: skip


@pytest.mark.skipif(not is_gpu(select_xp([[0]], warn=False)), reason="needs a GPU")
@pytest.mark.parametrize("name", sorted(ON_A_GPU))
def test_a_device_setting_arrives_unchanged_on_a_gpu(name, data, tmp_path, monkeypatch):
    monkeypatch.delenv("TIERSERVE_FORCE_CPU")
    value, probe = ON_A_GPU[name]
    extra = {"use_mixed_precision": True} if name == "scaler" else {}
    model = _model(data, **{name: value}, **extra)
    assert probe(model, tmp_path) == value


def test_mixed_precision_on_the_cpu_says_it_computes_in_float32(data):
    with pytest.warns(UserWarning, match="use_mixed_precision: the CPU computes in float32"):
        model = _model(data, quiet=False, use_mixed_precision=True, scaler=512.0)
    assert (model.mixed, model.loss_scale) == (False, 1.0) or is_gpu(model.xp)


@pytest.mark.parametrize("name", sorted(NOT_HONOURED) + ["is_dlrm"])
def test_a_setting_without_effect_warns_naming_itself(name):
    value = solver_default(name)
    other = (not value if isinstance(value, bool) else value + 1 if isinstance(value, int)
             else next(m for m in type(value) if m is not value))  # fmt: skip
    reset_warnings()
    with pytest.warns(HugeCTRCompatibilityWarning, match=name):
        hugectr.CreateSolver(**{name: other})


def test_lr_policy_takes_only_fixed():
    assert hugectr.CreateSolver(lr_policy="fixed").lr_policy is hugectr.LrPolicy_t.fixed
    with pytest.raises(ConfigError, match="lr_policy"):
        hugectr.CreateSolver(lr_policy="step")


# -- the graph JSON's solver clause ---------------------------------------------------------


def test_a_written_solver_clause_reads_back_as_the_same_solver(data, tmp_path):
    given = {name: value for name, (value, _) in CONSUMERS.items()}
    model = _model(data, **given)
    clause = _graph_solver(model, tmp_path)
    assert solver_from_clause(clause) == model.solver


def test_hugectrs_older_json_spellings_convert():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        solver = solver_from_clause({
            "lr_policy": "fixed", "batchsize": 64, "batchsize_eval": 32, "max_eval_samples": 100,
            "mixed_precision": 256, "input_key_type": "I64", "gpu": [1, 2],
            "eval_metrics": ["AUC:0.75", "AverageLoss"], "algorithm_search": False,
            "cuda_graph": False,
        })  # fmt: skip
    assert (solver.batchsize, solver.batchsize_eval, solver.max_eval_batches) == (64, 32, 3)
    assert (solver.use_mixed_precision, solver.scaler, solver.i64_input_key) == (True, 256.0, True)
    assert solver.vvgpu == [[1, 2]]
    assert solver.metrics_spec == {hugectr.MetricsType.AUC: 0.75,
                                   hugectr.MetricsType.AverageLoss: 0.0}
    assert (solver.use_algorithm_search, solver.use_cuda_graph) == (False, False)


def test_a_solver_clause_names_what_it_does_not_take():
    with pytest.raises(ConfigError, match=r"unknown keys \['batch_size'\]"):
        solver_from_clause({"batch_size": 64})
    reset_warnings()
    with pytest.warns(HugeCTRCompatibilityWarning, match="display, max_iter"):
        solver_from_clause({"display": 100, "max_iter": 1000})


def test_get_learning_rate_scheduler_reads_the_clause_with_the_solvers_defaults(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"solver": {"lr": 0.5, "end_lr": 0.25}, "layers": []}))
    scheduler = hugectr.get_learning_rate_scheduler(str(path))
    assert (scheduler.base_lr, scheduler.end_lr) == (0.5, 0.25)
    for name in ("warmup_steps", "decay_start", "decay_steps", "decay_power"):
        assert getattr(scheduler, name) == solver_default(name)


# -- solver_parser_helper and Session -------------------------------------------------------


def test_solver_parser_defaults_are_the_solvers():
    parser = hugectr.solver_parser_helper()
    for name in _fields(hugectr.SolverParser):
        if name not in FILES:
            assert getattr(parser, name) == solver_default(name), name


@pytest.fixture(scope="module")
def trained(data, tmp_path_factory):
    """A config JSON and the files of a model trained a few steps (to start a Session from)."""
    root = tmp_path_factory.mktemp("trained")
    model = _model(data, model_name="m", lr=0.01)
    for _ in range(4):
        model.train()
    model.graph_to_json(str(root / "config.json"))
    model.save_params_to_files(str(root / "m"), 4)
    files = {
        "model_file": str(next(root.glob("m_dense_4.model"))),
        "dense_opt_states_file": str(next(root.glob("m_opt_dense_4.model"))),
        "embedding_files": [str(next(root.glob("m0_sparse_4.model")))],
        "sparse_opt_states_file": [str(next(root.glob("m0_opt_sparse_4.model")))],
    }
    return root, files


def _saved(prefix: Path) -> dict:
    """What a Session's model writes: dense and optimizer bytes, the sparse rows by key."""
    root = prefix.parent
    out = {p.name.replace(prefix.name, ""): p.read_bytes() for p in root.iterdir()
           if p.name.startswith(prefix.name) and p.is_file()}  # fmt: skip
    for folder in (p for p in root.iterdir() if p.name.startswith(prefix.name) and p.is_dir()):
        if "_opt_" in folder.name:
            out[folder.name.replace(prefix.name, "")] = {
                f.name: f.read_bytes() for f in sorted(folder.iterdir())}
            continue
        table = read_sparse_model(folder)
        order = np.argsort(np.asarray(table.keys))
        out[folder.name.replace(prefix.name, "")] = (np.asarray(table.keys)[order].tolist(),
                                                     np.asarray(table.embeddings)[order].tolist())
    return out


#: solver_parser_helper's solver settings, each with a value other than its default.
PARSER_VALUES = {"seed": 99, "max_eval_batches": 4, "batchsize_eval": 8, "batchsize": 16,
                 "vvgpu": [[0]], "use_mixed_precision": True, "enable_tf32_compute": True,
                 "scaler": 128.0, "i64_input_key": True, "use_algorithm_search": False,
                 "use_cuda_graph": False, "repeat_dataset": False}  # fmt: skip


def test_every_solver_parser_field_reaches_the_session(trained, tmp_path):
    root, files = trained
    assert set(PARSER_VALUES) | set(FILES) == set(_fields(hugectr.SolverParser))
    values = {**PARSER_VALUES, "vvgpu": [[0, 1]]}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        parser = hugectr.solver_parser_helper(**values, **files)
        session = hugectr.Session(parser, str(root / "config.json"))
    solver = session.model.solver
    for name, value in values.items():
        assert getattr(solver, name) == value, name
        assert type(getattr(solver, name)) is type(value), name
    assert solver.model_name == "m"  # from the config's solver clause
    # the files: what the session's model writes back is what it loaded
    session.download_params_to_files(str(tmp_path / "m"), 4)
    assert _saved(tmp_path / "m") == _saved(root / "m")


def test_session_evaluation_and_model_evaluation_read_the_same_setting(trained, tmp_path):
    root, _ = trained
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        parser = hugectr.solver_parser_helper(batchsize=16, batchsize_eval=8,
                                              max_eval_batches=3, i64_input_key=True)
        session = hugectr.Session(parser, str(root / "config.json"))
    parser.max_eval_batches = 50  # the Session's solver took its copy at construction
    preds, labels = tmp_path / "p.txt", tmp_path / "l.txt"
    session.evaluation(str(preds), str(labels))
    assert np.loadtxt(preds).size == 3 * 8 == session.model.solver.max_eval_batches * 8
