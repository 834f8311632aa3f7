"""``tierserve convert``: turn a Criteo Kaggle CSV/TSV click log into a Norm or Parquet dataset,
or (``--storage-dtype``) a sparse model folder into the compact rows a table is served from.

Criteo: writes the train split (the first ``--train-rows`` rows) and the eval split (the
rest), their file lists, and ``slot_size_array.json`` with the slot sizes and the reader
settings to use.

Sparse models: ``tierserve convert --storage-dtype int8 SRC.model DST.model`` writes DST with
SRC's keys and its rows as ``storage_dtype`` stores them (``emb_vector.int8``), so a server
whose ``ps.json`` gives that ``storage_dtype`` loads them without converting.
"""

from __future__ import annotations

import argparse


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "convert",
        help="convert a Criteo Kaggle CSV/TSV file into Norm or Parquet training data",
        description=__doc__,
    )
    parser.add_argument(
        "input", help="Criteo CSV or TSV file (label, I1..I13, C1..C26), or with --storage-dtype "
        "a sparse model folder (key, emb_vector)"
    )
    parser.add_argument("output", help="output folder")
    parser.add_argument(
        "--storage-dtype", choices=["float16", "int8"], default=None,
        help="convert the sparse model folder INPUT into OUTPUT with rows stored as this "
        "(ps.json's storage_dtype) instead of converting Criteo data",
    )
    parser.add_argument(
        "--format", choices=["norm", "parquet"], default="norm", help="output format"
    )
    parser.add_argument(
        "--train-rows",
        type=int,
        default=None,
        help="the first N rows are training data, the rest evaluation data (default: all train)",
    )
    parser.add_argument(
        "--eval-rows", type=int, default=None, help="at most this many evaluation rows"
    )
    keys = parser.add_mutually_exclusive_group()
    keys.add_argument(
        "--hash-buckets",
        type=int,
        default=None,
        help="hash each slot's values into N keys (default: per-slot vocabularies)",
    )
    keys.add_argument(
        "--min-frequency",
        type=int,
        default=1,
        help="vocabulary mode: values seen fewer times in the train rows share one key",
    )
    parser.add_argument(
        "--dense-transform",
        choices=["log", "none"],
        default="log",
        help="log: log(1 + x) with negatives clipped to 0 (default); none: values as they are",
    )
    parser.add_argument(
        "--check-type", choices=["Sum", "Non"], default="Sum", help="Norm checksums"
    )
    parser.add_argument(
        "--i32-keys", action="store_true", help="Norm/Parquet keys as 32-bit (default 64-bit)"
    )
    parser.add_argument("--rows-per-file", type=int, default=262144, help="rows per data file")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.storage_dtype is not None:
        return _convert_rows(args)
    from pathlib import Path

    if (Path(args.input) / "key").is_file():
        raise SystemExit(
            f"tierserve convert: {args.input} is a sparse model folder; give --storage-dtype "
            "float16 or int8 to convert its rows"
        )
    from tierserve.trainer.data.criteo import convert_criteo

    result = convert_criteo(
        args.input,
        args.output,
        format="Norm" if args.format == "norm" else "Parquet",
        train_rows=args.train_rows,
        eval_rows=args.eval_rows,
        hash_buckets=args.hash_buckets,
        min_frequency=args.min_frequency,
        dense_transform=args.dense_transform,
        check_type=args.check_type,
        i64_input_key=not args.i32_keys,
        rows_per_file=args.rows_per_file,
        progress=not args.quiet,
    )
    print(
        f"wrote {result.train_rows} train rows ({result.train_source}) and {result.eval_rows} "
        f"eval rows ({result.eval_source}); slot sizes in {result.slot_size_file}"
    )
    return 0


def _convert_rows(args: argparse.Namespace) -> int:
    import sys

    from tierserve.core.errors import TierserveError
    from tierserve.ps.sparse_file import convert_sparse_model

    def progress(done: int, total: int) -> None:
        if not args.quiet:
            print(f"\r{args.input}: {done:,}/{total:,} rows", end="", file=sys.stderr, flush=True)

    try:
        out = convert_sparse_model(args.input, args.output, args.storage_dtype, progress=progress)
    except TierserveError as exc:
        raise SystemExit(f"tierserve convert: {exc}") from None
    if not args.quiet:
        print(file=sys.stderr)
    print(f"wrote {out} ({args.storage_dtype} rows)")
    return 0
