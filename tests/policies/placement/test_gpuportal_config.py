"""gpuportal's constants: the defaults behind the published openb figures are pinned twice.

First literally (the configuration equals the documented values), then by behaviour: changing
any one of them moves the golden file's default scenario (``gpuportal_golden``), which was
recorded with the defaults.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

import pytest

from policies.errors import InvalidRequest
from policies.flavors import MILLI_PER_GPU, FlavorKind
from policies.placement.scorers import gpuportal, mix, policy, topology_rank
from policies.placement.scorers.fragmentation import Shape
from policies.placement.scorers.gpuportal import DEFAULTS, GpuPortal, GpuPortalConfig
from policies.requests import DeviceRequest
from tests.policies.placement import gpuportal_golden as golden

# The values docs/decisions/0007-gpuportal-scorer.md and the GpuPortalConfig docstring give.
DOCUMENTED = {
    "half_life": 20000.0,
    "coverage": 0.95,
    "refresh_every": 1024,
    "drift": 0.02,
    "weight_frag": 0.8,
    "quantum": 200.0,
    "weight_host": 1.0,
    "weight_leftover": 0.2,
    "leftover_patience": 20.0,
    "frag_tiebreak": 0.05,
    "mig_serve": 0.7,
    "mig_keep": 0.2,
    "mig_fuller": 0.1,
}


def test_the_defaults_are_the_documented_values() -> None:
    assert dataclasses.asdict(DEFAULTS) == DOCUMENTED
    assert GpuPortal().config == DEFAULTS
    # The registry's policy (what the allocator and benchmarks/openb use) takes the defaults.
    ((scorer, weight),) = policy("gpuportal").scorers
    assert isinstance(scorer, GpuPortal) and weight == 1.0
    assert dataclasses.asdict(scorer.config) == DOCUMENTED
    # The constants outside the configuration: Δ's scale, the rank steps, the prior mix.
    assert gpuportal.DELTA_SCALE_MILLI == 1000.0
    assert topology_rank.RANKS == 13
    prior = mix.PRIOR
    assert prior == (
        (Shape(0, MILLI_PER_GPU, 1), 0.4),
        (Shape(0, 500, 1), 0.3),
        (Shape(0, MILLI_PER_GPU, 2), 0.1),
        (Shape(0, MILLI_PER_GPU, 4), 0.1),
        (Shape(0, MILLI_PER_GPU, 8), 0.1),
    )


def _moves_the_default_scenario(gp: GpuPortal) -> int | None:
    """The first step of the golden default scenario ``gp`` scores differently, or None."""
    name, kwargs, seed, steps = golden.SCENARIOS[0]
    assert name == "default" and kwargs == {}
    want = json.loads(golden.GOLDEN.read_text())[name]["digests"]
    for i, record in enumerate(golden.records(gp, seed, steps)):
        if golden.digest(record) != want[i]:
            return i
    return None


# One nearby value per constant; each must move at least one recorded score (with the defaults
# the scenario matches the file: test_gpuportal_golden). Drift: the scenario's adoptions move
# the distribution by 0.05 or more, so only a larger threshold changes them; the threshold
# itself is pinned to within 0.001 by test_drift_threshold_is_the_default below.
@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("half_life", 19000.0),
        ("coverage", 0.9),
        ("refresh_every", 1000),
        ("drift", 0.1),
        ("weight_frag", 0.75),
        ("quantum", 250.0),
        ("weight_host", 0.9),
        ("weight_leftover", 0.25),
        ("leftover_patience", 10.0),
        ("frag_tiebreak", 0.04),
        ("mig_serve", 0.6),
        ("mig_keep", 0.15),
        ("mig_fuller", 0.05),
    ],
)
def test_changing_a_default_moves_the_golden_scores(field: str, value: float) -> None:
    assert DOCUMENTED[field] != value
    assert _moves_the_default_scenario(GpuPortal(**{field: value})) is not None


@pytest.mark.parametrize(
    ("module", "name", "value"),
    [
        (gpuportal, "DELTA_SCALE_MILLI", 900.0),
        (topology_rank, "RANKS", 14),
        # PRIOR is pinned literally only: it scores just the requests before the first is
        # observed (the first refresh follows it), where Δ's rounding hides its details.
    ],
)
def test_changing_a_module_constant_moves_the_golden_scores(
    monkeypatch: pytest.MonkeyPatch, module: Any, name: str, value: object
) -> None:
    monkeypatch.setattr(module, name, value)
    assert _moves_the_default_scenario(GpuPortal()) is not None


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"half_life": 0.0}, r"invalid gpuportal half_life 0.0: expected a number of requests > 0"),
        ({"half_life": math.inf}, "gpuportal half_life"),
        ({"coverage": 0.0}, r"gpuportal coverage 0.0: expected a share in \(0, 1\]"),
        ({"coverage": 1.5}, "gpuportal coverage"),
        ({"refresh_every": 0}, r"gpuportal refresh_every 0: expected an integer >= 1"),
        ({"refresh_every": 2.5}, "gpuportal refresh_every"),
        ({"drift": -0.1}, "gpuportal drift"),
        ({"weight_frag": 1.2}, r"gpuportal weight_frag 1.2: expected a weight in \[0, 1\]"),
        ({"quantum": -200.0}, "gpuportal quantum"),
        ({"quantum": math.nan}, "gpuportal quantum"),
        ({"weight_host": -1.0}, "gpuportal weight_host"),
        ({"weight_leftover": -0.2}, "gpuportal weight_leftover"),
        ({"leftover_patience": 0.5}, r"gpuportal leftover_patience 0.5: expected a number >= 1"),
        # 0.08 > (1 − 0.08) / 13: a fragmentation gain could then outweigh a rank step.
        (
            {"frag_tiebreak": 0.08},
            r"gpuportal frag_tiebreak 0.08: expected a weight in \[0, 1/14\)",
        ),
        ({"mig_keep": -0.1}, "gpuportal mig_keep"),
        ({"mig_serve": 0.9}, r"gpuportal MIG weights \(0.9, 0.2, 0.1\): expected mig_serve"),
        ({"weight": 1.0}, r"invalid gpuportal option weight: expected one of coverage, drift"),
    ],
)
def test_bad_settings_are_refused(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidRequest, match=message):
        GpuPortal(**overrides)
    # The same through an explicit configuration object.
    with pytest.raises(InvalidRequest, match=message):
        GpuPortal(GpuPortalConfig(), **overrides)
    if "weight" not in overrides:
        with pytest.raises(InvalidRequest, match=message):
            GpuPortalConfig(**overrides)


@pytest.mark.parametrize(
    ("before", "adopted"),
    [
        # 48 requests of one shape, then one of another: the new distribution moved by 1/49 =
        # 0.0204 in total variation (a little more: the latest request weighs 2^(1/20 000)
        # more) — above the default drift 0.02, adopted.
        (48, True),
        # After 50: 1/51 = 0.0196 — below 0.02, kept back.
        (50, False),
    ],
)
def test_drift_threshold_is_the_default(before: int, adopted: bool) -> None:
    gp = GpuPortal(refresh_every=1, coverage=1.0)
    a = DeviceRequest(FlavorKind.SHARE, count=1, milli=470)
    b = DeviceRequest(FlavorKind.SHARE, count=1, milli=320)
    for _ in range(before):
        gp.observe(a, None)
    token = gp.cache_token()
    gp.observe(b, None)
    assert (gp.cache_token() != token) is adopted
    assert (len(gp.distribution) == 2) is adopted
