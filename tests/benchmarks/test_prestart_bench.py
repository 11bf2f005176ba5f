"""Smoke test of ``python -m benchmarks.prestart`` at a tiny size: both kinds of spawn run
(the benchmark itself asserts that each adopting spawn took a placeholder and no other did),
and the defaults behind ``benchmarks/results/prestart.md`` are pinned. (The figures are never
asserted here.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import prestart

pytestmark = pytest.mark.slow


def test_the_published_settings_are_the_defaults() -> None:
    assert (prestart.OPTION, prestart.BUDGET_GPUS, prestart.RATE_PER_HOUR) == (
        "gpu:H100-80GB:1",
        4.0,
        6.0,
    )


def test_both_kinds_of_spawn_are_timed(tmp_path: Path) -> None:
    out = tmp_path / "prestart.json"
    prestart.main(["--gpus", "100", "--spawns", "2", "--imports", "0", "--json", str(out)])
    result = json.loads(out.read_text())
    assert result["spawns_per_mode"] == 2
    for kind in ("adopted", "free", "adopted_cpu", "free_cpu"):
        assert result[kind]["p50_ms"] > 0
