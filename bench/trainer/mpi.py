"""Benchmark: data- and model-parallel training under ``mpiexec``, 2 ranks against 1 rank.

    python -m bench.trainer.mpi                 # 1 and 2 ranks (figures), 4 ranks (correctness)
    python -m bench.trainer.mpi --steps 20 --batch 4096

Model: DLRM, 26 one-hot slots in one DistributedSlot table of dim 16 (power-law keys, ~1M
keys), bottom MLP 13-512-256-16, dot interaction, top MLP 512-256-1, Adagrad, global batch
``--batch``; one BLAS thread per rank.  Each configuration runs the same script under
``mpiexec -n N``; rank 0 reports:

* samples/s of the global batch over ``--steps`` timed steps (after warm-up steps), and the
  ratio of N ranks to 1 rank (the median of ``--rounds`` runs, rank counts alternating);
* bytes each rank sent per step (its share of the all-to-all exchanges and the allreduce
  buffer) against the minimum: the distinct keys it looked up on other ranks x dim x 4 bytes
  x 2 (vectors in, gradients out) plus the dense gradients (an allreduce of G bytes sends
  2 (N-1)/N G per rank).
* CPU seconds per 1,000 samples summed over the ranks (reader threads included): what the
  work costs whatever the machine's load, so equal figures mean N ranks add no work, and a
  speed-up short of N comes from cores the ranks did not get;
* the final dense weights' largest relative difference from the 1-rank run (4 ranks on 2
  cores is a correctness run, its speed is not a figure).

The machine's load average is printed with the figures: the cores are shared.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

SLOTS = 26
DIM = 16


def _worker(args) -> None:
    os.environ.setdefault("TIERSERVE_FORCE_CPU", "1")
    os.environ.setdefault("TIERSERVE_NO_PROGRESS", "1")
    import tierserve.trainer as hugectr
    from tierserve.trainer.distributed import launched_size, world

    ranks = launched_size()
    solver = hugectr.CreateSolver(batchsize=args.batch, batchsize_eval=args.batch, lr=0.01,
                                  vvgpu=[list(range(ranks))], repeat_dataset=True,
                                  i64_input_key=True, max_eval_batches=1)
    reader = hugectr.DataReaderParams(
        data_reader_type=hugectr.DataReaderType_t.Norm,
        source=[os.path.join(args.data, "file_list.txt")],
        eval_source=os.path.join(args.data, "file_list_test.txt"),
        check_type=hugectr.Check_t.Sum)
    opt = hugectr.CreateOptimizer(optimizer_type=hugectr.Optimizer_t.AdaGrad,
                                  update_type=hugectr.Update_t.Local, epsilon=1e-7,
                                  initial_accu_value=0.1)
    model = hugectr.Model(solver, reader, opt)
    model.add(hugectr.Input(label_dim=1, label_name="label", dense_dim=13, dense_name="dense",
                            data_reader_sparse_param_array=[
                                hugectr.DataReaderSparseParam("data1", 1, True, SLOTS)]))
    model.add(hugectr.SparseEmbedding(
        embedding_type=hugectr.Embedding_t.DistributedSlotSparseEmbeddingHash,
        workspace_size_per_gpu_in_mb=256, embedding_vec_size=DIM, combiner="sum",
        sparse_embedding_name="emb", bottom_name="data1", optimizer=opt))
    layers = [("dense", 512), ("r1", 256), ("r2", DIM)]
    for i, (bottom, width) in enumerate(layers):
        model.add(hugectr.DenseLayer(layer_type=hugectr.Layer_t.InnerProduct,
                                     bottom_names=[bottom], top_names=[f"b{i}"],
                                     num_output=width))
        model.add(hugectr.DenseLayer(layer_type=hugectr.Layer_t.ReLU, bottom_names=[f"b{i}"],
                                     top_names=[f"r{i + 1}"]))
    model.add(hugectr.DenseLayer(layer_type=hugectr.Layer_t.Interaction,
                                 bottom_names=["r3", "emb"], top_names=["inter"]))
    bottom = "inter"
    for i, width in enumerate([512, 256, 1]):
        model.add(hugectr.DenseLayer(layer_type=hugectr.Layer_t.InnerProduct,
                                     bottom_names=[bottom], top_names=[f"t{i}"],
                                     num_output=width))
        bottom = f"t{i}"
        if width > 1:
            model.add(hugectr.DenseLayer(layer_type=hugectr.Layer_t.ReLU,
                                         bottom_names=[bottom], top_names=[f"tr{i}"]))
            bottom = f"tr{i}"
    model.add(hugectr.DenseLayer(layer_type=hugectr.Layer_t.BinaryCrossEntropyLoss,
                                 bottom_names=[bottom, "label"], top_names=["loss"]))
    model.compile()
    comm = world()
    for _ in range(args.warmup):
        model.train()
    table = model.tables[0]
    comm.barrier()
    sent0, keys0 = comm.bytes_sent, getattr(table, "remote_keys", 0)
    profile = None
    if args.profile:
        import cProfile

        profile = cProfile.Profile()
        profile.enable()
    cpu0 = _cpu_seconds()
    start = time.perf_counter()
    for _ in range(args.steps):
        model.train()
    comm.barrier()
    elapsed = time.perf_counter() - start
    if profile is not None:
        profile.disable()
        profile.dump_stats(os.path.join(args.profile, f"rank{comm.rank}of{comm.size}.prof"))
    cpu, _ = comm.allgatherv(np.asarray([_cpu_seconds() - cpu0]))
    sent = (comm.bytes_sent - sent0) / args.steps
    remote = (getattr(table, "remote_keys", 0) - keys0) / args.steps
    dense_bytes = 4 * sum(int(np.prod(p.shape)) for p in model.dense_parameters())
    n = comm.size
    minimum = remote * DIM * 4 * 2 + (2 * (n - 1) / n * dense_bytes if n > 1 else 0)
    if comm.rank == 0:
        np.save(args.out, np.concatenate([p.ravel() for p in model.dense_parameters()]))
        print(json.dumps({"ranks": n, "samples_s": args.steps * args.batch / elapsed,
                          "bytes_per_step": sent, "min_bytes_per_step": minimum,
                          "dense_bytes": dense_bytes, "remote_keys_per_step": remote,
                          "cpu_s_per_1k_samples": float(cpu.sum()) / (args.steps * args.batch)
                          * 1000}),
              flush=True)


def _cpu_seconds() -> float:
    """CPU time of this process (all its threads: the reader's too)."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _generate(folder: Path) -> None:
    import tierserve.trainer as hugectr

    hugectr.tools.DataGenerator(hugectr.tools.DataGeneratorParams(
        format=hugectr.DataReaderType_t.Norm, label_dim=1, dense_dim=13, num_slot=SLOTS,
        i64_input_key=True, source=str(folder / "file_list.txt"),
        eval_source=str(folder / "file_list_test.txt"), slot_size_array=[40000] * SLOTS,
        nnz_array=[1] * SLOTS, check_type=hugectr.Check_t.Sum, num_files=4, eval_num_files=1,
        num_samples_per_file=32768)).generate()


def _run(ranks: int, args, data: Path, out: Path) -> dict:
    mpiexec = Path(sys.executable).parent / "mpiexec"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "OMPI_"))}
    env.update(OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    cmd = [str(mpiexec), "-n", str(ranks), sys.executable, "-m", "bench.trainer.mpi",
           "--worker", "--data", str(data), "--out", str(out), "--steps", str(args.steps),
           "--warmup", str(args.warmup), "--batch", str(args.batch)]
    if args.profile:
        cmd += ["--profile", str(Path(args.profile).resolve())]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[2])
    if done.returncode:
        raise SystemExit(f"{ranks} ranks failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--data")
    ap.add_argument("--out")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--ranks", default="1,2,4", help="rank counts to run (first is the base)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="runs of each rank count, alternating; the median samples/s counts")
    ap.add_argument("--json", action="store_true",
                    help="print the figures of every rank count as JSON")
    ap.add_argument("--profile", metavar="DIR",
                    help="write each rank's cProfile of the timed steps to DIR/rank<r>of<n>.prof "
                         "(the figures are then not timings to report)")
    args = ap.parse_args()
    if args.worker:
        _worker(args)
        return
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        _generate(data)
        counts = [int(r) for r in args.ranks.split(",")]
        runs: dict[int, list[dict]] = {n: [] for n in counts}
        weights = {}
        for _ in range(args.rounds):  # alternate, so every rank count sees the same load
            for ranks in counts:
                out = Path(tmp) / f"dense_{ranks}.npy"
                runs[ranks].append(_run(ranks, args, data, out))
                weights[ranks] = np.load(out)
        results = []
        for ranks in counts:
            rs = sorted(runs[ranks], key=lambda r: r["samples_s"])
            results.append(rs[len(rs) // 2])
        base = results[0]
        for r in results:
            n = r["ranks"]
            r["dense_vs_base"] = float(np.abs(weights[n] - weights[base["ranks"]]).max()
                                       / np.abs(weights[base["ranks"]]).max())
            r["runs_samples_s"] = [x["samples_s"] for x in runs[n]]
        if args.json:
            print(json.dumps(results))
            return
        print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; DLRM 26x{DIM}, "
              f"MLP 13-512-256-16 / 512-256-1, Adagrad, global batch {args.batch}, "
              f"{args.steps} steps, 1 BLAS thread per rank, median of {args.rounds} runs")
        for r in results:
            n, diff = r["ranks"], r["dense_vs_base"]
            ratio = r["bytes_per_step"] / r["min_bytes_per_step"] if r["min_bytes_per_step"] \
                else float("nan")
            each = ", ".join(f"{x['samples_s']:,.0f}" for x in runs[n])
            print(f"{n} rank(s): {r['samples_s']:,.0f} samples/s [runs: {each}] "
                  f"({r['samples_s'] / base['samples_s']:.2f}x), sent/step "
                  f"{r['bytes_per_step'] / 1e6:.2f} MB vs minimum "
                  f"{r['min_bytes_per_step'] / 1e6:.2f} MB ({ratio:.2f}x), CPU "
                  f"{r['cpu_s_per_1k_samples']:.3f} s per 1k samples (all ranks), dense weights vs "
                  f"{base['ranks']} rank: {diff:.1e} relative")


if __name__ == "__main__":
    main()
