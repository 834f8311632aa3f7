"""``tierserve triton-repo`` writes config.pbtxt from each model's graph and ps.json, version
folders Triton's poll mode sees appear whole, and settings it cannot honour are refused.
(tests/integration/test_server_triton_backend.py serves what it writes from tritonserver.)"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from tierserve.clients.cli import main
from tierserve.clients.demo_model import SLOT_SIZES
from tierserve.clients.triton_repo import MODEL_PY, generate
from tierserve.core.errors import ConfigError
from tierserve.model import manifest


@pytest.fixture(scope="module")
def tiny_dlrm(tmp_path_factory):
    import warnings

    from tierserve.clients.demo_model import train_demo_model

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no GPU: the trainer says so
        return train_demo_model(tmp_path_factory.mktemp("tiny") / "train", iterations=4,
                                batch_size=64, num_samples=1024)  # fmt: skip


@pytest.fixture
def repo(tiny_dlrm, tmp_path):
    """The tiny DLRM (64-bit keys) plus an embedding store over its table, hash map only."""
    from tierserve.clients.demo_model import write_repository

    repo = tmp_path / "repo"
    write_repository(tiny_dlrm, repo, max_batch_size=64)
    config = json.loads((repo / "ps.json").read_text())
    del config["persistent_db"]
    store = repo / "store" / "1"
    store.mkdir(parents=True)
    sparse = next((repo / "dlrm" / "1").glob("*_sparse_*.model"))
    (store / sparse.name).symlink_to(sparse)
    config["models"].append(dict(config["models"][0], model="store", dense_file="",
                                 network_file=""))  # fmt: skip
    (repo / "ps.json").write_text(json.dumps(config))
    return repo


def _tensors(text: str, section: str) -> dict[str, tuple[str, str]]:
    block = re.search(rf"^{section} \[\n(.*?)\n\]", text, re.S | re.M).group(1)
    return {
        m.group(1): (m.group(2), m.group(3).replace(" ", ""))
        for m in re.finditer(r'name: "(\w+)" data_type: (\w+) dims: \[ ([-\d, ]+) \]', block)
    }


def test_configs_follow_graph_and_ps_json(repo, tmp_path):
    out = tmp_path / "triton"
    results = {r.model: r for r in generate(repo, out, instances=2, max_queue_delay_us=250,
                                            site_packages="/opt/site")}  # fmt: skip
    assert set(results) == {"dlrm", "store"}
    dlrm = (out / "dlrm" / "config.pbtxt").read_text()
    assert _tensors(dlrm, "input") == {"DES": ("TYPE_FP32", "13"),
                                       "CATCOLUMN": ("TYPE_INT64", str(len(SLOT_SIZES)))}  # fmt: skip
    assert _tensors(dlrm, "output") == {"OUTPUT0": ("TYPE_FP32", "1")}
    assert "max_batch_size: 64\n" in dlrm
    assert "dynamic_batching { max_queue_delay_microseconds: 250 }" in dlrm
    assert "instance_group [ { kind: KIND_CPU count: 2 } ]" in dlrm
    assert "version_policy: { latest: { num_versions: 1 } }" in dlrm
    assert f'string_value: "{repo.resolve() / "ps.json"}"' in dlrm
    assert 'key: "site_packages" value: { string_value: "/opt/site" }' in dlrm
    store = (out / "store" / "config.pbtxt").read_text()
    assert _tensors(store, "input") == {"KEYS": ("TYPE_INT64", "-1"),
                                        "NUMKEYS": ("TYPE_INT32", "1")}  # one table  # fmt: skip
    assert _tensors(store, "output") == {"OUTPUT0": ("TYPE_FP32", "-1")}
    assert "max_batch_size: 0\n" in store and "dynamic_batching" not in store
    version = out / "dlrm" / "1"
    assert (version / "model.py").read_text() == MODEL_PY
    for item in (repo / "dlrm" / "1").iterdir():
        assert (version / item.name).is_symlink()
        assert os.path.samefile(version / item.name, item)


def test_32_bit_keys_and_gpu_kind(repo, tmp_path):
    config = json.loads((repo / "ps.json").read_text())
    config["supportlonglong"] = False
    (repo / "ps.json").write_text(json.dumps(config))
    generate(repo, tmp_path / "t", models=["dlrm"], kind="gpu", site_packages="")
    text = (tmp_path / "t" / "dlrm" / "config.pbtxt").read_text()
    assert _tensors(text, "input")["CATCOLUMN"][0] == "TYPE_INT32"
    assert "kind: KIND_GPU" in text and "site_packages" not in text
    assert not (tmp_path / "t" / "store").exists()


def test_a_new_version_appears_whole_and_the_config_stays(repo, tmp_path):
    out = tmp_path / "triton"
    generate(repo, out)
    before = (out / "dlrm" / "config.pbtxt").stat().st_mtime_ns
    import shutil

    shutil.copytree(repo / "dlrm" / "1", repo / "dlrm" / "2")
    [dlrm, _] = generate(repo, out)
    assert dlrm.new_versions == ["2"] and not dlrm.config_changed
    assert (out / "dlrm" / "config.pbtxt").stat().st_mtime_ns == before
    assert (out / "dlrm" / "2" / "model.py").is_file()
    assert sorted(p.name for p in (out / "dlrm").iterdir()) == ["1", "2", "config.pbtxt"]
    # Version 2 gone from the repository: its Triton folder goes; one we did not make stays.
    shutil.rmtree(repo / "dlrm" / "2")
    (out / "dlrm" / "7").mkdir()
    [dlrm, _] = generate(repo, out)
    assert dlrm.removed_versions == ["2"]
    assert sorted(p.name for p in (out / "dlrm").iterdir()) == ["1", "7", "config.pbtxt"]


def test_copy_instead_of_links(repo, tmp_path):
    generate(repo, tmp_path / "t", models=["dlrm"], copy=True)
    files = list((tmp_path / "t" / "dlrm" / "1").iterdir())
    assert files and not any(p.is_symlink() for p in files)


def test_refusals_name_what_is_wrong(repo, tmp_path):
    with pytest.raises(ConfigError, match="'nope' is not a model"):
        generate(repo, tmp_path / "t", models=["nope"])
    with pytest.raises(ConfigError, match="--out"):
        generate(repo, repo / "triton")
    with pytest.raises(ConfigError, match="--instances"):
        generate(repo, tmp_path / "t", instances=0)
    with pytest.raises(ConfigError, match="--max-queue-delay-us"):
        generate(repo, tmp_path / "t", max_queue_delay_us=-1)
    config = json.loads((repo / "ps.json").read_text())
    config["persistent_db"] = {"type": "rocks_db", "path": str(tmp_path / "rdb")}
    (repo / "ps.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="--ps-json .* is a writable rocks_db"):
        generate(repo, tmp_path / "t", ps_json=repo / "ps.json")  # named: refused
    config["persistent_db"]["read_only"] = True
    (repo / "ps.json").write_text(json.dumps(config))
    generate(repo, tmp_path / "t")  # a read-only RocksDB can be opened by every process
    pbtxt = (tmp_path / "t" / "dlrm" / "config.pbtxt").read_text()
    assert f'string_value: "{repo.resolve() / "ps.json"}"' in pbtxt


def test_a_writable_rocksdb_gives_the_triton_models_a_ps_json_without_it(repo, tmp_path):
    """As the demo writes it (hash map in front of a writable RocksDB): served out of the
    box, every model process with the whole tables in its hash map."""
    from tierserve.ps.config import load_ps_config

    config = json.loads((repo / "ps.json").read_text())
    config["volatile_db"] = {"type": "hash_map", "initial_cache_rate": 0.25}
    config["persistent_db"] = {"type": "rocks_db", "path": str(tmp_path / "rdb")}
    (repo / "ps.json").write_text(json.dumps(config))
    out = tmp_path / "t"
    [first, _] = generate(repo, out)
    assert first.ps_json_note and "writable rocks_db" in first.ps_json_note
    derived = load_ps_config(out / "ps.json")
    assert derived.persistent_db.type.value == "disabled"
    assert derived.volatile_db.type.value == "hash_map"
    assert derived.volatile_db.initial_cache_rate == 1.0
    assert [m.model for m in derived.models] == ["dlrm", "store"]
    assert Path(derived.model("dlrm").dense_file).is_file()  # absolute: the file moved
    pbtxt = (out / "dlrm" / "config.pbtxt").read_text()
    assert f'string_value: "{out.resolve() / "ps.json"}"' in pbtxt


def test_versions_of_different_shapes_are_refused(repo, tmp_path):
    import shutil

    shutil.copytree(repo / "dlrm" / "1", repo / "dlrm" / "2")
    graph = next((repo / "dlrm" / "1").glob("dlrm.json"))
    data = json.loads(graph.read_text())
    data["layers"][0]["dense"]["dense_dim"] = 12
    graph.write_text(json.dumps(data))
    (repo / "dlrm" / "1" / manifest.MANIFEST).unlink()  # it would refuse the edit
    with pytest.raises(ConfigError, match="version 1's inputs differ from version 2's"):
        generate(repo, tmp_path / "t", models=["dlrm"])
    data["layers"][0]["dense"]["dense_dim"] = 0  # Triton has no zero-width dimension
    graph.write_text(json.dumps(data))
    shutil.rmtree(repo / "dlrm" / "2")
    with pytest.raises(
        ConfigError, match="model .dlrm. version 1: the graph.s Data layer has dense_dim 0"
    ):
        generate(repo, tmp_path / "t", models=["dlrm"])


def test_cli(repo, tmp_path, capsys):
    out = tmp_path / "t"
    assert main(["triton-repo", "--model-repository", str(repo), "--out", str(out),
                 "--models", "dlrm", "--max-queue-delay-us", "100"]) == 0  # fmt: skip
    printed = capsys.readouterr().out
    assert "dlrm: one-hot model, versions 1" in printed and "tritonserver" in printed
    assert main(["triton-repo", "--model-repository", str(repo), "--out", str(out),
                 "--models", "x"]) == 2  # fmt: skip
    assert "'x' is not a model" in capsys.readouterr().err


ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_PS_JSON = "/etc/tierserve/triton-ps.json"  # where the compose profile mounts it


def test_the_deploy_example_is_what_the_generator_writes(tiny_dlrm, tmp_path):
    """deploy/triton/example/ is the generator's output for the demo DLRM with run.sh's options."""
    import shutil

    from tierserve.clients.demo_model import write_repository

    write_repository(tiny_dlrm, tmp_path / "models")
    ps = tmp_path / "triton-ps.json"
    shutil.copy(ROOT / "deploy" / "triton" / "ps.json", ps)
    generate(tmp_path / "models", tmp_path / "out", site_packages="", ps_json=ps, copy=True)
    example = ROOT / "deploy" / "triton" / "example" / "dlrm"
    text = (tmp_path / "out" / "dlrm" / "config.pbtxt").read_text()
    assert (
        text.replace(str(ps.resolve()), EXAMPLE_PS_JSON) == (example / "config.pbtxt").read_text()
    )
    assert (example / "1" / "model.py").read_text() == MODEL_PY


def test_the_compose_profile_runs_the_generator_on_the_served_models():
    from tierserve.ps.config import load_ps_config

    compose = (ROOT / "docker-compose.yml").read_text()
    service = compose[compose.index("  tritonserver:\n") :]
    assert "dockerfile: deploy/triton/Dockerfile" in service
    assert f"./deploy/triton/ps.json:{EXAMPLE_PS_JSON}:ro" in service
    assert "./deploy/models:/models:ro" in service
    run = (ROOT / "deploy" / "triton" / "run.sh").read_text()
    assert "PS_JSON=${PS_JSON:-" + EXAMPLE_PS_JSON + "}" in run
    assert "MODELS=${MODELS:-/models}" in run and "tierserve triton-repo" in run
    triton = load_ps_config(ROOT / "deploy" / "triton" / "ps.json")
    served = load_ps_config(ROOT / "deploy" / "models" / "ps.json")
    assert triton.persistent_db.type.name == "disabled"  # the tierserve service holds RocksDB
    assert triton.volatile_db == served.volatile_db
    assert triton.update_source == served.update_source

    def entries(config):  # file paths resolve against each ps.json's folder: compare names
        return [
            m.model_dump(exclude={"sparse_files", "dense_file", "network_file"})
            | {"files": [Path(f).name for f in (*m.sparse_files, m.dense_file, m.network_file)]}
            for m in config.models
        ]

    assert entries(triton) == entries(served)
