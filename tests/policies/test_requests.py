"""Requests: the shapes a member may ask for, their quota units, and refused shapes."""

from __future__ import annotations

from typing import Any

import pytest

from policies.errors import InvalidRequest
from policies.flavors import Flavor, FlavorKind
from policies.requests import (
    MAX_GANG_SIZE,
    MAX_GPUS_PER_MEMBER,
    MAX_PRIORITY,
    DeviceRequest,
    TopologyRequirement,
    WorkloadRequest,
)

H100 = frozenset({"H100-80GB"})


@pytest.mark.parametrize(
    ("req", "gpus", "amount", "flavor", "equivalent"),
    [
        (DeviceRequest(), 0, 0, None, 0.0),
        (DeviceRequest(FlavorKind.GPU, count=4), 4, 4, "H100-80GB", 4.0),
        # 3g of 7 compute slices counts as 3/7 of a GPU, one instance of quota.
        (
            DeviceRequest(FlavorKind.MIG, models=H100, mig_profile="3g.40gb"),
            1,
            1,
            "H100-80GB/3g.40gb",
            3 / 7,
        ),
        # 250 milli is a quarter GPU; quota counts the milli.
        (
            DeviceRequest(FlavorKind.SHARE, milli=250, gpu_memory_mib=4096),
            1,
            250,
            "H100-80GB/share",
            0.25,
        ),
    ],
)
def test_each_shape_counts_its_gpus_quota_units_and_gpu_equivalents(
    req: DeviceRequest, gpus: int, amount: int, flavor: str | None, equivalent: float
) -> None:
    assert req.gpus == gpus
    assert req.amount() == amount
    f = req.flavor("H100-80GB")
    assert (str(f) if f else None) == flavor
    if f is not None:
        assert Flavor.parse(str(f)) == f
    assert req.gpu_equivalent("H100-80GB") == pytest.approx(equivalent)


@pytest.mark.parametrize(
    ("fields", "in_message"),
    [
        ({"kind": FlavorKind.GPU, "count": 0}, f"1 to {MAX_GPUS_PER_MEMBER}"),
        ({"kind": FlavorKind.GPU, "count": -1}, "GPU count -1"),
        ({"kind": FlavorKind.GPU, "count": MAX_GPUS_PER_MEMBER + 1}, "GPU count 17"),
        ({"kind": FlavorKind.GPU, "count": 10**9}, "GPU count"),
        ({"kind": FlavorKind.GPU, "count": 1, "milli": 500}, "one shape"),
        ({"kind": FlavorKind.GPU, "count": 1, "mig_profile": "1g.10gb"}, "one shape"),
        ({"count": 1}, "CPU-only"),
        ({"milli": 10}, "CPU-only"),
        ({"gpu_memory_mib": 1024}, "CPU-only"),
        ({"cpu_milli": -1}, "values >= 0"),
        ({"memory_mib": -5}, "values >= 0"),
        ({"kind": FlavorKind.SHARE, "milli": 0}, "1 to 999"),
        ({"kind": FlavorKind.SHARE, "milli": 1000}, "1 to 999"),
        ({"kind": FlavorKind.SHARE, "milli": -3}, "1 to 999"),
        ({"kind": FlavorKind.SHARE, "milli": 500, "gpu_memory_mib": -1}, ">= 0 MiB"),
        ({"kind": FlavorKind.SHARE, "milli": 500, "count": 3}, "one share of one GPU"),
        ({"kind": FlavorKind.SHARE, "milli": 500, "mig_profile": "3g.40gb"}, "one share"),
        ({"kind": FlavorKind.MIG, "models": H100}, "one instance of a named profile"),
        ({"kind": FlavorKind.MIG, "mig_profile": "3g.40gb", "count": 2, "models": H100}, "count=2"),
        ({"kind": FlavorKind.MIG, "mig_profile": "3g.40gb"}, "the model(s) of the profile"),
        # 3g.20gb is an A100-40GB profile; the error lists H100-80GB's.
        ({"kind": FlavorKind.MIG, "mig_profile": "3g.20gb", "models": H100}, "3g.40gb"),
        (
            {"kind": FlavorKind.MIG, "mig_profile": "1g.5gb", "models": frozenset({"T4"})},
            "MIG-capable",
        ),
        (
            {"kind": FlavorKind.MIG, "mig_profile": "3g.40gb", "models": H100, "milli": 5},
            "one shape",
        ),
        # NVLink joins GPUs of one member: meaningless for one GPU, a share or a MIG slice.
        ({"kind": FlavorKind.GPU, "count": 1, "topology": TopologyRequirement.NVLINK}, "2 or more"),
        (
            {"kind": FlavorKind.SHARE, "milli": 5, "topology": TopologyRequirement.NVLINK},
            "2 or more",
        ),
    ],
)
def test_a_bad_device_request_is_refused_saying_what_would_be_valid(
    fields: dict[str, Any], in_message: str
) -> None:
    with pytest.raises(InvalidRequest) as err:
        DeviceRequest(**fields)
    assert in_message in err.value.message


def test_a_mig_request_over_several_models_checks_the_profile_on_each() -> None:
    # 1g.10gb exists on A100-80GB and H100-80GB (both 10 GiB per slice), not on A100-40GB.
    both = frozenset({"A100-80GB", "H100-80GB"})
    DeviceRequest(FlavorKind.MIG, models=both, mig_profile="1g.10gb")
    with pytest.raises(InvalidRequest):
        DeviceRequest(FlavorKind.MIG, models=both | {"A100-40GB"}, mig_profile="7g.80gb")


def _workload(**fields: Any) -> WorkloadRequest:
    return WorkloadRequest(
        **{"tenant": "t", "owner": "o", "name": "nb", "devices": DeviceRequest(), **fields}
    )


@pytest.mark.parametrize(
    ("fields", "in_message"),
    [
        ({"gang_size": 0}, f"1 to {MAX_GANG_SIZE}"),
        ({"gang_size": MAX_GANG_SIZE + 1}, f"1 to {MAX_GANG_SIZE}"),
        ({"priority": MAX_PRIORITY + 1}, "priority"),
        ({"priority": -MAX_PRIORITY - 1}, "priority"),
        ({"name": ""}, "1 to 253 characters"),
        ({"name": "x" * 254}, "1 to 253 characters"),
    ],
)
def test_a_bad_workload_request_is_refused(fields: dict[str, Any], in_message: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        _workload(**fields)
    assert in_message in err.value.message


def test_workload_limits_are_inclusive() -> None:
    _workload(gang_size=MAX_GANG_SIZE, priority=MAX_PRIORITY, name="x" * 253)
    _workload(gang_size=1, priority=-MAX_PRIORITY)


def test_labels_do_not_change_equality() -> None:
    assert _workload(labels={"a": "1"}) == _workload(labels={"b": "2"})
