"""The ingest wire format refuses malformed batches with a reason naming the field."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from portal.telemetry.wire import MAX_SAMPLES_PER_BATCH, SampleBatch, device_id


def sample(**kw: object) -> dict[str, object]:
    base: dict[str, object] = {
        "gpu_uuid": "GPU-n1-0",
        "at": 1_800_000_000.0,
        "utilization_pct": 50.0,
        "memory_used_mib": 100.0,
        "memory_total_mib": 81920.0,
    }
    return {**base, **kw}


def batch(*samples: dict[str, object]) -> dict[str, object]:
    return {"node": "n1", "source": "nvml", "samples": list(samples)}


def test_a_well_formed_batch_parses_and_names_its_devices() -> None:
    b = SampleBatch.model_validate(
        batch(
            sample(processes=[{"pid": 7, "user": "alice", "server": ""}]),
            sample(gpu_instance_id=3, mig_uuid="MIG-abc"),
        )
    )
    assert [s.device for s in b.samples] == ["GPU-n1-0", "GPU-n1-0/gi3"]
    assert device_id("GPU-x", None) == "GPU-x"


@pytest.mark.parametrize(
    ("field", "value", "where"),
    [
        ("utilization_pct", 100.5, "samples.0.utilization_pct"),
        ("utilization_pct", -1, "samples.0.utilization_pct"),
        ("memory_used_mib", -5, "samples.0.memory_used_mib"),
        ("power_w", -0.1, "samples.0.power_w"),
        ("xid_count", -1, "samples.0.xid_count"),
        ("gpu_uuid", "", "samples.0.gpu_uuid"),
        ("gpu_uuid", "GPU 1; drop", "samples.0.gpu_uuid"),
        ("at", "yesterday", "samples.0.at"),
        ("at", 1.797e305, "samples.0.at"),  # once overflowed converting to milliseconds
        ("colour", "red", "samples.0.colour"),
    ],
)
def test_a_malformed_value_is_refused_naming_the_field(
    field: str, value: object, where: str
) -> None:
    with pytest.raises(ValidationError) as err:
        SampleBatch.model_validate(batch(sample(**{field: value})))
    assert where in str(err.value)


def test_nan_and_infinity_are_refused_from_json() -> None:
    for token in ("NaN", "Infinity", "-Infinity"):
        raw = json.dumps(batch(sample())).replace("50.0", token)
        with pytest.raises(ValidationError, match="utilization_pct"):
            SampleBatch.model_validate_json(raw)


def test_utilization_null_or_absent_is_not_measured_and_a_number_is_kept() -> None:
    """An old agent's payload (always a number) parses as before; a device NVML cannot
    measure is sent with null or without the field, and stays None, never 0."""
    without = sample()
    del without["utilization_pct"]
    b = SampleBatch.model_validate(batch(sample(), sample(utilization_pct=None), without))
    assert [s.utilization_pct for s in b.samples] == [50.0, None, None]
    with pytest.raises(ValidationError, match="utilization_pct"):
        SampleBatch.model_validate(batch(sample(utilization_pct="unknown")))


def test_inconsistent_samples_are_refused() -> None:
    with pytest.raises(ValidationError, match="exceeds memory_total_mib"):
        SampleBatch.model_validate(batch(sample(memory_used_mib=90000)))
    with pytest.raises(ValidationError, match="needs its gpu_instance_id"):
        SampleBatch.model_validate(batch(sample(mig_uuid="MIG-abc")))
    with pytest.raises(ValidationError, match="needs an attribution"):
        SampleBatch.model_validate(batch(sample(processes=[{"pid": 1}])))
    with pytest.raises(ValidationError, match="pod and namespace go together"):
        SampleBatch.model_validate(batch(sample(processes=[{"pod": "p"}])))


def test_a_batch_is_bounded() -> None:
    with pytest.raises(ValidationError, match="samples"):
        SampleBatch.model_validate(batch(*[sample()] * (MAX_SAMPLES_PER_BATCH + 1)))
    with pytest.raises(ValidationError, match="source"):
        SampleBatch.model_validate({**batch(sample()), "source": "guess"})
