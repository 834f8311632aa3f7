"""``tierserve publish``: send the vectors of a sparse model folder to Kafka as online updates.

Every server whose ``ps.json`` names this Kafka ``update_source`` applies them to its tiers
(those whose ``update_filters`` match the model). Use it after retraining, to push the new
embeddings of a table without reloading the model:

    tierserve publish out/dlrm0_sparse_2000.model --model dlrm --table sparse_embedding1 \\
        --brokers kafka:9092
"""

from __future__ import annotations

import argparse
import sys

import numpy as np


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "publish",
        help="publish a sparse model folder's embeddings to Kafka as online updates",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("sparse", help="sparse model folder (key and emb_vector files)")
    parser.add_argument("--model", required=True, help="model name, as in ps.json")
    parser.add_argument("--table", required=True, help="embedding table name, as in ps.json")
    parser.add_argument(
        "--brokers", default="127.0.0.1:9092", help="Kafka brokers, host:port[;host:port...]"
    )
    parser.add_argument(
        "--max-batch-size", type=int, default=1000, help="keys per message (HugeCTR: 1000)"
    )
    parser.add_argument(
        "--timeout", type=float, default=30.0, metavar="S",
        help="how long to wait for the brokers to acknowledge every message (default 30)",
    )  # fmt: skip
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import time

    from tierserve.core.errors import BackendUnavailableError
    from tierserve.ps.kafka_producer import UpdateProducer
    from tierserve.ps.sparse_file import read_sparse_model
    from tierserve.trainer.progress import progress_bar

    table = read_sparse_model(args.sparse)
    keys = np.asarray(table.keys, dtype=np.int64)
    vectors = np.asarray(table.embeddings, dtype=np.float32)
    producer = UpdateProducer(args.brokers, max_batch_size=args.max_batch_size)
    total = -(-keys.size // producer.max_batch_size)
    # The bar counts messages the brokers acknowledged, not messages queued.
    bar = progress_bar(total=total, unit="messages", desc="delivered", disable=args.quiet)
    step = producer.max_batch_size * 100  # queue 100 messages at a time, serving reports
    try:
        for start in range(0, keys.size, step):
            end = min(start + step, keys.size)
            producer.publish(args.model, args.table, keys[start:end], vectors[start:end])
            producer.poll(0)
            bar.update(producer.delivered - bar.n)
        deadline = time.monotonic() + args.timeout
        while producer.delivered < total and time.monotonic() < deadline:
            producer.poll(0.2)
            bar.update(producer.delivered - bar.n)
            if producer.delivered + producer.failed >= total:
                break
        producer.flush(max(0.0, deadline - time.monotonic()))
    except BackendUnavailableError as exc:
        bar.close()
        print(f"tierserve publish: error: {exc}; {producer.delivered} of {total} messages "
              f"delivered to {args.brokers}", file=sys.stderr)  # fmt: skip
        return 1
    bar.update(producer.delivered - bar.n)
    bar.close()
    print(f"published {keys.size} keys of {args.model}/{args.table} in {total} messages "
          f"to {args.brokers}")  # fmt: skip
    return 0
