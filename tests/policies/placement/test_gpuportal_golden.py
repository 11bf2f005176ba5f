"""gpuportal scores bit for bit against the recorded golden file (see ``gpuportal_golden``).

Any change to a constant, a term or the order of the arithmetic moves some score here; the
golden file was recorded from the scorer before it was split into parts.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.policies.placement import gpuportal_golden as golden

RECORDED: dict[str, Any] = json.loads(golden.GOLDEN.read_text())


def test_the_golden_file_covers_every_scenario() -> None:
    assert set(RECORDED) == {name for name, *_ in golden.SCENARIOS}
    for name, kwargs, seed, steps in golden.SCENARIOS:
        rec = RECORDED[name]
        assert (rec["kwargs"], rec["seed"], rec["steps"]) == (kwargs, seed, steps), name
        assert len(rec["digests"]) == steps


@pytest.mark.parametrize(("name", "kwargs", "seed", "steps"), golden.SCENARIOS)
def test_scores_match_the_golden_file(
    name: str, kwargs: dict[str, Any], seed: int, steps: int
) -> None:
    want = RECORDED[name]
    records = golden.run(kwargs, seed, steps)
    for i, record in enumerate(records):
        if golden.digest(record) != want["digests"][i]:
            # Show what moved when the step is one of the readable ones.
            before = want["readable"][i] if i < len(want["readable"]) else "(digest only)"
            pytest.fail(f"{name}: step {i} differs\nnow:    {record}\nbefore: {before}")
