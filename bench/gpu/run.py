"""The GPU check's stages and its summary (``bench/gpu/check.sh`` runs them).

    python -m bench.gpu.run --stage cache   --json cache.json [--cpu-dry-run]
    python -m bench.gpu.run --stage trainer --json trainer.json
    python -m bench.gpu.run --stage server  --json server.json
    python -m bench.gpu.run --summary DIR [--out FILE]   # one table of DIR/*.json

Each stage writes its figures as JSON; a part of a stage that fails is recorded there as
``{"error": ...}`` and the other parts still run.  ``--cpu-dry-run`` runs the same code on
numpy with tiny sizes, to check the stages on a machine without a GPU.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

STAGES = ("cache", "trainer", "server")


def run_stage(stage: str, dry_run: bool) -> dict:
    from .backend import backend

    be = backend(dry_run)
    started = time.perf_counter()
    if stage == "cache":
        from .cache_stage import run
    elif stage == "trainer":
        from .trainer_stage import run
    else:
        from .server_stage import run
    result = run(be, dry_run)
    return {"stage": stage, "device": be.device, "dry_run": dry_run,
            "seconds": time.perf_counter() - started, "result": result}


# -- summary --------------------------------------------------------------------------------


def _m(x: float) -> str:
    return f"{x / 1e6:.2f}M" if x >= 1e6 else f"{x / 1e3:.1f}k"


def _err(part) -> str | None:
    return part.get("error") if isinstance(part, dict) else None


def summary_rows(stages: dict[str, dict]) -> list[tuple[str, str, str, str]]:
    """``(figure, value, goal, met)`` rows from the stage results (and the step statuses)."""
    rows: list[tuple[str, str, str, str]] = []
    for name, status in stages.get("steps", {}).items():
        rows.append((f"step {name}", status.get("status", "?"), "ok",
                     "yes" if status.get("status") == "ok" else "NO"))
    tests = stages.get("tests")
    if tests:
        rows.append(("GPU-marked tests", tests.get("line", "?"), "0 failed",
                     "yes" if tests.get("failed", 1) == 0 and tests.get("errors", 0) == 0
                     else "NO"))
    for stage in STAGES:
        data = stages.get(stage)
        if data is None:
            rows.append((f"{stage} stage", "did not run / no result", "", "NO"))
            continue
        res = data.get("result", {})
        if stage == "cache":
            hits = res.get("hits")
            if _err(hits):
                rows.append(("cache hits", _err(hits), "", "NO"))
            for r in hits if isinstance(hits, list) else []:
                want = 0.8 if r["what"] == "kernel" else 0.5  # the CUDA kernel: close to a gather
                rows.append((f"cache hits dim {r['dim']} ({r['what']}), keys/s",
                             f"{_m(r['keys_per_s'])} = {r['ratio']:.2f}x {r['peer']} "
                             f"({_m(r['peer_keys_per_s'])})", f">= {want}x",
                             "yes" if r["ratio"] >= want else "no"))
            p = res.get("powerlaw", {})
            if _err(p):
                rows.append(("cache power law", _err(p), "", "NO"))
            elif p:
                rows.append((f"Zipf {p['alpha']} over {p['rows']:,} rows, {p['cache_fraction']:.0%}"
                             " cache + hash_map: hit rate", f"{p['hit_rate']:.3f}", ">= 0.8",
                             "yes" if p["hit_rate"] >= 0.8 else "no"))
                rows.append(("  cache + hash_map vs hash_map alone, keys/s",
                             f"{_m(p['keys_per_s'])} = {p['ratio']:.2f}x ({_m(p['peer_keys_per_s'])})",
                             ">= 1.5x", "yes" if p["ratio"] >= 1.5 else "no"))
            w = res.get("writes")
            if _err(w):
                rows.append(("cache writes", _err(w), "", "NO"))
            for r in w if isinstance(w, list) else []:
                rows.append((f"cache {r['what']}, dim {r['dim']}", f"{_m(r['keys_per_s'])} keys/s",
                             "", ""))
        elif stage == "trainer":
            t = res.get("throughput", {})
            if _err(t):
                rows.append(("trainer throughput", _err(t), "", "NO"))
            elif t:
                sps = t["samples_per_s"]
                ours = next((v for k, v in sps.items() if k.startswith("tierserve") and "CPU" not in k), None)
                for k, v in sps.items():
                    rows.append((f"trainer {k}, samples/s (batch {t['batch']})", f"{v:,.0f}", "", ""))
                torch_v = next((v for k, v in sps.items() if k.startswith("torch")), None)
                if ours and torch_v:
                    rows.append(("  tierserve GPU / torch same GPU", f"{ours / torch_v:.2f}x",
                                 ">= 1.0x", "yes" if ours >= torch_v else "no"))
                if ours and sps.get("tierserve CPU"):
                    rows.append(("  tierserve GPU / tierserve CPU", f"{ours / sps['tierserve CPU']:.2f}x",
                                 "", ""))
            a = res.get("auc", {})
            if _err(a):
                rows.append(("trainer AUC", _err(a), "", "NO"))
            elif a:
                scores = a["auc"]
                rows.append((f"trainer AUC after {a['steps']} steps",
                             ", ".join(f"{k} {v:.4f}" for k, v in scores.items()), "", ""))
                ours = next((v for k, v in scores.items() if k.startswith("tierserve") and "CPU" not in k), None)
                for k, v in scores.items():
                    if ours is not None and (k == "tierserve CPU" or k.startswith("torch")):
                        d = abs(ours - v)
                        rows.append((f"  |AUC GPU - {k}|", f"{d:.4f}", "<= 0.002",
                                     "yes" if d <= 0.002 else "no"))
        elif stage == "server":
            if _err(res):
                rows.append(("server", _err(res), "", "NO"))
                continue
            lat = res.get("latency", {})
            names = list(lat)
            for b in ("1", "64", "1024"):
                vals = [lat[n].get(b) for n in names]
                if not all(vals):
                    continue
                text = ", ".join(f"{n} {v['p50_ms']:.2f} ms" for n, v in zip(names, vals))
                goal = met = ""
                if b == "1024" and len(vals) == 2:
                    ratio = vals[0]["p50_ms"] / vals[1]["p50_ms"]
                    text += f" ({ratio:.2f}x)"
                    goal, met = ">= 2x lower with the cache", "yes" if ratio >= 2 else "no"
                elif b == "1" and len(vals) == 2:
                    goal = "no slower with the cache"
                    met = "yes" if vals[1]["p50_ms"] <= vals[0]["p50_ms"] else "no"
                rows.append((f"served p50, batch {b}", text, goal, met))
    return rows


def load_results(folder: Path) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for path in sorted(folder.glob("*.json")):
        try:
            out[path.stem] = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            out[path.stem] = {"error": f"unreadable: {exc}"}
    return out


def render(rows: list[tuple[str, str, str, str]], device: str) -> str:
    lines = [f"GPU check on {device}", "", "| figure | value | goal | met |", "|---|---|---|---|"]
    lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows]
    return "\n".join(lines)


def summarize(folder: Path, out: Path | None) -> int:
    results = load_results(folder)
    device = next((r.get("device") for r in results.values() if isinstance(r, dict) and r.get("device")),
                  "unknown device")
    rows = summary_rows(results)
    print(render(rows, device))
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"device": device, "summary": [
            dict(zip(("figure", "value", "goal", "met"), r)) for r in rows], "results": results},
            indent=2, default=str))
        print(f"\nwritten: {out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--stage", choices=STAGES)
    parser.add_argument("--json", type=Path, help="write the stage's figures here")
    parser.add_argument("--cpu-dry-run", action="store_true",
                        help="numpy and tiny sizes: check the stages without a GPU")
    parser.add_argument("--summary", type=Path, help="print the table of the JSON files here")
    parser.add_argument("--out", type=Path, help="with --summary: write it as JSON here")
    args = parser.parse_args(argv)
    if args.summary:
        return summarize(args.summary, args.out)
    if not args.stage:
        parser.error("give --stage or --summary")
    result = run_stage(args.stage, args.cpu_dry_run)
    text = json.dumps(result, indent=2, default=float)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text)
    else:
        print(text)
    failed = [k for k, v in result["result"].items() if _err(v)] if isinstance(result["result"], dict) else []
    return 1 if failed or _err(result["result"]) else 0


if __name__ == "__main__":
    sys.exit(main())
