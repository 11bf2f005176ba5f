"""The ETA error breakdown: reads sorted by what overtook them, corrections learned online."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import eta_diagnosis, replay
from benchmarks.openb.trace import TracePod
from tests.benchmarks.test_replay import trace  # noqa: F401  (the tiny trace fixture)


def _pod(wid: str, qos: str, submit: float, start: float, raw: float) -> replay.Pod:
    tp = TracePod(wid, 1000, 1024, 1, 1000, "", int(submit), int(start) + 100, qos)
    pod = replay.Pod(wid, tp, "team-0", submit, 100.0, start=start)
    pod.samples.append(replay.Sample(submit, 1, raw, raw, raw, raw, None, True, raw, raw, raw))
    return pod


def test_a_later_arrival_admitted_first_is_an_overtaking() -> None:
    a = _pod("a", "BE", 0.0, 1000.0, 250.0)  # waited 1,000 s, told 250 s
    b = _pod("b", "LS", 100.0, 200.0, 50.0)  # arrived after a's read, started before a
    c = _pod("c", "BE", 300.0, 1100.0, 800.0)  # waited 800 s as told, nobody overtook it
    got = {r["ratio"]: r for r in eta_diagnosis.classify([a, b, c], True, "gpuportal")}
    assert got[4.0]["group"] == "overtaken, higher priority"
    assert got[4.0]["raw_error"] == pytest.approx(0.75)
    assert got[1.0]["group"] == "neither" and got[1.0]["raw_error"] == 0.0
    assert len(got) == 3  # b waited 100 s: counted, nothing overtook it
    # In FIFO every pod has one priority: the same overtaking is not by priority.
    fifo = eta_diagnosis.classify([a, b, c], True, "fifo")
    assert {r["group"] for r in fifo if r["ratio"] == 4.0} == {"overtaken, same or lower priority"}
    b.preempted_at = 500.0  # a preemption while c waited
    b.submit = -1.0  # ... and b no longer overtakes a
    assert {r["group"] for r in eta_diagnosis.classify([a, b, c], True, "gpuportal")} == {
        "preemption",
        "neither",
    }


def test_corrections_learn_only_from_earlier_admissions() -> None:
    # Each pod waits twice its estimate; the first five admitted teach the ratio 2 to the
    # ones read after their admission, never to those read before.
    pods = [_pod(f"p{i}", "BE", 1000.0 * i, 1000.0 * i + 200.0, 100.0) for i in range(12)]
    got = eta_diagnosis.corrections(pods)
    shipped = got["interval only (as shipped)"]["all reads"]
    corrected = got["point × median, all"]["all reads"]
    assert shipped[2] == corrected[2] == 12
    # Five reads come before five ratios exist (error 50 %), seven after: 0 % once corrected;
    # the shipped point moves into the interval [200, 200] as well.
    assert corrected[0] == 0.0 and shipped[0] == 0.0
    first = eta_diagnosis.corrections(pods[:5])["point × median, all"]["all reads"]
    assert first[0] == 0.5 and first[1] == 0.0  # nothing learned yet: the raw point


def test_shipped_scheme_matches_the_replay(trace: tuple[Path, Path], tmp_path: Path) -> None:  # noqa: F811
    """The breakdown's "as shipped" row recomputes the portal's figures from the reads alone.
    It keeps the reads with a replayed point above zero (no ratio exists for a zero point);
    whether the tiny trace has zero points varies from run to run (workload ids are random,
    and ties between equal workloads follow them). Without them the row is exactly the
    replay's published figure; with them, the reads it keeps are exactly the others (the
    calibration it replays then learns from a slightly different set than the portal did,
    so its figures are not compared)."""
    nodes, pods = replay.select(*trace, gpus=4, scale=1.0, limit=None, seed=1)
    kept: list[replay.Pod] = []
    r = replay.replay(nodes, pods, "declared", "gpuportal", 1, tmp_path, 60.0, keep=kept)
    assert len(kept) == r["pods"]
    q = r["eta_all_reads"]
    long_reads = [
        (p.start - s.at, s)
        for p in kept
        if p.start is not None
        for s in p.samples
        if p.start - s.at > replay.LONG_WAIT_S
    ]
    assert len(long_reads) == q["samples"]
    zero = sum(1 for _, s in long_reads if s.raw is not None and s.raw == 0)
    rows = eta_diagnosis.classify(kept, False, "gpuportal")
    assert len(rows) == q["samples"] - q["no_estimate"]["raw"] - zero
    shipped = eta_diagnosis.corrections(kept)["interval only (as shipped)"]["all reads"]
    assert shipped[2] == sum(1 for _, s in long_reads if s.raw)
    if zero == 0:
        assert shipped[0] == pytest.approx(q["median_rel_error"]["portal"])
        assert shipped[1] == pytest.approx(q["interval_coverage"])
