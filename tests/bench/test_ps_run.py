"""bench/ps/run.py: the interleaved timing it reports and a small run of the hash map rows."""

from __future__ import annotations

import json
import time

from bench.ps import run


def test_alternate_interleaves_batch_by_batch_and_takes_medians():
    calls: list[tuple[str, int]] = []

    def subject(b):
        calls.append(("s", b))
        if b == 2:  # one slow batch (asleep: no CPU time), which the median leaves out
            time.sleep(0.05)

    def peer(b):
        calls.append(("p", b))
        t = time.thread_time()
        while time.thread_time() - t < 0.001:  # CPU work, on the thread's clock
            pass

    cpu: dict = {}
    sub, peer_s = run.alternate(subject, peer, [0, 1, 2], rounds=2, cpu=cpu)
    assert calls[:2] == [("s", 0), ("p", 0)]  # the warm-up call of each
    assert calls[2:] == [(who, b) for _ in range(2) for b in (0, 1, 2) for who in "sp"]
    assert sub < 0.025 and peer_s >= 0.001  # wall clock: the median, not the mean
    assert cpu["peer"] >= 0.001 > cpu["subject"]


def test_a_small_hash_map_run_prints_its_ratios(tmp_path, capsys):
    out = tmp_path / "r.json"
    # 400k rows: a table (38 MB) that malloc maps fresh, so the resident memory it adds
    # shows (a small one may reuse the memory of the warm-up table freed before)
    args = ["--rows", "400000", "--dims", "16", "--tiers", "hash_map,load", "--rounds", "1",
            "--batches", "2", "--json", str(out)]  # fmt: skip
    assert run.main(args) == 0
    results = json.loads(out.read_text())
    lookups = [r for r in results if r["tier"] == "hash_map"]
    assert sorted(r["dist"] for r in lookups) == ["powerlaw", "uniform"]
    for r in lookups:
        assert r["peer"] == "np.take" and r["ratio"] > 0 and r["ratio_cpu"] > 0
        assert 1.0 < r["memory_ratio"] < 1.5  # the table's arrays over raw keys and vectors
        assert 1.0 < r["rss_ratio"] < 1.8  # the load's resident memory, in the same units
    assert [r["tier"] for r in results].count("hash_map load") == 1
    table = capsys.readouterr().out
    assert "| hash_map | 400,000 | 16 | uniform |" in table and "memory (RSS)" in table
