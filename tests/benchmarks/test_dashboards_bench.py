"""Smoke test of ``python -m benchmarks.dashboards`` (server side): a small month with hourly
utilization roll-ups runs and times every view. No timing assertions (numbers live in
benchmarks/results/dashboards.md)."""

from __future__ import annotations

import re

from benchmarks import dashboards as bench


def test_a_small_month_with_rollups_times_every_view() -> None:
    cases = list(bench.CASES)
    try:
        text = bench.main(["--nodes", "20", "--days", "2", "--workloads", "60", "--repeat", "1"])
    finally:
        bench.CASES[:] = cases  # main narrows them to --views
    found = re.search(r"([\d,]+) hourly utilization roll-ups", text)
    assert found is not None and int(found.group(1).replace(",", "")) > 0
    rows = re.findall(r"^\| (\w+ \(\w+\)) \| ([\d,]+) / [\d,]+ \|", text, re.MULTILINE)
    assert [r[0] for r in rows] == [f"{v} ({who})" for v, who in cases]
