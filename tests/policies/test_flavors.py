"""Flavors: canonical names, units, and bad names refused with a useful message."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from policies import mig
from policies.errors import InvalidRequest
from policies.flavors import Flavor, FlavorKind


@pytest.mark.parametrize(
    ("name", "kind", "model", "profile", "unit"),
    [
        ("H100-80GB", FlavorKind.GPU, "H100-80GB", None, "gpus"),
        ("H100-80GB/3g.40gb", FlavorKind.MIG, "H100-80GB", "3g.40gb", "instances"),
        ("A30-24GB/1g.6gb+me", FlavorKind.MIG, "A30-24GB", "1g.6gb+me", "instances"),
        ("T4/share", FlavorKind.SHARE, "T4", None, "milli-gpu"),
        ("L40S", FlavorKind.GPU, "L40S", None, "gpus"),
    ],
)
def test_a_canonical_name_parses_and_prints_back(
    name: str, kind: FlavorKind, model: str, profile: str | None, unit: str
) -> None:
    f = Flavor.parse(name)
    assert (f.kind, f.model, f.profile, f.unit) == (kind, model, profile, unit)
    assert str(f) == name
    assert Flavor.parse(str(f)) == f


@given(
    st.sampled_from(
        [Flavor(FlavorKind.GPU, m) for m in ("T4", "H100-80GB", "A10G")]
        + [Flavor(FlavorKind.SHARE, m) for m in ("T4", "L4")]
        + [Flavor(FlavorKind.MIG, g.model, p) for g in mig.GEOMETRIES.values() for p in g.profiles]
    )
)
def test_every_flavor_round_trips_through_its_name(f: Flavor) -> None:
    assert Flavor.parse(str(f)) == f


@given(st.from_regex(r"[A-Za-z0-9][A-Za-z0-9.\-]{0,62}", fullmatch=True))
def test_any_valid_model_name_round_trips_as_a_whole_gpu_and_a_share(model: str) -> None:
    for kind in (FlavorKind.GPU, FlavorKind.SHARE):
        f = Flavor(kind, model)
        assert Flavor.parse(str(f)) == f


@pytest.mark.parametrize(
    ("name", "in_message"),
    [
        ("", "MODEL/share"),
        ("H100-80GB/", "MODEL/share"),
        ("/share", "GPU model name"),
        ("-H100", "GPU model name"),  # must start with a letter or digit
        ("H100 80GB", "GPU model name"),  # no spaces
        ("H100-80GB\n", "GPU model name"),  # a trailing newline is not part of a name
        ("Ｈ100", "GPU model name"),  # full-width letter: not ASCII
        ("A" * 64, "GPU model name"),  # 64 characters, one over the limit
        ("H100-80GB/3g.20gb", "3g.40gb"),  # an A100-40GB profile: lists H100's profiles
        ("H100-80GB/3g.40gb/x", "3g.40gb"),
        ("T4/1g.5gb", "A100-40GB"),  # T4 has no MIG: lists the MIG-capable models
    ],
)
def test_a_bad_name_is_refused_saying_what_would_be_valid(name: str, in_message: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        Flavor.parse(name)
    assert in_message in err.value.message


def test_a_non_string_name_is_refused() -> None:
    with pytest.raises(InvalidRequest):
        Flavor.parse(None)  # type: ignore[arg-type]


def test_a_profile_goes_with_the_mig_kind_only() -> None:
    with pytest.raises(InvalidRequest):
        Flavor(FlavorKind.MIG, "H100-80GB")
    with pytest.raises(InvalidRequest):
        Flavor(FlavorKind.GPU, "H100-80GB", "3g.40gb")
    with pytest.raises(InvalidRequest):
        Flavor(FlavorKind.SHARE, "T4", "1g.5gb")


def test_flavors_sort_by_kind_then_model() -> None:
    names = ["T4/share", "H100-80GB/3g.40gb", "T4", "A100-40GB"]
    ordered = [str(f) for f in sorted(Flavor.parse(n) for n in names)]
    # StrEnum order: "gpu" < "mig" < "share".
    assert ordered == ["A100-40GB", "T4", "H100-80GB/3g.40gb", "T4/share"]
