"""MIG geometry checked against NVIDIA's MIG user guide ("Supported MIG Profiles").

The A100/H100/H200 family has 7 compute slices and 8 memory slices; ``nvidia-smi mig -lgipp``
lists each profile's placements as ``{starts}:size`` in memory slices:
1g {0..6}:1, 1g (double memory) {0,2,4,6}:2, 2g {0,2,4}:2, 3g {0,4}:4, 4g {0}:4, 7g {0}:8.
The A30 has 4 compute and 4 memory slices: 1g {0,1,2,3}:1, 2g {0,2}:2, 4g {0}:4.
NVIDIA's rule: a new instance fits when its memory slices do not overlap any existing
instance's and the compute slices add up to at most the total.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies import mig
from policies.errors import InvalidRequest
from policies.mig import MigInstance

H100 = mig.geometry("H100-80GB")
A30 = mig.geometry("A30-24GB")


def fits(geom: mig.MigGeometry, profile: str, layout: list[tuple[str, int]]) -> list[int]:
    return list(mig.free_starts(geom, profile, [MigInstance(p, s) for p, s in layout]))


def layout_ok(geom: mig.MigGeometry, layout: list[tuple[str, int]]) -> bool:
    try:
        mig.validate_layout(geom, [MigInstance(p, s) for p, s in layout])
    except InvalidRequest:
        return False
    return True


# -- the documented profile tables ------------------------------------------------------------

# (model, {profile: (compute slices, memory slices, placements)}) from the guide's tables.
SEVEN = {
    "1g": (1, 1, (0, 1, 2, 3, 4, 5, 6)),
    "1g+me": (1, 1, (0, 1, 2, 3, 4, 5, 6)),
    "1g2": (1, 2, (0, 2, 4, 6)),
    "2g": (2, 2, (0, 2, 4)),
    "3g": (3, 4, (0, 4)),
    "4g": (4, 4, (0,)),
    "7g": (7, 8, (0,)),
}
NAMES = {
    # model: names for 1g, 1g+me, 1g with double memory, 2g, 3g, 4g, 7g
    "A100-40GB": ("1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"),
    "A100-80GB": ("1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
    "H100-80GB": ("1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
    "H100-94GB": ("1g.12gb", "1g.12gb+me", "1g.24gb", "2g.24gb", "3g.47gb", "4g.47gb", "7g.94gb"),
    "H200-141GB": (
        "1g.18gb",
        "1g.18gb+me",
        "1g.35gb",
        "2g.35gb",
        "3g.71gb",
        "4g.71gb",
        "7g.141gb",
    ),
}


@pytest.mark.parametrize("model", sorted(NAMES))
def test_seven_slice_models_have_exactly_the_documented_profiles(model: str) -> None:
    geom = mig.geometry(model)
    assert (geom.compute_slices, geom.memory_slices) == (7, 8)
    assert set(geom.profiles) == set(NAMES[model])
    for key, name in zip(SEVEN, NAMES[model], strict=True):
        p = geom.profile(name)
        assert (p.compute_slices, p.memory_slices, p.placements) == SEVEN[key], name


def test_a30_has_exactly_the_documented_profiles() -> None:
    expected = {
        "1g.6gb": (1, 1, (0, 1, 2, 3)),
        "1g.6gb+me": (1, 1, (0, 1, 2, 3)),
        "2g.12gb": (2, 2, (0, 2)),
        "2g.12gb+me": (2, 2, (0, 2)),
        "4g.24gb": (4, 4, (0,)),
    }
    assert (A30.compute_slices, A30.memory_slices) == (4, 4)
    got = {n: (p.compute_slices, p.memory_slices, p.placements) for n, p in A30.profiles.items()}
    assert got == expected


# -- H100-80GB combinations from the placement diagram ---------------------------------------


@pytest.mark.parametrize(
    ("layout", "ok"),
    [
        # 4g@0 takes slices 0-3, 3g@4 takes 4-7; compute 4+3 = 7 of 7.
        ([("4g.40gb", 0), ("3g.40gb", 4)], True),
        # Seven 1g.10gb at 0..6: compute 7 of 7, slices 0-6 used.
        ([("1g.10gb", s) for s in range(7)], True),
        # An eighth 1g: start 7 is not a documented placement, and compute would be 8 > 7.
        ([("1g.10gb", s) for s in range(7)] + [("1g.10gb", 7)], False),
        # 4g only starts at 0: two overlap (and 4+4 = 8 > 7 compute).
        ([("4g.40gb", 0), ("4g.40gb", 0)], False),
        # 3g@0 and 3g@4: slices 0-3 and 4-7, compute 6 of 7.
        ([("3g.40gb", 0), ("3g.40gb", 4)], True),
        # 3g@0 + 2g@4 + 1g@6 + 1g... compute 3+2+1 = 6; 1g@7 is not a placement.
        ([("3g.40gb", 0), ("2g.20gb", 4), ("1g.10gb", 6)], True),
        # 3g@4 + 2g@0 + 2g@2: compute 3+2+2 = 7, slices 0-1, 2-3, 4-7.
        ([("3g.40gb", 4), ("2g.20gb", 0), ("2g.20gb", 2)], True),
        # 7g.80gb takes everything: nothing beside it, not even a 1g.
        ([("7g.80gb", 0)], True),
        ([("7g.80gb", 0), ("1g.10gb", 0)], False),
        # Four 1g.20gb (2 memory slices each, starts 0/2/4/6): compute 4, slices 0-7.
        ([("1g.20gb", s) for s in (0, 2, 4, 6)], True),
        # 1g.20gb@6 takes slices 6-7; 1g.10gb@6 overlaps it.
        ([("1g.20gb", 6), ("1g.10gb", 6)], False),
        # 4g@0 (slices 0-3) and 2g@2 overlap on slices 2-3.
        ([("4g.40gb", 0), ("2g.20gb", 2)], False),
    ],
)
def test_h100_layouts_follow_the_placement_diagram(layout: list[tuple[str, int]], ok: bool) -> None:
    assert layout_ok(H100, layout) is ok


def test_a_3g_and_a_4g_fit_together_only_with_the_4g_first_in_memory() -> None:
    # 4g has one placement (0); with 3g@0 holding slices 0-3 there is nowhere for the 4g.
    assert fits(H100, "3g.40gb", [("4g.40gb", 0)]) == [4]
    assert fits(H100, "4g.40gb", [("3g.40gb", 0)]) == []
    assert fits(H100, "4g.40gb", [("3g.40gb", 4)]) == [0]


def test_seven_1g_fit_and_an_eighth_does_not() -> None:
    layout: list[tuple[str, int]] = []
    for expected_first in range(7):
        starts = fits(H100, "1g.10gb", layout)
        assert starts[0] == expected_first
        layout.append(("1g.10gb", starts[0]))
    # 7 compute slices used: even the free memory slice 7 cannot take another instance.
    assert fits(H100, "1g.10gb", layout) == []


def test_a_4g_does_not_fit_next_to_a_4g() -> None:
    assert fits(H100, "4g.40gb", []) == [0]
    assert fits(H100, "4g.40gb", [("4g.40gb", 0)]) == []


def test_3g_starts_only_at_0_and_4() -> None:
    assert fits(H100, "3g.40gb", []) == [0, 4]
    for bad in (1, 2, 3, 5, 6, 7):
        assert not layout_ok(H100, [("3g.40gb", bad)])


def test_after_two_3g_nothing_fits() -> None:
    # 3+3 = 6 of 7 compute slices are used, so compute alone would allow a 1g, but the two
    # 3g instances hold memory slices 0-3 and 4-7: no memory slice is free for any profile.
    layout = [("3g.40gb", 0), ("3g.40gb", 4)]
    for profile in H100.profiles:
        assert fits(H100, profile, layout) == [], profile


def test_2g_starts_at_0_2_and_4() -> None:
    assert fits(H100, "2g.20gb", []) == [0, 2, 4]
    # With 2g at 0 and 2 the third goes to 4; compute 2+2+2 = 6, slices 6-7 left for a 1g.
    assert fits(H100, "2g.20gb", [("2g.20gb", 0), ("2g.20gb", 2)]) == [4]
    assert fits(H100, "1g.10gb", [("2g.20gb", s) for s in (0, 2, 4)]) == [6]
    assert not layout_ok(H100, [("2g.20gb", 6)])


def test_7g_fits_only_on_an_empty_gpu() -> None:
    assert fits(H100, "7g.80gb", []) == [0]
    for profile in H100.profiles:
        first = H100.profile(profile).placements[-1]
        assert fits(H100, "7g.80gb", [(profile, first)]) == [], profile


def test_a_plus_me_profile_exists_at_most_once() -> None:
    assert fits(H100, "1g.10gb+me", [("1g.10gb+me", 0)]) == []
    assert fits(H100, "1g.10gb", [("1g.10gb+me", 0)]) == [1, 2, 3, 4, 5, 6]
    assert not layout_ok(H100, [("1g.10gb+me", 0), ("1g.10gb+me", 1)])


def test_a30_takes_one_plus_me_instance_of_any_profile() -> None:
    # The A30 has one JPEG decoder and one OFA (the 4g.24gb table row lists "1 JPEG / 1 OFA"),
    # and each "+me" profile takes both, so 1g.6gb+me and 2g.12gb+me cannot coexist.
    assert fits(A30, "2g.12gb+me", [("1g.6gb+me", 0)]) == []
    assert fits(A30, "2g.12gb", [("1g.6gb+me", 0)]) == [2]


@pytest.mark.parametrize(
    ("layout", "ok"),
    [
        ([("1g.6gb", s) for s in range(4)], True),  # 4 × 1 compute = 4 of 4
        ([("1g.6gb", s) for s in range(4)] + [("1g.6gb", 0)], False),
        ([("2g.12gb", 0), ("2g.12gb", 2)], True),  # 2 × 2 = 4 of 4
        ([("2g.12gb", 1)], False),  # 2g starts at 0 or 2 only
        ([("4g.24gb", 0)], True),
        ([("4g.24gb", 0), ("1g.6gb", 0)], False),
        ([("2g.12gb", 0), ("1g.6gb", 2), ("1g.6gb", 3)], True),  # 2+1+1 = 4
    ],
)
def test_a30_layouts_follow_the_placement_diagram(layout: list[tuple[str, int]], ok: bool) -> None:
    assert layout_ok(A30, layout) is ok


def test_a100_40gb_profile_names() -> None:
    assert sorted(mig.geometry("A100-40GB").profiles) == sorted(
        ["1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"]
    )


@pytest.mark.parametrize(
    ("model", "profile", "equivalent"),
    [
        ("H100-80GB", "3g.40gb", 3 / 7),  # 3 of 7 compute slices
        ("H100-80GB", "7g.80gb", 1.0),
        ("H100-80GB", "1g.20gb", 1 / 7),  # double memory, still one compute slice
        ("A30-24GB", "2g.12gb", 2 / 4),  # 2 of 4 compute slices
        ("A30-24GB", "1g.6gb", 1 / 4),
        ("H200-141GB", "4g.71gb", 4 / 7),
    ],
)
def test_gpu_equivalent_is_compute_slices_over_the_total(
    model: str, profile: str, equivalent: float
) -> None:
    assert mig.geometry(model).gpu_equivalent(profile) == pytest.approx(equivalent)


def test_memory_of_a_profile_is_its_memory_slices_times_the_slice_size() -> None:
    # H100-80GB: 10 GiB per memory slice; 3g.40gb takes 4 slices.
    assert H100.profile("3g.40gb").memory_mib == 4 * 10 * 1024
    assert A30.profile("1g.6gb").memory_mib == 6 * 1024


# -- errors ------------------------------------------------------------------------------------


def test_a_bad_start_names_the_profile_and_its_valid_starts() -> None:
    with pytest.raises(InvalidRequest) as err:
        mig.validate_layout(H100, [MigInstance("3g.40gb", 2)])
    assert "3g.40gb@2" in err.value.message
    assert "[0, 4]" in err.value.message


def test_an_overlap_names_the_profile_and_the_free_starts() -> None:
    with pytest.raises(InvalidRequest) as err:
        mig.validate_layout(H100, [MigInstance("4g.40gb", 0), MigInstance("2g.20gb", 2)])
    msg = err.value.message
    assert "2g.20gb@2" in msg and "4g.40gb@0" in msg
    assert "[4]" in msg  # only 2g@4 is free next to 4g@0


def test_too_much_compute_is_refused() -> None:
    # 4g@0 + 2g@4 + 1g@6 = 7 compute; another 1g would be 8 even though slice 7 is free.
    layout = [("4g.40gb", 0), ("2g.20gb", 4), ("1g.10gb", 6)]
    assert layout_ok(H100, layout)
    assert fits(H100, "1g.10gb", layout) == []


def test_an_unknown_profile_lists_the_models_profiles() -> None:
    with pytest.raises(InvalidRequest) as err:
        H100.profile("3g.20gb")
    assert "3g.20gb" in err.value.message and "H100-80GB" in err.value.message
    assert "3g.40gb" in err.value.message and "7g.80gb" in err.value.message


def test_an_unknown_model_lists_the_mig_capable_ones() -> None:
    with pytest.raises(InvalidRequest) as err:
        mig.geometry("T4")
    assert "T4" in err.value.message
    for model in ("A100-40GB", "A30-24GB", "H100-80GB", "H200-141GB"):
        assert model in err.value.message
    assert not mig.is_mig_capable("T4") and mig.is_mig_capable("A30-24GB")


# -- property: greedy placement through free_starts is always valid ----------------------------


@settings(max_examples=300, deadline=None)
@given(
    model=st.sampled_from(sorted(mig.GEOMETRIES)),
    picks=st.lists(st.tuples(st.integers(0, 100), st.integers(0, 100)), max_size=12),
)
def test_placements_chosen_from_free_starts_always_form_a_valid_layout(
    model: str, picks: list[tuple[int, int]]
) -> None:
    geom = mig.geometry(model)
    names = sorted(geom.profiles)
    layout: list[MigInstance] = []
    for which, where in picks:
        profile = names[which % len(names)]
        starts = list(mig.free_starts(geom, profile, layout))
        if not starts:
            continue
        layout.append(MigInstance(profile, starts[where % len(starts)]))
    mig.validate_layout(geom, layout)
    used = 0
    compute = 0
    for inst in layout:
        p = geom.profile(inst.profile)
        assert inst.start + p.memory_slices <= geom.memory_slices
        mask = p.slot_mask(inst.start)
        assert not used & mask, f"overlap in {layout}"
        used |= mask
        compute += p.compute_slices
    assert compute <= geom.compute_slices
    assert sum(i.profile.endswith("+me") for i in layout) <= 1
