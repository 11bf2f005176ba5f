"""Smoke test of ``python -m benchmarks.allocator``: it runs, reports, and leaves no GPU
handed out twice. No timing assertions (numbers live in benchmarks/results/)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from benchmarks import allocator as bench


def test_a_small_run_reports_latencies_and_leaves_no_gpu_double_allocated(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    argv = ["--gpus", "200", "--decisions", "100", "--seed", "3", "--commit-cpu"]
    r = bench.main([*argv, "--json", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(r, default=str))
    assert r["params"]["gpus"] == 200 and r["params"]["nodes"] == 25
    lat = r["latency"]
    assert lat["request"]["count"] + lat["release"]["count"] == lat["all"]["count"] > 0
    for k in ("all", "request", "release"):
        s = lat[k]
        assert s["p50_ms"] <= s["p90_ms"] <= s["p99_ms"] <= s["max_ms"]
    assert 0.0 <= r["commit_share"] <= 1.0
    assert r["throughput_per_s"] > 0
    cpu = r["cpu_ms_per_decision"]
    assert 0.0 < cpu["commit"] < cpu["all"]
    assert any(k.startswith("request->") for k in r["outcomes"])
    assert r["allocations"] > 0
    assert r["invariant_violations"] == []


def test_the_invariant_check_catches_a_gpu_handed_out_twice(tmp_path: Path) -> None:
    """The check must be able to fail: duplicate one live allocation and it reports it."""
    from portal.allocator import Allocator
    from portal.allocator.state import State

    store = bench.TimedStore(f"sqlite:///{tmp_path / 'db.sqlite'}")
    try:
        alloc = Allocator(store, clock=bench.Clock())
        alloc.start(bench.inventory(200))
        alloc.set_tenant("t")
        alloc.set_quota("t", "H100-80GB", guaranteed=8, limit=8)
        s = alloc.request(bench.random_request_whole("t", 2))
        assert bench.check_invariants(alloc) == []

        # Corrupt memory behind the allocator's back (the live state is read-only to callers).
        def duplicate(state: State) -> None:
            lv = state.live[s.id]
            state.live[s.id] = replace(lv, allocations=lv.allocations + lv.allocations)

        alloc.read(duplicate)
        assert bench.check_invariants(alloc)
    finally:
        store.close()
