"""MIG geometry per GPU model, as NVIDIA documents it (MIG user guide, "Supported profiles").

A MIG-capable GPU has a number of compute slices (7, or 4 on A30) and memory slices (8, or 4 on
A30). A profile ``Ng.Mgb`` takes N compute slices and a contiguous run of memory slices that must
start at one of the profile's documented *placements* (start slots). Two instances fit together
when their memory-slice runs do not overlap and the compute slices add up to at most the total.
"+me" profiles carry the media engines and exist at most once per GPU.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

from policies.errors import InvalidRequest


@dataclass(frozen=True, slots=True)
class MigProfile:
    """One MIG profile of one model."""

    name: str
    compute_slices: int
    memory_slices: int
    memory_mib: int
    placements: tuple[int, ...]
    max_per_gpu: int | None = None

    def slot_mask(self, start: int) -> int:
        """Bitmask of the memory slices an instance started at ``start`` occupies."""
        return ((1 << self.memory_slices) - 1) << start


@dataclass(frozen=True, slots=True)
class MigGeometry:
    """The MIG profiles of one GPU model."""

    model: str
    compute_slices: int
    memory_slices: int
    profiles: Mapping[str, MigProfile]

    def profile(self, name: str) -> MigProfile:
        try:
            return self.profiles[name]
        except KeyError:
            raise InvalidRequest(
                "MIG profile",
                f"{name!r} for {self.model}",
                "one of " + ", ".join(sorted(self.profiles)),
            ) from None

    def gpu_equivalent(self, name: str) -> float:
        """Share of a whole GPU's compute that one instance of the profile is worth."""
        return self.profile(name).compute_slices / self.compute_slices


@dataclass(frozen=True, slots=True)
class MigInstance:
    """A MIG instance placed on a GPU: its profile and the memory slice it starts at."""

    profile: str
    start: int
    uuid: str | None = None


_MEDIA = "+me"


def _geometry(
    model: str,
    compute: int,
    memory: int,
    slice_mib: int,
    rows: Iterable[tuple[str, int, int, tuple[int, ...]]],
) -> MigGeometry:
    profiles = {}
    for name, g, m, placements in rows:
        profiles[name] = MigProfile(
            name=name,
            compute_slices=g,
            memory_slices=m,
            memory_mib=m * slice_mib,
            placements=placements,
            max_per_gpu=1 if name.endswith(_MEDIA) else None,
        )
    return MigGeometry(model=model, compute_slices=compute, memory_slices=memory, profiles=profiles)


def _seven_slice(model: str, small_gb: int, slice_mib: int) -> MigGeometry:
    """The A100/H100/H200 family: 7 compute and 8 memory slices, same placement table."""
    s = small_gb
    full = {5: 40, 10: 80, 12: 94, 18: 141}[s]
    half = {5: 20, 10: 40, 12: 47, 18: 71}[s]
    double = {5: 10, 10: 20, 12: 24, 18: 35}[s]
    rows = [
        (f"1g.{s}gb", 1, 1, (0, 1, 2, 3, 4, 5, 6)),
        (f"1g.{s}gb+me", 1, 1, (0, 1, 2, 3, 4, 5, 6)),
        (f"1g.{double}gb", 1, 2, (0, 2, 4, 6)),
        (f"2g.{double}gb", 2, 2, (0, 2, 4)),
        (f"3g.{half}gb", 3, 4, (0, 4)),
        (f"4g.{half}gb", 4, 4, (0,)),
        (f"7g.{full}gb", 7, 8, (0,)),
    ]
    return _geometry(model, 7, 8, slice_mib, rows)


GEOMETRIES: dict[str, MigGeometry] = {
    g.model: g
    for g in (
        _seven_slice("A100-40GB", 5, 5 * 1024),
        _seven_slice("A100-80GB", 10, 10 * 1024),
        _seven_slice("H100-80GB", 10, 10 * 1024),
        _seven_slice("H100-94GB", 12, 12 * 1024),
        _seven_slice("H200-141GB", 18, 18 * 1024),
        _geometry(
            "A30-24GB",
            4,
            4,
            6 * 1024,
            [
                ("1g.6gb", 1, 1, (0, 1, 2, 3)),
                ("1g.6gb+me", 1, 1, (0, 1, 2, 3)),
                ("2g.12gb", 2, 2, (0, 2)),
                ("2g.12gb+me", 2, 2, (0, 2)),
                ("4g.24gb", 4, 4, (0,)),
            ],
        ),
    )
}


def geometry(model: str) -> MigGeometry:
    """MIG geometry of a model, or a clear error for a model without MIG."""
    try:
        return GEOMETRIES[model]
    except KeyError:
        raise InvalidRequest(
            "MIG-capable model", model, "one of " + ", ".join(sorted(GEOMETRIES))
        ) from None


def is_mig_capable(model: str) -> bool:
    return model in GEOMETRIES


def occupancy(geom: MigGeometry, layout: Iterable[MigInstance]) -> tuple[int, int]:
    """(memory-slice bitmask, compute slices used) of a layout."""
    mask = 0
    compute = 0
    for inst in layout:
        p = geom.profile(inst.profile)
        mask |= p.slot_mask(inst.start)
        compute += p.compute_slices
    return mask, compute


def free_starts(geom: MigGeometry, profile: str, layout: Iterable[MigInstance]) -> Iterator[int]:
    """Start slots where a new instance of ``profile`` fits next to ``layout``."""
    p = geom.profile(profile)
    instances = list(layout)
    mask, compute = occupancy(geom, instances)
    if compute + p.compute_slices > geom.compute_slices:
        return
    if p.max_per_gpu is not None and sum(i.profile == profile for i in instances) >= p.max_per_gpu:
        return
    # A GPU has one JPEG decoder and one OFA; a "+me" instance takes both, so a second "+me"
    # instance of any profile cannot exist (e.g. 1g.6gb+me next to 2g.12gb+me on an A30).
    if profile.endswith(_MEDIA) and any(i.profile.endswith(_MEDIA) for i in instances):
        return
    for start in p.placements:
        if not mask & p.slot_mask(start):
            yield start


def validate_layout(geom: MigGeometry, layout: Iterable[MigInstance]) -> None:
    """Raise if the layout is not one NVIDIA allows (bad start, overlap, too much compute)."""
    placed: list[MigInstance] = []
    for inst in layout:
        p = geom.profile(inst.profile)
        if inst.start not in p.placements:
            raise InvalidRequest(
                "MIG placement",
                f"{inst.profile}@{inst.start} on {geom.model}",
                f"a start slot in {list(p.placements)}",
            )
        free = list(free_starts(geom, inst.profile, placed))
        if inst.start not in free:
            after = ", ".join(f"{i.profile}@{i.start}" for i in placed)
            raise InvalidRequest(
                "MIG layout",
                f"{inst.profile}@{inst.start} after [{after}] on {geom.model}",
                f"a free start slot in {free} (memory slices must not overlap, at most "
                f"{geom.compute_slices} compute slices, one '+me' instance per GPU)",
            )
        placed.append(inst)
