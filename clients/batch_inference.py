"""``tierserve predict`` and ``tierserve evaluate``: run a saved model over a data file.

The model is a version folder (the graph JSON, the ``*_dense_*.model`` file and the
``*_sparse_*.model`` folders that training wrote), or a model folder whose highest numbered
version is used.  The data is a Norm or Parquet file list, a Raw file, or a Criteo CSV/TSV
file (converted on the fly; give the same ``--hash-buckets`` as the training conversion).

Keys are 64-bit or 32-bit (HugeCTR's i64_input_key): ``--key-bits auto`` (the default) takes
the width the model was trained with (its graph JSON's solver), else the one a Norm file's
first records decode with, or a Parquet file's key column type, else 64.

Examples:
  tierserve predict  --model repo/dlrm --data data/eval/_file_list.txt --output preds.txt
  tierserve evaluate --model repo/dlrm/1 --data day_23.tsv --format criteo --hash-buckets 100000
"""

from __future__ import annotations

import argparse
import re
import tempfile
from pathlib import Path

FORMATS = ["norm", "raw", "parquet", "criteo"]


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        required=True,
        metavar="DIR",
        help="a model version folder, or a model folder (latest version)",
    )
    parser.add_argument(
        "--data",
        required=True,
        metavar="PATH",
        help="Norm/Parquet file list, Raw file, or Criteo CSV/TSV file",
    )
    parser.add_argument(
        "--format", choices=FORMATS, default="norm", help="data format (default norm)"
    )
    parser.add_argument(
        "--check",
        choices=["auto", "Sum", "Non"],
        default="auto",
        help="Norm checksum mode (default: what the file header says)",
    )
    parser.add_argument(
        "--slot-size-array",
        type=int,
        nargs="*",
        default=None,
        help="slot cardinalities (Parquet with slot-local keys)",
    )
    parser.add_argument(
        "--hash-buckets",
        type=int,
        default=None,
        help="Criteo only: keys per slot of the training conversion",
    )
    parser.add_argument(
        "--key-bits",
        choices=["auto", "32", "64"],
        default="auto",
        help="key width of the model and data: 32 (HugeCTR's i64_input_key=False) or 64 "
        "(default auto: from the model's graph JSON, else the data file)",
    )
    parser.add_argument(
        "--batch-size", type=int, default=4096, help="rows per batch (default 4096)"
    )
    parser.add_argument("--max-rows", type=int, default=None, help="stop after this many rows")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def register(commands: argparse._SubParsersAction) -> None:
    predict = commands.add_parser(
        "predict", help="write a model's predictions for a data file",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    _common(predict)
    predict.add_argument(
        "--output",
        required=True,
        metavar="FILE",
        help="predictions: text, one row per sample (.npy: a numpy array)",
    )
    predict.set_defaults(run=run_predict)
    evaluate = commands.add_parser(
        "evaluate", help="AUC and log loss of a model on a labelled data file",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    _common(evaluate)
    evaluate.set_defaults(run=run_evaluate)


_SPARSE = re.compile(r"^(?!.*_opt_).*?(\d+)_sparse_\d+\.model$")
_DENSE = re.compile(r"^(?!.*_opt_).*_dense_\d+\.model$")


def model_files(path: str | Path) -> tuple[Path, Path, list[Path]]:
    """(graph, dense file, sparse folders) of a version folder or a model folder's latest."""
    from tierserve.core.errors import ConfigError
    from tierserve.model.version_folder import version_numbers

    folder = Path(path)
    if not folder.is_dir():
        raise ConfigError(f"--model {folder} is not a folder")
    versions = version_numbers(folder)
    if versions and not list(folder.glob("*.json")):
        folder = folder / str(versions[-1])
    graphs = sorted(folder.glob("*.json"))
    dense = sorted(p for p in folder.iterdir() if _DENSE.match(p.name))
    sparse = sorted((p for p in folder.iterdir() if p.is_dir() and _SPARSE.match(p.name)),
                    key=lambda p: int(_SPARSE.match(p.name).group(1)))  # fmt: skip
    if len(graphs) != 1 or len(dense) != 1 or not sparse:
        raise ConfigError(
            f"{folder} must hold one graph JSON, one *_dense_<iter>.model file and the "
            f"*_sparse_<iter>.model folders; found {len(graphs)}, {len(dense)}, {len(sparse)}"
        )
    return graphs[0], dense[0], sparse


def key_bits(args: argparse.Namespace, graph_path: Path) -> int:
    """The key width ``--key-bits`` names, or (auto) the model's or the data's."""
    if args.key_bits != "auto":
        return int(args.key_bits)
    import json

    try:
        solver = json.loads(Path(graph_path).read_text()).get("solver") or {}
    except (OSError, ValueError):
        solver = {}
    if "i64_input_key" in solver:
        return 64 if solver["i64_input_key"] else 32
    from tierserve.model.graph_json import load_graph_json
    from tierserve.model.inference_graph import label_layout
    from tierserve.trainer.data.filelist import read_file_list

    if args.format == "norm":
        from tierserve.trainer.data.norm import detect_key_bits, read_norm_header

        files = read_file_list(args.data)
        if files:
            data = load_graph_json(graph_path).data_layer
            header = read_norm_header(files[0])
            bits = detect_key_bits(
                files[0], sum(label_layout(data)[1]), int((data.get("dense") or {}).get(
                    "dense_dim", 0)), int(header["slot_num"]),
                "Sum" if header["error_check"] else "Non",
            )  # fmt: skip
            if bits is not None:
                return bits
    elif args.format == "parquet":
        import pyarrow.parquet as pq

        files = read_file_list(args.data)
        if files:
            types = {str(f.type) for f in pq.read_schema(files[0])}
            if types & {"int32", "uint32"} and not types & {"int64", "uint64"}:
                return 32
    return 64


def open_model(args: argparse.Namespace):
    """An InferenceModel over ``--model`` with an in-process hash map tier."""
    from tierserve.server.inference_model import InferenceModel, InferenceParams

    graph, dense, sparse = model_files(args.model)
    bits = key_bits(args, graph)
    params = InferenceParams(
        model_name=re.sub(r"[^A-Za-z0-9_-]", "_", graph.stem)[:120] or "model",
        max_batchsize=args.batch_size, hit_rate_threshold=0.9,
        dense_model_file=str(dense), sparse_model_files=[str(p) for p in sparse],
        use_gpu_embedding_cache=False, cache_size_percentage=0.5, i64_input_key=bits == 64,
        volatile_db={"type": "hash_map"},
    )  # fmt: skip
    return InferenceModel(str(graph), params)


def _source(args: argparse.Namespace, workdir: str) -> tuple[str, str, str]:
    """(source, reader type, check type) of ``--data``."""
    from tierserve.core.errors import ConfigError

    if args.format == "criteo":
        if args.hash_buckets is None:
            raise ConfigError("--format criteo needs --hash-buckets (as used for training)")
        from tierserve.trainer.data.criteo import convert_criteo

        conv = convert_criteo(args.data, workdir, format="Norm", hash_buckets=args.hash_buckets,
                              progress=not args.no_progress)  # fmt: skip
        return conv.train_source, "Norm", conv.check_type
    kind = {"norm": "Norm", "raw": "Raw", "parquet": "Parquet"}[args.format]
    check = args.check
    if check == "auto":
        check = "Non"
        if kind == "Norm":
            from tierserve.trainer.data.filelist import read_file_list
            from tierserve.trainer.data.norm import read_norm_header

            files = read_file_list(args.data)
            if files and read_norm_header(files[0]).get("error_check"):
                check = "Sum"
    return args.data, kind, check


def total_rows(source: str, kind: str) -> int | None:
    """The rows of a Norm or Parquet file list (None for Raw: its record size is the
    model's)."""
    from tierserve.trainer.data.filelist import read_file_list

    if kind == "Norm":
        from tierserve.trainer.data.norm import norm_num_records

        return sum(norm_num_records(f) for f in read_file_list(source))
    if kind == "Parquet":
        from tierserve.trainer.data.parquet import parquet_num_rows

        return sum(parquet_num_rows(f) for f in read_file_list(source))
    return None


def _batches(args: argparse.Namespace, model, workdir: str):
    from tierserve.trainer.hugectr.inference_data import epoch_batches
    from tierserve.trainer.progress import progress_bar

    source, kind, check = _source(args, workdir)
    rows = 0
    total = total_rows(source, kind)
    if args.max_rows is not None:
        total = args.max_rows if total is None else min(total, args.max_rows)
    bar = progress_bar(total=total, unit="rows", desc=args.command, disable=args.no_progress)
    try:
        for batch in epoch_batches(model.graph, source, kind, check, args.slot_size_array,
                                   args.batch_size, model.i64_input_key):  # fmt: skip
            if args.max_rows is not None and rows >= args.max_rows:
                break
            yield batch
            rows += batch.batch_size
            bar.update(batch.batch_size)
    finally:
        bar.close()


def run_predict(args: argparse.Namespace) -> int:
    import numpy as np

    model = open_model(args)
    try:
        with tempfile.TemporaryDirectory() as workdir:
            parts = [model.predict_batch(b) for b in _batches(args, model, workdir)]
    finally:
        model.close()
    preds = np.concatenate(parts) if parts else np.zeros((0, model.label_dim), np.float32)
    if args.max_rows is not None:
        preds = preds[: args.max_rows]
    if args.output.endswith(".npy"):
        np.save(args.output, preds)
    else:
        np.savetxt(args.output, preds, fmt="%.7g")
    print(f"wrote {preds.shape[0]} predictions to {args.output}")
    return 0


def run_evaluate(args: argparse.Namespace) -> int:
    import numpy as np

    from tierserve.trainer.evaluation import auc, logloss

    model = open_model(args)
    preds, labels = [], []
    try:
        with tempfile.TemporaryDirectory() as workdir:
            for b in _batches(args, model, workdir):
                preds.append(model.predict_batch(b))
                labels.append(b.label)
    finally:
        model.close()
    if not preds:
        print("no rows read")
        return 1
    p, y = np.concatenate(preds), np.concatenate(labels)
    print(f"rows {p.shape[0]}  AUC {auc(y, p):.6f}  logloss {logloss(y, p):.6f}")
    return 0
