"""Synthetic samples of a simulated inventory, for ``gpuportal agent --demo``.

Each device follows its own slow wave (period 10 minutes, phase from a hash of its id), so
dashboards and alerts have something that moves, reproducibly: the same device at the same
time always reads the same. GPUs without a UUID (simulated inventories rarely give one) are
named ``GPU-sim-<node>-<index>``. No processes are reported: there are none to attribute.
"""

from __future__ import annotations

import math
import time
import zlib
from collections.abc import Callable, Sequence

from policies import mig
from policies.inventory import GPU, Node
from portal.telemetry.wire import GpuSample, SampleBatch, Source

PERIOD_S = 600.0


def gpu_uuid(node: Node, gpu: GPU) -> str:
    """The GPU's UUID, or the stable stand-in the demo uses for it."""
    return gpu.uuid or f"GPU-sim-{node.name}-{gpu.index}"


def _wave(key: str, at: float) -> float:
    """0..100, smooth in time, different per ``key``."""
    phase = zlib.crc32(key.encode()) / 2**32
    return round(50.0 + 45.0 * math.sin(2 * math.pi * (at / PERIOD_S + phase)), 1)


class DemoSource:
    """One ``SampleBatch`` per simulated node per call."""

    def __init__(self, nodes: Sequence[Node], clock: Callable[[], float] = time.time) -> None:
        self._nodes = list(nodes)
        self._clock = clock

    def batches(self) -> list[SampleBatch]:
        at = self._clock()
        return [
            SampleBatch(node=n.name, source=Source.NVML, samples=self._samples(n, at))
            for n in self._nodes
        ]

    def _samples(self, node: Node, at: float) -> list[GpuSample]:
        out = []
        for g in node.gpus:
            uuid = gpu_uuid(node, g)
            util = _wave(uuid, at)
            instances = []
            if g.mig_enabled:
                geometry = mig.geometry(g.model)
                weighted = 0.0
                for k, inst in enumerate(g.mig_layout, start=1):
                    profile = geometry.profile(inst.profile)
                    activity = _wave(f"{uuid}/gi{k}", at)
                    weighted += activity * profile.compute_slices
                    instances.append(
                        GpuSample(
                            gpu_uuid=uuid,
                            gpu_instance_id=k,
                            mig_uuid=inst.uuid,
                            at=at,
                            utilization_pct=activity,
                            activity_pct=activity,
                            memory_used_mib=round(profile.memory_mib * activity / 125, 1),
                            memory_total_mib=profile.memory_mib,
                        )
                    )
                util = round(weighted / geometry.compute_slices, 1)
            out.append(
                GpuSample(
                    gpu_uuid=uuid,
                    at=at,
                    utilization_pct=util,
                    memory_used_mib=round(g.memory_mib * util / 125, 1),
                    memory_total_mib=g.memory_mib,
                    power_w=round(60 + 3 * util, 1),
                    temperature_c=round(35 + 0.4 * util, 1),
                )
            )
            out.extend(instances)
        return out
