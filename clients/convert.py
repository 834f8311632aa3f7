"""``tierserve convert``: turn a Criteo Kaggle CSV/TSV click log into a Norm or Parquet dataset.

Writes the train split (the first ``--train-rows`` rows) and the eval split (the rest), their
file lists, and ``slot_size_array.json`` with the slot sizes and the reader settings to use.
"""

from __future__ import annotations

import argparse


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "convert",
        help="convert a Criteo Kaggle CSV/TSV file into Norm or Parquet training data",
        description=__doc__,
    )
    parser.add_argument("input", help="Criteo CSV or TSV file (label, I1..I13, C1..C26)")
    parser.add_argument("output", help="output folder")
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
