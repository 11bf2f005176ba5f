"""Smoke test of ``python -m benchmarks.forecast`` on a small made-up trace whose weeks repeat
exactly: every method and horizon band is reported, and repeating last week is exact on it.
(The trace's figures are in ``benchmarks/results/forecast.md``, never asserted here.)"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from benchmarks import forecast

pytestmark = pytest.mark.slow

HEADER = [
    "name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec", "qos",
    "pod_phase", "creation_time", "deletion_time", "scheduled_time",
]  # fmt: skip


def test_a_repeating_trace_is_forecast_exactly_by_last_week(tmp_path: Path) -> None:
    pods = tmp_path / "pods.csv"
    with pods.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow(HEADER)
        n = 0
        for day in range(16):
            if day % 7 >= 5:
                continue  # quiet weekends
            for hour in (9, 10, 14):
                at = (day * 24 + hour) * 3600
                out.writerow([f"p{n}", 1000, 1024, 1, 1000, "", "LS", "Running", at, at + 1800, at])
                n += 1
    result_path = tmp_path / "forecast.json"
    argv = ["--pods", str(pods), "--horizon", "24", "--busy-per-day", "1", "--json"]
    assert forecast.main([*argv, str(result_path)]) == 0
    result = json.loads(result_path.read_text())
    assert result["origins"] == 1
    rows = {(r["signal"], r["level"], r["method"], r["band_h"]): r for r in result["rows"]}
    methods = {m for _, _, m, _ in rows}
    assert methods == set(forecast.METHODS)
    assert {b for *_, b in rows} == {"1-1", "2-6", "7-24"}
    for band in ("1-1", "2-6", "7-24"):
        assert rows[("arrivals", "flavor", "naive-weekly", band)]["mae"] == 0.0
        assert rows[("gpu_hours", "flavor", "naive-weekly", band)]["mae"] == 0.0
