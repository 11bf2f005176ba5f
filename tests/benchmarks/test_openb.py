"""The openb harness on a tiny synthetic trace: protocol facts and the independent verifier."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from benchmarks.openb import __main__ as cli
from benchmarks.openb.protocol import arrival_order, arrived_bin, run
from benchmarks.openb.trace import read_nodes, read_pods, typical_shapes
from benchmarks.openb.verify import verify

NODES = """sn,cpu_milli,memory_mib,gpu,model
tiny-node-0,32000,131072,2,T4
tiny-node-1,32000,131072,2,T4
tiny-node-2,64000,262144,4,G2
"""
# 8 GPUs; demand of the trace: 1000 + 500 + 2000 + 0 + 250 + 1000 + 4000 = 8750 milli.
PODS = """name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,\
deletion_time,scheduled_time
p0,4000,8192,1,1000,,LS,Running,0,1,0
p1,2000,4096,1,500,,LS,Running,0,1,0
p2,8000,16384,2,1000,,LS,Running,0,1,0
p3,1000,2048,0,0,,LS,Running,0,1,0
p4,2000,4096,1,250,T4,LS,Running,0,1,0
p5,4000,8192,1,1000,G2|T4,LS,Running,0,1,0
p6,16000,32768,4,1000,,LS,Running,0,1,0
"""


@pytest.fixture
def trace(tmp_path: Path) -> tuple[Path, Path]:
    (tmp_path / "nodes.csv").write_text(NODES)
    (tmp_path / "pods.csv").write_text(PODS)
    return tmp_path / "nodes.csv", tmp_path / "pods.csv"


def test_inflation_stops_before_exceeding_130_percent(trace: tuple[Path, Path]) -> None:
    pods = read_pods(trace[1])
    for seed in range(5):
        order = arrival_order(pods, 8, seed)
        demand = sum(p.total_milli for p in order)
        assert demand <= 1.3 * 8000
        assert sorted(p.name for p in order[: len(pods)]) == sorted(p.name for p in pods)
        # Every pod after the trace is a resample of a trace pod.
        assert {p.name for p in order[len(pods) :]} <= {p.name for p in pods}


def test_binning_rounds_half_up() -> None:
    assert arrived_bin(995, 1000) == 100  # 99.5 % → 100
    assert arrived_bin(994, 1000) == 99
    assert arrived_bin(1300, 1000) == 130


def test_runs_are_deterministic_per_seed(trace: tuple[Path, Path]) -> None:
    nodes, pods = read_nodes(trace[0]), read_pods(trace[1])
    for name in ("fgd", "random", "gpuportal"):
        a = run(name, nodes, pods, 42)
        b = run(name, nodes, pods, 42)
        assert [x.placement for x in a.arrivals] == [x.placement for x in b.arrivals]
        assert a.alloc_by_bin == b.alloc_by_bin
    # Another seed permutes nodes and arrivals differently.
    c = run("fgd", nodes, pods, 43)
    assert [x.pod.name for x in c.arrivals] != [
        x.pod.name for x in run("fgd", nodes, pods, 42).arrivals
    ]


def test_typical_shapes_cover_95_percent_and_renormalise(trace: tuple[Path, Path]) -> None:
    shapes = typical_shapes(read_pods(trace[1]))
    # 7 distinct shapes, one pod each: 95 % of 7 pods needs all 7.
    assert len(shapes) == 7
    assert sum(p for _, p in shapes) == pytest.approx(1.0)


def test_cli_writes_a_placements_file_that_verifies(
    trace: tuple[Path, Path], tmp_path: Path
) -> None:
    out = tmp_path / "placements.csv"
    js = tmp_path / "out.json"
    args = ["--nodes", str(trace[0]), "--pods", str(trace[1]), "--policy", "bestfit"]
    assert cli.main([*args, "--seeds", "1-2", "--placements", str(out), "--json", str(js)]) == 0
    errors, figures = verify(out, trace[0])
    assert errors == []
    assert set(figures) == {("bestfit", 1), ("bestfit", 2)}
    assert "allocation_by_arrived" in js.read_text()


def test_verify_catches_an_overcommitted_gpu(trace: tuple[Path, Path], tmp_path: Path) -> None:
    out = tmp_path / "bad.csv"
    with out.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(cli.PLACEMENT_FIELDS)
        w.writerow(["x", 1, 0, "p1", 2000, 4096, 1, 600, "", "tiny-node-0", "0"])
        w.writerow(["x", 1, 1, "p1", 2000, 4096, 1, 600, "", "tiny-node-0", "0"])
        w.writerow(["x", 1, 2, "p3", 40000, 2048, 0, 0, "", "tiny-node-1", ""])
    errors, _ = verify(out, trace[0])
    assert any("GPU 0 at 1200 milli" in e for e in errors)
    assert any("CPU 40000m" in e for e in errors)
