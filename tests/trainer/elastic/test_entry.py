"""``tierserve train --conf module.TrainConf`` (DLRover's local entry): a conf with an
elastic train reader, an eval reader and an exporter trains, keeps its checkpoints, reports
every shard, evaluates and exports; refused settings are named."""

import json
import sys
import textwrap

import numpy as np
import pytest

from tierserve.clients.cli import main

estimator = pytest.importorskip("tierserve.trainer.estimator")
if not hasattr(estimator, "LinearRegressor"):
    pytest.skip("the Estimator is not there yet", allow_module_level=True)

CONF = '''
import numpy as np

from tierserve.trainer import estimator, feature_column
from tierserve.trainer.elastic import Column, ElasticReader


class LineReader(ElasticReader):
    """Records x,k,y with y = 2x + k."""

    def __init__(self, path=None, n=400):
        self.n = n
        super().__init__(path=path)

    def count_data(self):
        self._data_nums = self.n

    def read_data_by_index_range(self, start_index, end_index):
        i = np.arange(start_index, end_index)
        x, k = i / self.n, i % 3
        return [f"{a},{b},{2 * a + b}" for a, b in zip(x, k)]


class MyEstimator(estimator.LinearRegressor):
    def __init__(self, model_dir, config=None, params=None):
        super().__init__(
            [
                feature_column.numeric_column("x"),
                feature_column.categorical_column_with_identity("k", 3),
            ],
            model_dir=model_dir,
            config=config,
            optimizer=estimator.train.GradientDescentOptimizer(params["learning_rate"]),
        )


COLUMNS = (
    Column.create(name="x", dtype="float32", is_label=False),
    Column.create(name="k", dtype="int64", is_label=False),
    Column.create(name="y", dtype="float32", is_label=True),
)


class TrainConf:
    classifier_class = MyEstimator
    model_dir = "unused"
    batch_size = 20
    epoch = 30
    save_steps = 100
    keep_checkpoint_max = 2
    log_steps = 100
    eval_steps = 5
    params = {"learning_rate": 0.5}
    train_set = {"reader": LineReader("line://train"), "columns": COLUMNS}
    eval_set = {"reader": LineReader("line://eval", 100), "columns": COLUMNS}
    serving_input_receiver_fn = estimator.export.build_raw_serving_input_receiver_fn(
        {
            "x": estimator.export.placeholder("float32", [None, 1], name="x"),
            "k": estimator.export.placeholder("int64", [None, 1], name="k"),
        }
    )
'''


@pytest.fixture
def conf_module(tmp_path, monkeypatch):
    """Writes the conf as a module in a fresh folder (the entry imports from the cwd)."""
    names = []

    def write(name, extra=""):
        (tmp_path / f"{name}.py").write_text(CONF + textwrap.dedent(extra))
        names.append(name)
        return name

    monkeypatch.chdir(tmp_path)
    yield write
    for name in names:
        sys.modules.pop(name, None)


def test_local_entry_trains_evaluates_and_exports(tmp_path, conf_module, capsys):
    name = conf_module("entry_conf_ok")
    model_dir = tmp_path / "model"
    assert main(["train", "--conf", f"{name}.TrainConf", "--model-dir", str(model_dir)]) == 0
    conf = sys.modules[name].TrainConf
    # 30 epochs of 400 records in batches of 20; the newest two checkpoints kept
    assert sorted(p.name for p in model_dir.glob("model.ckpt-*")) == [
        "model.ckpt-500.npz",
        "model.ckpt-600.npz",
    ]
    client = conf.train_set["reader"].data_shard_client
    assert not client.report_on_fetch  # shards were reported by the hook, as trained on
    assert client.dispatcher.finished()
    assert sum(len(s) for s in client.dispatcher.completed) == 30 * 400
    metrics = capsys.readouterr().out
    assert "global_step" in metrics and "600" in metrics

    repo = model_dir / "export" / "latest"  # a model repository tierserve serve loads
    models = json.loads((repo / "ps.json").read_text())["models"]
    assert [m["model"] for m in models] == ["latest"]
    # Evaluations (and so exports) follow the time throttle: a slow run exports earlier too;
    # the newest version holds the final step.
    newest = max(int(p.name) for p in (repo / "latest").iterdir() if p.name.isdigit())
    assert (repo / "latest" / str(newest) / "latest_dense_600.model").is_file()

    trained = conf.classifier_class(str(model_dir), None, conf.params)
    x = np.array([0.1, 0.5, 0.9], dtype=np.float32)
    k = np.array([0, 1, 2])
    got = [float(np.ravel(p["predictions"])[0]) for p in trained.predict(lambda: {"x": x, "k": k})]
    np.testing.assert_allclose(got, 2 * x + k, atol=0.02)


@pytest.mark.parametrize(
    "extra,args,words",
    [
        ("TrainConf.enable_incr_saved_model = True\n", [], "enable_incr_saved_model"),
        ("TrainConf.batch_size = 0\n", [], "batch_size must be a positive int"),
        ("TrainConf.train_set = {'reader': None}\n", [], "train_set has no 'reader'"),
        ("", ["--platform", "Kubernetes"], "--platform 'Kubernetes'"),
        ("", ["--platform=local_kubernetes"], "DLRover's platform is not supported here"),
        ("", ["--platform=local", "--ps_num=2"], "without separate parameter-server"),
        ("", ["--worker_num=0"], "--worker_num must be at least 1"),
        ("del TrainConf.model_dir\n", ["--no-model-dir"], "no model_dir"),
    ],
)
def test_refused_settings_are_named(tmp_path, conf_module, capsys, extra, args, words):
    name = conf_module(f"entry_conf_bad{abs(hash(words))}", extra)
    argv = ["train", "--conf", f"{name}.TrainConf"]
    if "--no-model-dir" not in args:
        argv += ["--model-dir", str(tmp_path / "m")] + args
    assert main(argv) == 2
    assert words in capsys.readouterr().err


def test_a_conf_that_does_not_import_is_named(conf_module, capsys):
    assert main(["train", "--conf", "no_such_module.TrainConf"]) == 2
    assert "cannot import 'no_such_module'" in capsys.readouterr().err
    assert main(["train", "--conf", "TrainConf"]) == 2
    assert "module.Name" in capsys.readouterr().err
    # DLRover's form: python -m tierserve.trainer.elastic.entry --conf=...
    from tierserve.trainer.elastic import entry

    assert entry.main(["--conf=no_such_module.TrainConf", "--platform=local"]) == 2
    assert "cannot import 'no_such_module'" in capsys.readouterr().err


def _python_m(tmp_path, *args, timeout=300):
    """``python -m tierserve.trainer.elastic ARGS`` in ``tmp_path`` (DLRover's run.sh form)."""
    import os
    import subprocess

    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PMI_", "OMPI_", "PMIX_", "HYDRA_"))}
    env.update(TIERSERVE_NO_PROGRESS="1", OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "tierserve.trainer.elastic", *args],
                          cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=timeout)


def _steps(model_dir):
    from tierserve.trainer.estimator import checkpoint

    return checkpoint.step_of(checkpoint.latest_checkpoint(model_dir))


def test_dlrover_run_sh_arguments_run_one_worker_here(tmp_path, conf_module):
    name = conf_module("entry_conf_runsh", "TrainConf.epoch = 2\nTrainConf.eval_set = None\n"
                       "TrainConf.serving_input_receiver_fn = None\n")
    done = _python_m(tmp_path, "--platform=local", f"--conf={name}.TrainConf", "--ps_num=1",
                     "--worker_num=1", f"--model_dir={tmp_path / 'one'}")
    assert done.returncode == 0, done.stderr
    assert _steps(tmp_path / "one") == 40  # 2 epochs of 400 records, batches of 20


@pytest.mark.slow
def test_worker_num_runs_the_job_on_that_many_mpi_ranks(tmp_path, conf_module):
    import shutil
    from pathlib import Path

    pytest.importorskip("mpi4py")
    if not (Path(sys.executable).parent / "mpiexec").exists() and not shutil.which("mpiexec"):
        pytest.skip("needs mpiexec: pip install 'tierserve[mpi]'")
    name = conf_module("entry_conf_mpi", "TrainConf.epoch = 2\nTrainConf.eval_set = None\n"
                       "TrainConf.serving_input_receiver_fn = None\n")
    done = _python_m(tmp_path, "--platform=local", f"--conf={name}.TrainConf", "--ps_num=1",
                     "--worker_num=2", f"--model_dir={tmp_path / 'two'}")
    assert done.returncode == 0, done.stderr
    assert "starting 2 workers" in done.stderr
    assert _steps(tmp_path / "two") == 40  # the same global batches as one process
    one = _python_m(tmp_path, f"--conf={name}.TrainConf", f"--model_dir={tmp_path / 'one'}")
    assert one.returncode == 0, one.stderr
    from tierserve.trainer import feature_column as fc

    x = np.array([0.1, 0.5, 0.9], dtype=np.float32)
    got = {}
    for run in ("one", "two"):
        trained = estimator.LinearRegressor(
            [fc.numeric_column("x"), fc.categorical_column_with_identity("k", 3)],
            model_dir=str(tmp_path / run))
        got[run] = [float(np.ravel(p["predictions"])[0]) for p in
                    trained.predict(lambda: {"x": x, "k": np.array([0, 1, 2])})]
    np.testing.assert_allclose(got["two"], got["one"], rtol=1e-4)  # 2 ranks train as 1


def test_dlrover_default_logger_logs_in_dlrovers_format(capfd):
    from tierserve.trainer.elastic import default_logger
    from tierserve.trainer.elastic.log_util import default_logger as same

    assert default_logger is same and default_logger.name == "dlrover.trainer"
    default_logger.info("config is %s", {"a": 1})
    err = capfd.readouterr().err
    assert "[INFO][test_entry.py:" in err and "config is {'a': 1}" in err


NUMERIC_ONLY = '''
class NumericOnly(estimator.LinearRegressor):
    def __init__(self, model_dir, config=None, params=None):
        super().__init__([feature_column.numeric_column("x")], model_dir=model_dir,
                         config=config)


TrainConf.classifier_class = NumericOnly
TrainConf.serving_input_receiver_fn = estimator.export.build_raw_serving_input_receiver_fn(
    {"x": estimator.export.placeholder("float32", [None, 1], name="x")})
'''


def test_a_model_its_export_could_not_serve_is_refused_before_training(tmp_path, conf_module,
                                                                        capsys):
    """Only numeric columns: no embedding table, which tierserve serves none without; the
    conf is refused at once (exit 2, naming why), with no checkpoint written."""
    name = conf_module("entry_conf_numeric", NUMERIC_ONLY)
    model_dir = tmp_path / "m"
    assert main(["train", "--conf", f"{name}.TrainConf", "--model-dir", str(model_dir)]) == 2
    err = capsys.readouterr().err
    assert "no embedding table" in err and "before training" in err, err
    assert not list(model_dir.glob("model.ckpt-*"))
