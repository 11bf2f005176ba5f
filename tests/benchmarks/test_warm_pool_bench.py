"""Smoke test of ``python -m benchmarks.warm_pool``: one round with real test-engine processes
and a tiny load time; it reports both modes, and the woken replica loaded once. (The figures
themselves are in ``benchmarks/results/warm_pool.md``, never asserted here.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import warm_pool

pytestmark = pytest.mark.slow


def test_one_round_reports_both_modes_and_the_woken_replica_loaded_once(tmp_path: Path) -> None:
    out = tmp_path / "warm_pool.json"
    assert warm_pool.main(["--load-seconds", "0.2", "--rounds", "1", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["rounds"] == 1 and set(result["median_ttft_s"]) == {"warm_1", "warm_0"}
    assert [(r["warm"], r["loads_of_serving_replica"]) for r in result["results"]] == [
        (1, 1),
        (0, 1),
    ]
    assert all(r["ttft_s"] > 0 for r in result["results"])
