"""The weight-cache benchmark runs and counts what it claims: bytes served = size x nodes."""

from __future__ import annotations

from benchmarks.weight_cache import run


def test_the_benchmark_serves_the_model_once_per_node() -> None:
    got = run(mib=1, replicas=6, nodes=3)
    assert got["bytes_served"] == got["size_x_nodes"] == 3 * (1 << 20)
