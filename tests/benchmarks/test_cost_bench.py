"""Smoke test of ``python -m benchmarks.cost``: a small month runs and reports every figure.
No timing assertions (numbers live in benchmarks/results/cost.md)."""

from __future__ import annotations

import re

from benchmarks import cost as bench


def test_a_small_month_reports_reports_and_live_updates() -> None:
    small = ["--nodes", "20", "--days", "2", "--workloads", "60", "--repeat", "1"]
    text = bench.main([*small, "--rollups"])
    rows = re.findall(r"^\| (.+?) \| ([\d,]+) / ([\d,]+) \|$", text, re.MULTILINE)
    assert [r[0] for r in rows] == [
        "report of the month by day, cold (new Accounting)",
        "report of the month by day, warm (same Accounting)",
        "Cost view live update, nothing changed",
        "Cost view live update, clock moved 7 minutes",
    ]
    found = re.search(r"([\d,]+) hourly roll-ups", text)
    assert found is not None and int(found.group(1).replace(",", "")) > 0
