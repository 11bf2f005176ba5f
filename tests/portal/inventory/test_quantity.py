from __future__ import annotations

from decimal import Decimal

import pytest

from policies.errors import InvalidRequest
from portal.inventory import quantity


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("64", Decimal(64)),
        ("500m", Decimal("0.5")),
        ("1.5", Decimal("1.5")),
        ("512Gi", Decimal(512 * 2**30)),
        ("1e3", Decimal(1000)),
        ("1E-2", Decimal("0.01")),
        ("2k", Decimal(2000)),
        ("100M", Decimal(100_000_000)),
        ("250u", Decimal("0.00025")),
        (".5", Decimal("0.5")),
        ("+3", Decimal(3)),
        (8, Decimal(8)),
    ],
)
def test_parse(text: str | int, value: Decimal) -> None:
    assert quantity.parse(text) == value


def test_cpu_rounds_up_to_millicores_and_memory_down_to_mib() -> None:
    assert quantity.cpu_milli("64") == 64_000
    assert quantity.cpu_milli("500m") == 500
    assert quantity.cpu_milli("0.0005") == 1  # Kubernetes rounds CPU up to 1m
    assert quantity.memory_mib("512Gi") == 524_288
    assert quantity.memory_mib("1G") == 953  # 10^9 bytes / 2^20, rounded down
    assert quantity.memory_mib("131072Ki") == 128


@pytest.mark.parametrize("text", ["", "abc", "1.2.3", "5 Gi", "5gi", "1e", "Gi", "--1", "0x10"])
def test_bad_quantities_name_the_field_the_value_and_examples(text: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        quantity.cpu_milli(text, field="node n1 allocatable cpu")
    assert info.value.message == (
        f"invalid node n1 allocatable cpu {text!r}: expected a Kubernetes quantity such as "
        "'64', '500m', '1.5', '512Gi', '1e3'"
    )


def test_negative_and_fractional_counts_are_rejected() -> None:
    with pytest.raises(InvalidRequest, match="expected a memory quantity >= 0"):
        quantity.memory_mib("-1Gi")
    with pytest.raises(InvalidRequest, match="expected a whole number >= 0"):
        quantity.count("1.5", field="nvidia.com/gpu.count")
    assert quantity.count("8") == 8
