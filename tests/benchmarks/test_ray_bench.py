"""Smoke test of ``python -m benchmarks.ray`` with real Ray: one run of a cluster of one
worker growing to two reports every measure (the figures themselves go to
``benchmarks/results/ray.md``, never asserted here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import ray
from portal.ray.spec import installed_ray_version

pytestmark = pytest.mark.slow


def test_one_run_reaches_a_usable_cluster_grows_it_and_reads_its_idleness(
    tmp_path: Path,
) -> None:
    if installed_ray_version() is None:
        pytest.skip("ray is not installed")
    out = tmp_path / "ray.json"
    ray.main(["--runs", "1", "--workers", "1", "--grow", "1", "--json", str(out)])
    result = json.loads(out.read_text())
    [run] = result["runs"]
    assert set(run) == {"usable_s", "admit_ms", "join_s", "idle_read_s"}
    assert all(v > 0 for v in run.values())
    assert result["median"] == run
