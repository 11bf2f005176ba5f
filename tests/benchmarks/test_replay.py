"""The time replay on a tiny trace: every pod accounted, no double allocation, sane ETAs."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import replay

NODES = """sn,cpu_milli,memory_mib,gpu,model
n0,64000,262144,2,T4
n1,64000,262144,2,T4
"""
HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,"
    "deletion_time,scheduled_time\n"
)


def _pods() -> str:
    # 4 GPUs; 30 pods of 1-2 GPUs (some shares) arriving every 50 s, each running 100-700 s:
    # demand well above capacity, so pods queue and the ETAs have waits to predict.
    rows = []
    for i in range(30):
        num, milli = ((1, 1000), (2, 1000), (1, 500))[i % 3]
        start = 50 * i
        rows.append(
            f"p{i},4000,8192,{num},{milli},,{('LS', 'BE')[i % 2]},Running,{start},"
            f"{start + 100 + 200 * (i % 4)},{start}"
        )
    return HEADER + "\n".join(rows) + "\n"


@pytest.fixture
def trace(tmp_path: Path) -> tuple[Path, Path]:
    (tmp_path / "nodes.csv").write_text(NODES)
    (tmp_path / "pods.csv").write_text(_pods())
    return tmp_path / "nodes.csv", tmp_path / "pods.csv"


@pytest.mark.parametrize("order", replay.ORDERS)
@pytest.mark.parametrize("mode", replay.MODES)
def test_small_replay_accounts_for_every_pod(
    trace: tuple[Path, Path], tmp_path: Path, mode: str, order: str
) -> None:
    nodes, pods = replay.select(*trace, gpus=4, scale=1.0, limit=None, seed=1)
    assert sum(n.gpus for n in nodes) == 4 and len(pods) == 30
    r = replay.replay(nodes, pods, mode, order, 1, tmp_path, reread_s=60.0)
    assert r["problems"] == []  # no GPU handed out twice, no share above a whole GPU
    assert r["stuck"] == 0
    # Refused: 2-GPU pods of tenants whose limit is 1 (4 GPUs over 10 tenants).
    assert r["admitted"] == r["pods"] and r["pods"] + r["refused"] == 30 and r["pods"] > 20
    assert r["min_wait_s"] >= 0
    assert r["waited_over_60s"] > 0  # the trace is built to queue
    assert all(0 <= held <= 4 for _, held in r["allocation"])
    assert sum(t["pods"] for t in r["wait_by_tenant"].values()) == r["admitted"]
    q = r["eta_at_submission"]
    assert q["samples"] > 0
    # The portal learns run lengths as pods end, as the replay's own history does, and
    # calibrates on its own admissions: its eta_s is the calibrated point, sample for sample.
    assert q["no_estimate"]["portal"] == q["no_estimate"]["raw"] == q["no_estimate"]["calibrated"]
    assert q["median_rel_error"]["portal"] == q["median_rel_error"]["calibrated"]


def test_cli_prints_the_table(trace: tuple[Path, Path], tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    nodes, pods = trace
    results = replay.main(
        [
            "--nodes",
            str(nodes),
            "--pods",
            str(pods),
            "--gpus",
            "4",
            "--limit",
            "10",
            "--orders",
            "fifo,priority",
            "--modes",
            "declared",
            "--jobs",
            "2",
            "--json",
            str(out),
        ]
    )
    # Two runs in two processes, reported in the order asked.
    assert [r["order"] for r in results] == ["fifo", "priority"]
    assert [r["pods"] + r["refused"] for r in results] == [10, 10]
    assert out.exists()
    with pytest.raises(SystemExit):
        replay.main(["--nodes", str(nodes), "--pods", str(pods), "--scale", "0"])
    with pytest.raises(SystemExit):
        replay.main(["--nodes", str(nodes), "--pods", str(pods), "--jobs", "0"])
